#!/usr/bin/env bash
# Stops what deploy/examples/ha/start.sh DIR started, by the PID files under DIR/run only: the
# agent, then the gateways (SIGTERM: the leader resigns), then the etcd members. The data stays
# in DIR (etcd-1..3, secrets.key): start.sh DIR brings the same federation back; rm -rf DIR
# starts over.
#
# Usage: deploy/examples/ha/stop.sh [DIR]   (default: $MERIDIAN_HA_DIR or /tmp/meridian-ha)
set -uo pipefail
DIR=${1:-${MERIDIAN_HA_DIR:-/tmp/meridian-ha}}

# stop TRIES NAME...: SIGTERM to each running NAME (run/NAME.pid), wait up to TRIES × 0.1 s for
# all of them, then SIGKILL the rest.
stop() {
    local tries=$1 pids=() name pid_file pid
    shift
    for name in "$@"; do
        pid_file="$DIR/run/$name.pid"
        [ -f "$pid_file" ] || continue
        pid=$(cat "$pid_file")
        rm -f "$pid_file"
        kill -0 "$pid" 2>/dev/null || continue
        kill "$pid"
        pids+=("$pid")
        echo "stop.sh: stopping $name (pid $pid)"
    done
    for _ in $(seq 1 "$tries"); do
        local alive=no
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=yes; done
        [ "$alive" = yes ] || return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -9 "$pid"; done
    return 0
}

stop 50 agent
# The gateways drain within their grace period; the leader resigns its election on the way out.
stop 100 gateway-1 gateway-2 gateway-3
stop 50 etcd-1 etcd-2 etcd-3
echo "stop.sh: stopped the example under $DIR (data kept; rm -rf $DIR to start over)"
