# Shell functions shared by the scripts that start and stop the tests' services on loopback
# (scripts/etcd/, scripts/kube/). Source it; it defines functions only.

# Whether process $1 runs.
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Whether nothing listens on 127.0.0.1:$1 (ss), or nothing answers a connect (bash's /dev/tcp).
port_free() {
    if command -v ss >/dev/null 2>&1; then
        [ -z "$(ss -Htan "( sport = :$1 )" 2>/dev/null)" ]
    else
        ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
    fi
}

# Sets the array `ports` to the first $1 free ports from $2 upward, within 1000 ports; 1 if
# there are not that many.
free_ports() {
    local want=$1 port=$2
    ports=()
    while [ "${#ports[@]}" -lt "$want" ]; do
        [ "$port" -lt $(($2 + 1000)) ] || return 1
        port_free "$port" && ports+=("$port")
        port=$((port + 1))
    done
}

# Stops the processes listed in file $1, one PID per line, and only those: TERM, then KILL
# whatever still runs after 5 s; waits (bounded) until each has exited.
stop_pids() {
    local pid pids=() running
    while read -r pid; do
        alive "$pid" && pids+=("$pid")
    done <"$1"
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null; done
    for _ in $(seq 1 50); do
        running=no
        for pid in "${pids[@]}"; do alive "$pid" && running=yes; done
        [ "$running" = yes ] || break
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        alive "$pid" || continue
        kill -9 "$pid" 2>/dev/null
        # Bounded: a killed process that nobody reaps stays visible as a zombie.
        for _ in $(seq 1 50); do alive "$pid" || break; sleep 0.05; done
    done
}
