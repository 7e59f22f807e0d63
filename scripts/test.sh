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

echo "== unit, property and end-to-end tests"
cargo test --workspace --locked "$@"
