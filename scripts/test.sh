#!/usr/bin/env bash
# The test command (README): sets up what the tests need on a fresh machine, then runs them all.
#
# Meridian's own build needs no system protoc (protox compiles proto/ in Rust). The end-to-end
# tests start the real `meridian` and `meridian-agent` binaries on loopback; they build them
# through cargo themselves. Nothing else (etcd, Slurm) is needed by the current test suite.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
    echo "error: cargo is not installed (https://rustup.rs)" >&2
    exit 1
fi

# The Slurm backend's tests run against a real Slurm on this host (scripts/slurm/up.sh; installs
# Debian's slurm packages when missing). MERIDIAN_SKIP_SLURM=1 skips them instead.
if [ "${MERIDIAN_SKIP_SLURM:-}" != 1 ] && [ -z "${MERIDIAN_SLURM_ENV:-}" ]; then
    slurm_dir=${MERIDIAN_SLURM_DIR:-${TMPDIR:-/tmp}/meridian-slurm}
    echo "== starting a test Slurm under $slurm_dir"
    scripts/slurm/up.sh "$slurm_dir"
    export MERIDIAN_SLURM_ENV="$slurm_dir/env"
fi

echo "== unit, property and end-to-end tests"
cargo test --workspace --locked "$@"
