#!/usr/bin/env bash
# Starts a three-member etcd cluster on loopback for the tests, all of its state under DIR:
# data in DIR/m1..m3, logs in DIR/m1.log..m3.log, PIDs in DIR/pids. Installs Debian's etcd-server
# first when etcd is missing (as root, or with sudo; its system service is kept from starting).
# Writes DIR/env (`export MERIDIAN_ETCD_ENDPOINTS=http://127.0.0.1:P1,…`): source it, or point the
# tests at it. Stop with scripts/etcd/down.sh DIR.
#
# Ports: the first six free ones from MERIDIAN_ETCD_BASE_PORT (default 23790) upward, three client
# and three peer ports. MERIDIAN_ETCD_UP_TIMEOUT (default 30) bounds the wait for health, in s.
# Members run with --max-txn-ops 1024 --max-request-bytes 8388608: the gateway's defaults for
# store.etcd.maxTxnOps and maxRequestBytes (etcd's own defaults, 128 and 1.5 MiB, are smaller).
set -euo pipefail

DIR=${1:?usage: scripts/etcd/up.sh DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
BASE_PORT=${MERIDIAN_ETCD_BASE_PORT:-23790}
DEADLINE_S=${MERIDIAN_ETCD_UP_TIMEOUT:-30}

die() {
    echo "up.sh: $*" >&2
    for log in "$DIR"/m*.log; do
        [ -f "$log" ] || continue
        echo "---- tail of $log" >&2
        tail -n 20 "$log" >&2
    done
    exit 1
}

# 1. The package.
"$(cd "$(dirname "$0")" && pwd)/install.sh" || die "could not install etcd"

# 2. Already running from an earlier call with this DIR? Then only check it.
# shellcheck source=../lib/services.sh
. "$(cd "$(dirname "$0")" && pwd)/../lib/services.sh"
if [ -f "$DIR/pids" ] && [ -f "$DIR/env" ]; then
    all_alive=yes
    count=0
    while read -r pid; do
        count=$((count + 1))
        alive "$pid" || all_alive=no
    done <"$DIR/pids"
    if [ "$all_alive" = yes ] && [ "$count" = 3 ]; then
        echo "up.sh: the test etcd under $DIR is running already"
        exit 0
    fi
    scripts_dir=$(cd "$(dirname "$0")" && pwd)
    "$scripts_dir/down.sh" "$DIR" >/dev/null
fi

# 3. Six free ports: nothing listens (ss), or nothing answers a connect (bash's /dev/tcp).
free_ports 6 "$BASE_PORT" || die "no six free ports in $BASE_PORT..$((BASE_PORT + 999))"

# 4. The members.
initial_cluster=""
for i in 1 2 3; do
    peer=${ports[$((i * 2 - 1))]}
    initial_cluster+="${initial_cluster:+,}m$i=http://127.0.0.1:$peer"
done
token="meridian-test-$(basename "$DIR")-$$"
: >"$DIR/pids"
endpoints=""
for i in 1 2 3; do
    client=${ports[$((i * 2 - 2))]}
    peer=${ports[$((i * 2 - 1))]}
    endpoints+="${endpoints:+,}http://127.0.0.1:$client"
    setsid etcd --name "m$i" --data-dir "$DIR/m$i" \
        --listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$initial_cluster" --initial-cluster-state new --initial-cluster-token "$token" \
        --heartbeat-interval 100 --election-timeout 1000 --logger zap --log-level warn \
        --max-txn-ops 1024 --max-request-bytes 8388608 \
        </dev/null >>"$DIR/m$i.log" 2>&1 &
    echo $! >>"$DIR/pids"
done

# 5. Health: GET /health on each client URL answers {"health":"true"}.
healthy() {
    local answer
    if command -v curl >/dev/null 2>&1; then
        answer=$(curl -s --max-time 2 "http://127.0.0.1:$1/health" 2>/dev/null) || return 1
    else
        answer=$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf 'GET /health HTTP/1.0\r\n\r\n' >&3 && cat <&3" 2>/dev/null) || return 1
    fi
    [[ "$answer" == *'"health":"true"'* ]]
}
start=$(date +%s)
for i in 1 2 3; do
    client=${ports[$((i * 2 - 2))]}
    until healthy "$client"; do
        pid=$(sed -n "${i}p" "$DIR/pids")
        alive "$pid" || die "etcd member m$i (PID $pid) exited; see $DIR/m$i.log"
        [ $(($(date +%s) - start)) -lt "$DEADLINE_S" ] || die "etcd member m$i (port $client) was not healthy within ${DEADLINE_S}s"
        sleep 0.1
    done
done

echo "export MERIDIAN_ETCD_ENDPOINTS=$endpoints" >"$DIR/env"
echo "up.sh: etcd $(etcd --version 2>/dev/null | sed -n 's/^etcd Version: //p') at $endpoints (state in $DIR)"
