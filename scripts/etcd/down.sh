#!/usr/bin/env bash
# Stops the test etcd started by scripts/etcd/up.sh DIR, by the PIDs in DIR/pids only: TERM, then
# KILL whatever still runs after 5 s; waits until every member has exited.
set -uo pipefail
DIR=${1:?usage: scripts/etcd/down.sh DIR}

if [ ! -f "$DIR/pids" ]; then
    echo "down.sh: no $DIR/pids; nothing to stop"
    exit 0
fi
pids=()
while read -r pid; do
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && pids+=("$pid")
done <"$DIR/pids"
for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
for _ in $(seq 1 50); do
    running=no
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=yes; done
    [ "$running" = yes ] || break
    sleep 0.1
done
for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || continue
    kill -9 "$pid" 2>/dev/null
    # Bounded: a killed member that nobody reaps stays visible as a zombie.
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
done
rm -f "$DIR/pids" "$DIR/env"
echo "down.sh: stopped the test etcd under $DIR"
