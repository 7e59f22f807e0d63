#!/usr/bin/env bash
# Restarts the API server started by scripts/kube/up.sh DIR, over the same etcd, certificate and
# tokens, and waits until it is ready again: for tests of what survives an API server restart
# (watches that must resume). Its etcd keeps running.
set -euo pipefail
DIR=${1:?usage: scripts/kube/restart-apiserver.sh DIR}
scripts_dir=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=ready.sh
. "$scripts_dir/ready.sh"
[ -x "$DIR/apiserver.sh" ] || { echo "kube/restart-apiserver.sh: no $DIR/apiserver.sh (started by scripts/kube/up.sh?)" >&2; exit 1; }
old=$(sed -n 2p "$DIR/pids")
if [ -n "$old" ] && kill -0 "$old" 2>/dev/null; then
    kill "$old"
    for _ in $(seq 1 100); do kill -0 "$old" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$old" 2>/dev/null || true
fi
setsid "$DIR/apiserver.sh" </dev/null >>"$DIR/apiserver.log" 2>&1 &
new=$!
sed -i "2s/.*/$new/" "$DIR/pids"
wait_ready "$DIR" || { echo "kube/restart-apiserver.sh: the API server was not ready again" >&2; tail -n 20 "$DIR/apiserver.log" >&2; exit 1; }
echo "kube/restart-apiserver.sh: the API server under $DIR is back (PID $new)"
