#!/usr/bin/env bash
# Installs Debian's etcd-server when etcd is missing (as root, or with sudo), without letting its
# system service start on 2379/2380 (a policy-rc.d says no while installing). Used by
# scripts/etcd/up.sh and scripts/kube/up.sh.
set -euo pipefail

die() {
    echo "etcd/install.sh: $*" >&2
    exit 1
}

if ! command -v etcd >/dev/null 2>&1; then
    sudo=()
    if [ "$(id -u)" != 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "etcd is not installed and I am neither root nor have sudo: apt-get install etcd-server"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null 2>&1 || die "etcd is not installed and there is no apt-get: install etcd (3.4 or later)"
    created_policy=no
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee /usr/sbin/policy-rc.d >/dev/null
        "${sudo[@]}" chmod 755 /usr/sbin/policy-rc.d
        created_policy=yes
    fi
    echo "etcd/install.sh: installing Debian's etcd-server"
    install_ok=yes
    if ! DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; then
        { "${sudo[@]}" apt-get update -qq \
            && DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends etcd-server >/dev/null; } \
            || install_ok=no
    fi
    [ "$created_policy" = yes ] && "${sudo[@]}" rm -f /usr/sbin/policy-rc.d
    [ "$install_ok" = yes ] || die "apt-get install etcd-server failed"
    command -v etcd >/dev/null 2>&1 || die "etcd-server is installed but there is no etcd on PATH"
fi

