#!/usr/bin/env bash
# Starts a test Slurm cluster on this one host, all of its state under DIR:
# munged, slurmctld and four slurmd (n1..n4, 8 CPUs, 16000 MB, 4 fake a100 GPUs each).
# Installs the Debian packages first when they are missing (needs root and apt).
# Writes DIR/env (source it, or point MERIDIAN_SLURM_ENV at it). Stop with scripts/slurm/down.sh DIR.
set -euo pipefail

DIR=${1:?usage: scripts/slurm/up.sh DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
DEADLINE_S=${MERIDIAN_SLURM_UP_TIMEOUT:-60}

die() {
    echo "up.sh: $*" >&2
    for log in "$DIR"/log/*.log; do
        [ -f "$log" ] || continue
        echo "---- tail of $log" >&2
        tail -n 20 "$log" >&2
    done
    exit 1
}

# 1. Packages (keep their services from starting on install: policy-rc.d says no).
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null; then
    [ "$(id -u)" = 0 ] || die "Slurm is not installed and I am not root: install slurmctld slurmd slurm-client munge"
    created_policy=no
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=yes
    fi
    install_ok=yes
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        slurmctld slurmd slurm-client munge >/dev/null; } || install_ok=no
    [ "$created_policy" = yes ] && rm -f /usr/sbin/policy-rc.d
    [ "$install_ok" = yes ] || die "apt-get install slurmctld slurmd slurm-client munge failed"
fi

# 2. Already running? (warm start: nothing to do but check).
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
all_alive=yes
for pid in "$DIR/run/munged.pid" "$DIR/run/slurmctld.pid" "$DIR"/run/slurmd-n{1,2,3,4}.pid; do
    alive "$pid" || all_alive=no
done

mkdir -p "$DIR"/{munge,log,run,state,gres} "$DIR"/spool/{n1,n2,n3,n4}
chmod 0755 "$DIR/munge"
export SLURM_CONF="$DIR/slurm.conf"

if [ "$all_alive" = no ]; then
    "$(dirname "$0")/down.sh" "$DIR" >/dev/null 2>&1 || true
    # 3. munge key and daemon.
    if [ ! -f "$DIR/munge/munge.key" ]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0400 "$DIR/munge/munge.key"
    for i in 0 1 2 3; do ln -sfn /dev/null "$DIR/gres/nvidia$i"; done

    cat >"$DIR/slurm.conf" <<CONF
ClusterName=meridian-test
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
DefMemPerCPU=1000
MaxJobCount=20000
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
GresTypes=gpu
InactiveLimit=0
KillWait=5
Waittime=0
NodeName=n[1-2] NodeHostname=localhost NodeAddr=127.0.0.1 Port=16901-16902 CPUs=8 RealMemory=16000 Gres=gpu:a100:4 Feature=ib State=UNKNOWN
NodeName=n[3-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=16903-16904 CPUs=8 RealMemory=16000 Gres=gpu:a100:4 Feature=eth State=UNKNOWN
PartitionName=gpu Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
CONF
    cat >"$DIR/gres.conf" <<CONF
NodeName=n[1-4] Name=gpu Type=a100 File=$DIR/gres/nvidia[0-3]
CONF

    munged --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
        --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
        --force || die "munged did not start"
    slurmctld -f "$DIR/slurm.conf" -c || die "slurmctld did not start"
    for n in n1 n2 n3 n4; do
        slurmd -f "$DIR/slurm.conf" -N "$n" || die "slurmd -N $n did not start"
    done
fi

# 4. Wait until the four nodes are idle (or allocated/mixed: a warm cluster may run jobs).
start=$(date +%s)
while :; do
    up=$(sinfo -h -N -o '%N %t' 2>/dev/null | grep -cE ' (idle|mix|alloc)$' || true)
    [ "$up" = 4 ] && break
    if [ $(( $(date +%s) - start )) -ge "$DEADLINE_S" ]; then
        sinfo -N 2>&1 | sed 's/^/sinfo: /' >&2 || true
        die "the four nodes were not up within ${DEADLINE_S}s"
    fi
    sleep 0.3
done

cat >"$DIR/env" <<ENV
export SLURM_CONF=$DIR/slurm.conf
export MERIDIAN_SLURM_DIR=$DIR
export MERIDIAN_SLURM_PARTITION=gpu
export MERIDIAN_SLURM_BIN_DIR=$(dirname "$(command -v sbatch)")
ENV
echo "up.sh: Slurm cluster meridian-test is up (4 nodes idle); source $DIR/env"
