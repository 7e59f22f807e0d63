#!/usr/bin/env bash
# Stops the test Slurm started by scripts/slurm/up.sh DIR, by the pid files under DIR only.
set -uo pipefail
DIR=${1:?usage: scripts/slurm/down.sh DIR}
for pid_file in "$DIR"/run/slurmd-n{1,2,3,4}.pid "$DIR/run/slurmctld.pid" "$DIR/run/munged.pid"; do
    [ -f "$pid_file" ] || continue
    pid=$(cat "$pid_file")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$pid_file"
done
echo "down.sh: stopped the test Slurm under $DIR"
