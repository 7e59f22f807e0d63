#!/usr/bin/env bash
# Stops the test Slurm started by scripts/slurm/up.sh DIR, by the pid files under DIR only:
# the four slurmd together, then slurmctld, slurmdbd and MariaDB (accounting mode only), munged.
set -uo pipefail
DIR=${1:?usage: scripts/slurm/down.sh DIR}

# stop TRIES PID_FILE...: TERM to each, wait up to TRIES × 0.1 s for all, then KILL the rest.
stop() {
    local tries=$1 pids=() pid_file pid
    shift
    for pid_file in "$@"; do
        [ -f "$pid_file" ] || continue
        pid=$(cat "$pid_file")
        rm -f "$pid_file"
        kill -0 "$pid" 2>/dev/null || continue
        kill "$pid"
        pids+=("$pid")
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

stop 50 "$DIR"/run/slurmd-n{1,2,3,4}.pid
stop 50 "$DIR/run/slurmctld.pid"
stop 50 "$DIR/run/slurmdbd.pid"
# MariaDB gets longer to shut down cleanly.
stop 300 "$DIR/run/mariadb.pid"
stop 50 "$DIR/run/munged.pid"
echo "down.sh: stopped the test Slurm under $DIR"
