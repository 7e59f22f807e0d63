#!/usr/bin/env bash
# Stops the test etcd started by scripts/etcd/up.sh DIR, by the PIDs in DIR/pids only: TERM, then
# KILL whatever still runs after 5 s; waits until every member has exited.
set -uo pipefail
DIR=${1:?usage: scripts/etcd/down.sh DIR}

if [ ! -f "$DIR/pids" ]; then
    echo "down.sh: no $DIR/pids; nothing to stop"
    exit 0
fi
# shellcheck source=../lib/services.sh
. "$(cd "$(dirname "$0")" && pwd)/../lib/services.sh"
stop_pids "$DIR/pids"
rm -f "$DIR/pids" "$DIR/env"
echo "down.sh: stopped the test etcd under $DIR"
