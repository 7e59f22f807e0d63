#!/usr/bin/env bash
# Starts a real Kubernetes API server (v1.20.2, built once per machine by scripts/kube/build.sh)
# on loopback for the tests, with its own single-member etcd, all of its state under DIR: etcd data
# in DIR/etcd, serving certificate in DIR/certs, logs DIR/etcd.log and DIR/apiserver.log, PIDs in
# DIR/pids. Authentication by static token (DIR/tokens.csv: an admin in system:masters),
# authorization RBAC, service-account tokens signed by DIR/sa.key. Writes DIR/env:
#   MERIDIAN_KUBE_URL   https://127.0.0.1:PORT
#   MERIDIAN_KUBE_TOKEN the admin's bearer token
#   MERIDIAN_KUBE_CA    the server's self-signed certificate (trust it to verify the server)
#   MERIDIAN_KUBE_DIR   DIR
# Stop with scripts/kube/down.sh DIR.
#
# Ports: the first three free ones from MERIDIAN_KUBE_BASE_PORT (default 24790) upward: etcd
# client, etcd peer, the API server. MERIDIAN_KUBE_UP_TIMEOUT (default 60) bounds the wait for
# /readyz, in s. etcd comes from Debian's etcd-server (scripts/etcd/install.sh installs it when
# it is missing).
set -euo pipefail

DIR=${1:?usage: scripts/kube/up.sh DIR}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
BASE_PORT=${MERIDIAN_KUBE_BASE_PORT:-24790}
DEADLINE_S=${MERIDIAN_KUBE_UP_TIMEOUT:-60}
scripts_dir=$(cd "$(dirname "$0")" && pwd)

die() {
    echo "kube/up.sh: $*" >&2
    for log in "$DIR/etcd.log" "$DIR/apiserver.log"; do
        [ -f "$log" ] || continue
        echo "---- tail of $log" >&2
        tail -n 20 "$log" >&2
    done
    exit 1
}

# shellcheck source=../lib/services.sh
. "$scripts_dir/../lib/services.sh"
# shellcheck source=ready.sh
. "$scripts_dir/ready.sh"
if [ -f "$DIR/pids" ] && [ -f "$DIR/env" ]; then
    all_alive=yes
    while read -r pid; do alive "$pid" || all_alive=no; done <"$DIR/pids"
    if [ "$all_alive" = yes ]; then
        echo "kube/up.sh: the test API server under $DIR is running already"
        exit 0
    fi
    "$scripts_dir/down.sh" "$DIR" >/dev/null
fi

apiserver=$("$scripts_dir/build.sh") || die "could not build kube-apiserver (scripts/kube/build.sh)"
"$scripts_dir/../etcd/install.sh" || die "etcd is missing and could not be installed"
command -v openssl >/dev/null 2>&1 || die "openssl is missing (apt-get install openssl)"
command -v curl >/dev/null 2>&1 || die "curl is missing (apt-get install curl)"

free_ports 3 "$BASE_PORT" || die "no three free ports in $BASE_PORT..$((BASE_PORT + 999))"
etcd_client=${ports[0]} etcd_peer=${ports[1]} api_port=${ports[2]}

rm -rf "$DIR/etcd" "$DIR/certs"
: >"$DIR/pids"
setsid etcd --name kube --data-dir "$DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_client" --advertise-client-urls "http://127.0.0.1:$etcd_client" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
    --initial-cluster "kube=http://127.0.0.1:$etcd_peer" </dev/null >"$DIR/etcd.log" 2>&1 &
echo $! >>"$DIR/pids"

if [ ! -f "$DIR/sa.key" ]; then
    openssl genrsa -out "$DIR/sa.key" 2048 2>/dev/null
    openssl rsa -in "$DIR/sa.key" -pubout -out "$DIR/sa.pub" 2>/dev/null
fi
token=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
echo "$token,admin,admin,system:masters" >"$DIR/tokens.csv"
chmod 600 "$DIR/tokens.csv" "$DIR/sa.key"

# The API server's command line, kept so scripts/kube/restart-apiserver.sh can start it again
# over the same etcd, certificate and tokens.
cat >"$DIR/apiserver.sh" <<RUN
#!/bin/sh
exec "$apiserver" --etcd-servers="http://127.0.0.1:$etcd_client" --bind-address=127.0.0.1 --secure-port="$api_port" \\
    --cert-dir="$DIR/certs" --token-auth-file="$DIR/tokens.csv" --authorization-mode=RBAC \\
    --service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$DIR/sa.pub" \\
    --service-account-signing-key-file="$DIR/sa.key" --service-cluster-ip-range=10.96.0.0/16
RUN
chmod 755 "$DIR/apiserver.sh"
echo "https://127.0.0.1:$api_port" >"$DIR/url"
echo "$token" >"$DIR/admin-token"
chmod 600 "$DIR/admin-token"
setsid "$DIR/apiserver.sh" </dev/null >"$DIR/apiserver.log" 2>&1 &
echo $! >>"$DIR/pids"

wait_ready "$DIR" || die "the API server was not ready within ${DEADLINE_S}s"
cat >"$DIR/env" <<ENV
export MERIDIAN_KUBE_URL=https://127.0.0.1:$api_port
export MERIDIAN_KUBE_TOKEN=$token
export MERIDIAN_KUBE_CA=$DIR/certs/apiserver.crt
export MERIDIAN_KUBE_DIR=$DIR
ENV
echo "kube/up.sh: $("$apiserver" --version) is up at https://127.0.0.1:$api_port; source $DIR/env"
