#!/usr/bin/env bash
# Starts the highly available example on this one machine (README.md): a three-member etcd on
# loopback, three gateways on it (gateway-1.yaml ... gateway-3.yaml) and one agent (agent.yaml),
# every process's state, log and PID file under DIR. Starts only what is not running, so after
# killing a process, run it again to bring that one back. Stop everything with stop.sh DIR.
#
# Usage: deploy/examples/ha/start.sh [DIR]   (default: $MERIDIAN_HA_DIR or /tmp/meridian-ha)
# Needs etcd (Debian: apt-get install etcd-server; or ETCD=/path/to/etcd) and, to build the
# gateway with the etcd store, protoc (Debian: apt-get install protobuf-compiler libprotobuf-dev).
# MERIDIAN_HA_NO_BUILD=1 skips the cargo builds (the binaries must exist).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../.." && pwd)
DIR=${1:-${MERIDIAN_HA_DIR:-/tmp/meridian-ha}}
mkdir -p "$DIR"/{log,run}
DIR=$(cd "$DIR" && pwd)
ETCD=${ETCD:-etcd}
DEADLINE_S=${MERIDIAN_HA_UP_TIMEOUT:-60}

die() {
    echo "start.sh: $*" >&2
    exit 1
}

# Client and peer ports of the three etcd members, and the gateways' REST ports (gRPC is +1).
etcd_client=(12379 22379 32379)
etcd_peer=(12380 22380 32380)
rest=(7170 7270 7370)
cluster="etcd-1=http://127.0.0.1:${etcd_peer[0]},etcd-2=http://127.0.0.1:${etcd_peer[1]},etcd-3=http://127.0.0.1:${etcd_peer[2]}"

command -v "$ETCD" >/dev/null || die "no etcd binary: install it (Debian: apt-get install etcd-server) or set ETCD=/path/to/etcd"
command -v curl >/dev/null || die "curl is needed to check that the processes answer"

# 1. The binaries: the gateway with the etcd store (cargo feature `etcd`), and the agent.
target=${CARGO_TARGET_DIR:-$repo/target}
if [ "${MERIDIAN_HA_NO_BUILD:-0}" != 1 ]; then
    (cd "$repo" && cargo build -p meridian --features etcd && cargo build -p meridian-agent) \
        || die "the build failed (the etcd store needs protoc: apt-get install protobuf-compiler libprotobuf-dev)"
fi
meridian=$target/debug/meridian
agent=$target/debug/meridian-agent
[ -x "$meridian" ] && [ -x "$agent" ] || die "no $meridian or $agent; build them (or unset MERIDIAN_HA_NO_BUILD)"

# 2. The secrets key all three gateways share (docs/security.md#secrets-at-rest), made once.
if [ ! -f "$DIR/secrets.key" ]; then
    (umask 077 && printf 'k1:%s\n' "$(head -c 32 /dev/urandom | base64)" >"$DIR/secrets.key")
    echo "start.sh: made the secrets key $DIR/secrets.key (mode 600)"
fi
chmod 600 "$DIR/secrets.key"

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# start NAME DIRECTORY COMMAND...: runs COMMAND in DIRECTORY in its own session (Ctrl-C in this
# terminal does not reach it), output in log/NAME.log, PID in run/NAME.pid, and adds NAME to
# `started`; skips a running one.
started=()
start() {
    local name=$1 dir=$2
    shift 2
    if alive "$DIR/run/$name.pid"; then
        echo "start.sh: $name is running (pid $(cat "$DIR/run/$name.pid"))"
        return
    fi
    (cd "$dir" && exec setsid "$@" </dev/null >>"$DIR/log/$name.log" 2>&1) &
    echo $! >"$DIR/run/$name.pid"
    started+=("$name")
    echo "start.sh: started $name (pid $!, log $DIR/log/$name.log)"
}

# Whether NAME was started by this run.
just_started() {
    local name
    for name in "${started[@]}"; do [ "$name" = "$1" ] && return 0; done
    return 1
}

# wait_for NAME URL: until URL answers 200 (a gateway's /readyz once it leads or its standby view
# is loaded; an etcd member's /health once the cluster has a leader); fails with the end of
# NAME's log when NAME exits or the deadline passes.
wait_for() {
    local name=$1 url=$2 start
    start=$(date +%s)
    until curl -fs -o /dev/null "$url"; do
        if ! alive "$DIR/run/$name.pid"; then
            tail -n 5 "$DIR/log/$name.log" >&2
            die "$name exited (log: $DIR/log/$name.log)"
        fi
        if [ $(( $(date +%s) - start )) -ge "$DEADLINE_S" ]; then
            tail -n 5 "$DIR/log/$name.log" >&2
            die "$name did not answer $url within ${DEADLINE_S}s (log: $DIR/log/$name.log)"
        fi
        sleep 0.2
    done
}

# 3. etcd: three members on loopback. --max-txn-ops and --max-request-bytes must be at least the
# gateways' store.etcd.maxTxnOps and maxRequestBytes (1024 writes, 8 MiB): a leader commits a batch
# of changes as one transaction of up to that many writes and bytes, and etcd refuses a larger one
# (its defaults are 128 and 1.5 MiB). Auto-compaction keeps an hour of history.
for i in 1 2 3; do
    mkdir -p "$DIR/etcd-$i"
    start "etcd-$i" "$DIR" "$ETCD" --name "etcd-$i" --data-dir "$DIR/etcd-$i" \
        --listen-client-urls "http://127.0.0.1:${etcd_client[i-1]}" \
        --advertise-client-urls "http://127.0.0.1:${etcd_client[i-1]}" \
        --listen-peer-urls "http://127.0.0.1:${etcd_peer[i-1]}" \
        --initial-advertise-peer-urls "http://127.0.0.1:${etcd_peer[i-1]}" \
        --initial-cluster "$cluster" --initial-cluster-token meridian-ha --initial-cluster-state new \
        --max-txn-ops 1024 --max-request-bytes 8388608 \
        --auto-compaction-mode periodic --auto-compaction-retention 1h \
        --logger zap --log-outputs stderr
done
for i in 1 2 3; do
    wait_for "etcd-$i" "http://127.0.0.1:${etcd_client[i-1]}/health"
done
echo "start.sh: etcd is up (127.0.0.1:${etcd_client[0]}, :${etcd_client[1]}, :${etcd_client[2]})"

# 4. The three gateways, in DIR (their configs name the key file relative to it).
for i in 1 2 3; do
    start "gateway-$i" "$DIR" "$meridian" gateway --config "$here/gateway-$i.yaml"
done
# Each new one answers /readyz once it leads or its standby view is loaded.
for i in 1 2 3; do
    if just_started "gateway-$i"; then
        wait_for "gateway-$i" "http://127.0.0.1:${rest[i-1]}/readyz"
    fi
done

# 5. One agent, dialling all three gateways.
start agent "$DIR" "$agent" --config "$here/agent.yaml"

echo
for i in 1 2 3; do
    echo "gateway-$i http://127.0.0.1:${rest[i-1]}  $(curl -s "http://127.0.0.1:${rest[i-1]}/readyz")"
done
echo
echo "export MERIDIAN_GATEWAY=http://127.0.0.1:${rest[0]},http://127.0.0.1:${rest[1]},http://127.0.0.1:${rest[2]}"
echo "stop everything: $here/stop.sh $DIR"
