#!/usr/bin/env bash
# Starts a test Slurm cluster on this one host, all of its state under DIR:
# munged, slurmctld and four slurmd (n1..n4, 8 CPUs, 16000 MB, 4 fake a100 GPUs each).
# Installs the Debian packages first when they are missing (needs root and apt).
# Writes DIR/env (source it, or point MERIDIAN_SLURM_ENV at it). Stop with scripts/slurm/down.sh DIR.
#
# Accounting mode (`up.sh DIR --accounting`, or MERIDIAN_SLURM_ACCOUNTING=1): also a private
# MariaDB (datadir DIR/mysql, 127.0.0.1:16806) and slurmdbd (127.0.0.1:16819), fair-share
# priorities (priority/multifactor, half-life 5 min), and two accounts with user root:
# teama (70 shares) and teamb (30 shares). DIR/env then says MERIDIAN_SLURM_ACCOUNTING=1.
set -euo pipefail

DIR=${1:?usage: scripts/slurm/up.sh DIR [--accounting]}
ACCOUNTING=${MERIDIAN_SLURM_ACCOUNTING:-0}
case "${2:-}" in
    "") ;;
    --accounting) ACCOUNTING=1 ;;
    *) echo "usage: scripts/slurm/up.sh DIR [--accounting]" >&2; exit 2 ;;
esac
[ "$ACCOUNTING" = 1 ] || ACCOUNTING=0
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
DEADLINE_S=${MERIDIAN_SLURM_UP_TIMEOUT:-60}
DB_PORT=16806
DBD_PORT=16819

