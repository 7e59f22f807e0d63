#!/usr/bin/env bash
# Stops the test API server and its etcd started by scripts/kube/up.sh DIR, by the PIDs in
# DIR/pids only: TERM, then KILL whatever still runs after 5 s.
set -uo pipefail
DIR=${1:?usage: scripts/kube/down.sh DIR}
if [ ! -f "$DIR/pids" ]; then
    echo "kube/down.sh: no $DIR/pids; nothing to stop"
    exit 0
fi
# shellcheck source=../lib/services.sh
. "$(cd "$(dirname "$0")" && pwd)/../lib/services.sh"
stop_pids "$DIR/pids"
rm -f "$DIR/pids" "$DIR/env"
echo "kube/down.sh: stopped the test API server under $DIR"
