# wait_ready DIR: waits (up to DEADLINE_S seconds, default 60) until the test API server under
# DIR answers /readyz with the admin token, while every process in DIR/pids runs; 1 if not.
# Sourced by scripts/kube/up.sh and scripts/kube/restart-apiserver.sh.
wait_ready() {
    local dir=$1 deadline=$((SECONDS + ${DEADLINE_S:-60})) pid
    until curl -ksf -H "Authorization: Bearer $(cat "$dir/admin-token")" "$(cat "$dir/url")/readyz" >/dev/null 2>&1; do
        while read -r pid; do
            kill -0 "$pid" 2>/dev/null || { echo "kube: a process exited while starting (PID $pid)" >&2; return 1; }
        done <"$dir/pids"
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.3
    done
}
