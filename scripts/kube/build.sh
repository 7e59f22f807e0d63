#!/usr/bin/env bash
# Builds a real kube-apiserver (Kubernetes v1.20.2, from Debian bookworm's `kubernetes` source
# package, with Debian's Go 1.19), once per machine: the binary is cached under
# ${MERIDIAN_CACHE:-$HOME/.cache/meridian}/kube-apiserver-v1.20.2/, keyed by the version, and this
# script prints its path. A second run finds the cached binary and prints its path at once.
#
# About 5 minutes on 2 cores (peak RSS about 1.3 GiB) and 34 MB of source. Needs apt (as root or
# with sudo) for golang-1.19-go, rsync and Debian's packaged reflect2/json-iterator: the vendored
# reflect2 1.0.1 crashes under Go >= 1.18, so Debian's copies replace it. The deb-src list is a
# private copy of the machine's own Debian sources; nothing under /etc changes.
# See ../shared/notes/kubernetes-apiserver.md (beside the repository) for the facts behind it.
set -euo pipefail

version=v1.20.2
cache="${MERIDIAN_CACHE:-$HOME/.cache/meridian}/kube-apiserver-$version"
binary="$cache/kube-apiserver"
if [ -x "$binary" ] && "$binary" --version 2>/dev/null | grep -q "$version"; then
    echo "$binary"
    exit 0
fi

log() { echo "kube/build.sh: $*" >&2; }
apt_get=(apt-get)
if [ "$(id -u)" != "0" ] && command -v sudo >/dev/null 2>&1; then apt_get=(sudo apt-get); fi

work="$(mktemp -d /tmp/meridian-kube-build.XXXXXX)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/apt/parts" "$work/apt/lists/partial"
sources=/etc/apt/sources.list.d/debian.sources
if [ ! -f "$sources" ]; then
    log "no $sources: this script knows how to fetch the source only on Debian 12 (bookworm)"
    exit 1
fi
sed 's/^Types: deb$/Types: deb-src/' "$sources" > "$work/apt/parts/src.sources"
private=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work/apt/parts" -o "Dir::State::Lists=$work/apt/lists")

log "fetching the kubernetes source package (Debian's v1.20.2)"
apt-get "${private[@]}" update -q >&2
(cd "$work" && apt-get "${private[@]}" source --download-only kubernetes >&2)

log "installing Go 1.19 and the packaged reflect2/json-iterator when missing"
packages=(golang-1.19-go rsync golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev)
if ! DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends "${packages[@]}" >&2; then
    "${apt_get[@]}" update >&2
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y --no-install-recommends "${packages[@]}" >&2
fi

mkdir "$work/src"
tar xzf "$work"/kubernetes_*.orig.tar.gz -C "$work/src" --strip-components=1
cd "$work/src"
for module in github.com/modern-go/reflect2 github.com/json-iterator/go; do
    rm -rf "vendor/$module"
    mkdir -p "vendor/$module"
    cp -r "/usr/share/gocode/src/$module/." "vendor/$module/"
done
cat > "$work/version" <<VERSION
KUBE_GIT_COMMIT='faecb196815e248d3ecfb03c680a4507229c2a56'
KUBE_GIT_TREE_STATE='clean'
KUBE_GIT_VERSION='$version'
KUBE_GIT_MAJOR='1'
KUBE_GIT_MINOR='20'
VERSION
log "building cmd/kube-apiserver (about 5 minutes on 2 cores)"
PATH=/usr/lib/go-1.19/bin:$PATH GOCACHE="$work/gocache" KUBE_GIT_VERSION_FILE="$work/version" \
    make WHAT=cmd/kube-apiserver >&2
mkdir -p "$cache"
install -m 0755 _output/bin/kube-apiserver "$binary.tmp"
mv "$binary.tmp" "$binary"
log "built $("$binary" --version)"
echo "$binary"