die() {
    echo "up.sh: $*" >&2
    for log in "$DIR"/log/*.log; do
        [ -f "$log" ] || continue
        echo "---- tail of $log" >&2
        tail -n 20 "$log" >&2
    done
    exit 1
}

# 1. Packages (keep their services from starting on install: policy-rc.d says no). Debian 12
# splits Slurm (the `slurm-wlm` suite, 22.05) into these; when a distribution lacks the split
# names, the `slurm-wlm` metapackage is tried instead.
packages="slurmctld slurmd slurm-client munge"
missing=no
for tool in slurmctld slurmd sbatch munged; do command -v "$tool" >/dev/null || missing=yes; done
if [ "$ACCOUNTING" = 1 ]; then
    packages="$packages slurmdbd mariadb-server"
    for tool in slurmdbd mariadbd mariadb-install-db sacctmgr; do command -v "$tool" >/dev/null || missing=yes; done
fi
if [ "$missing" = yes ]; then
    [ "$(id -u)" = 0 ] || die "Slurm is not installed and I am not root: install $packages"
    created_policy=no
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
        chmod 755 /usr/sbin/policy-rc.d
        created_policy=yes
    fi
    install_ok=yes
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        $packages >/dev/null; } || install_ok=no
    if [ "$install_ok" = no ]; then
        extra=${packages#slurmctld slurmd slurm-client munge}
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurm-wlm munge $extra \
            >/dev/null && install_ok=yes
    fi
    [ "$created_policy" = yes ] && rm -f /usr/sbin/policy-rc.d
    [ "$install_ok" = yes ] || die "apt-get install $packages failed"
fi

# 2. Already running? (warm start: nothing to do but check).
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
all_alive=yes
pids=("$DIR/run/munged.pid" "$DIR/run/slurmctld.pid" "$DIR"/run/slurmd-n{1,2,3,4}.pid)
[ "$ACCOUNTING" = 1 ] && pids+=("$DIR/run/mariadb.pid" "$DIR/run/slurmdbd.pid")
for pid in "${pids[@]}"; do
    alive "$pid" || all_alive=no
done
# A running cluster of the other mode is restarted in this one (an env without the line: plain).
if [ -f "$DIR/env" ]; then
    running_mode=$(sed -n 's/^export MERIDIAN_SLURM_ACCOUNTING=//p' "$DIR/env")
    [ "${running_mode:-0}" = "$ACCOUNTING" ] || all_alive=no
fi

mkdir -p "$DIR"/{munge,log,run,state,gres} "$DIR"/spool/{n1,n2,n3,n4}
chmod 0755 "$DIR/munge"
export SLURM_CONF="$DIR/slurm.conf"

# MariaDB and slurmdbd under DIR, and the accounts (idempotent: a restart keeps the database).
start_accounting() {
    mkdir -p "$DIR/mysql"
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root --skip-test-db \
            --auth-root-authentication-method=socket >"$DIR/log/mariadb-install-db.log" 2>&1 \
            || die "mariadb-install-db failed (see $DIR/log/mariadb-install-db.log)"
    fi
    setsid mariadbd --no-defaults --datadir="$DIR/mysql" --user=root --socket="$DIR/run/mariadb.sock" \
        --pid-file="$DIR/run/mariadb.pid" --port=$DB_PORT --bind-address=127.0.0.1 --skip-name-resolve \
        --log-error="$DIR/log/mariadb.log" --innodb-buffer-pool-size=32M --skip-log-bin \
        </dev/null >/dev/null 2>&1 &
    local sql=(mariadb --no-defaults --socket="$DIR/run/mariadb.sock" -u root)
    local start
    start=$(date +%s)
    until "${sql[@]}" -e 'SELECT 1' >/dev/null 2>&1; do
        [ $(( $(date +%s) - start )) -lt "$DEADLINE_S" ] || die "MariaDB did not answer within ${DEADLINE_S}s"
        sleep 0.2
    done
    "${sql[@]}" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'meridian';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "cannot create MariaDB user slurm"
    cat >"$DIR/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/munge.socket
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=meridian
StorageLoc=slurm_acct_db
CONF
    chmod 600 "$DIR/slurmdbd.conf"
    slurmdbd || die "slurmdbd did not start"
    start=$(date +%s)
    until sacctmgr -n -P show cluster >/dev/null 2>&1; do
        [ $(( $(date +%s) - start )) -lt "$DEADLINE_S" ] || die "slurmdbd did not answer within ${DEADLINE_S}s"
        sleep 0.2
    done
    if ! sacctmgr -n -P show assoc format=account,user | grep -qx 'teamb|root'; then
        sacctmgr -i add cluster meridian-test >/dev/null || true
        sacctmgr -i add account teama Cluster=meridian-test Fairshare=70 >/dev/null || die "sacctmgr add account teama failed"
        sacctmgr -i add account teamb Cluster=meridian-test Fairshare=30 >/dev/null || die "sacctmgr add account teamb failed"
        sacctmgr -i add user root Account=teama,teamb Cluster=meridian-test >/dev/null || die "sacctmgr add user root failed"
    fi
}

if [ "$all_alive" = no ]; then
    "$(dirname "$0")/down.sh" "$DIR" >/dev/null 2>&1 || true
    # 3. munge key and daemon.
    if [ ! -f "$DIR/munge/munge.key" ]; then
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 0400 "$DIR/munge/munge.key"
    for i in 0 1 2 3; do ln -sfn /dev/null "$DIR/gres/nvidia$i"; done

    accounting_conf() {
        if [ "$ACCOUNTING" = 0 ]; then
            echo "AccountingStorageType=accounting_storage/none"
            return
        fi
        # sacctmgr and the controller's link to slurmdbd ignore AuthInfo: the munge socket is
        # passed as AccountingStoragePass.
        cat <<ACCT
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$DIR/munge/munge.socket
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu,gres/gpu:a100
PriorityType=priority/multifactor
PriorityWeightFairshare=10000
PriorityWeightAge=0
PriorityDecayHalfLife=0-00:05:00
PriorityCalcPeriod=1
ACCT
    }
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
$(accounting_conf)
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
    [ "$ACCOUNTING" = 1 ] && start_accounting
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
export MERIDIAN_SLURM_ACCOUNTING=$ACCOUNTING
ENV
mode=""
[ "$ACCOUNTING" = 1 ] && mode=", with slurmdbd and fair share (accounts teama 70, teamb 30)"
echo "up.sh: Slurm cluster meridian-test is up (4 nodes idle$mode); source $DIR/env"
