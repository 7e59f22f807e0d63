#!/usr/bin/env bash
# Runs every cargo-fuzz target (fuzz/fuzz_targets/) for RUNS executions each (default
# 1,000,000), one after the other, and prints executions, seconds and outcome per target.
#
#   scripts/fuzz.sh [RUNS]
#
# Needs a nightly toolchain (cargo-fuzz builds with sanitizers, which only nightly has); fails
# at once, saying so, when `rustup` has none. Installs cargo-fuzz when it is missing.
# The bounded run on stable is part of the test suite: tests/tests/fuzz_smoke.rs.
#
# Environment:
#   FUZZ_TARGET_DIR   cargo's target directory for the fuzz build (default fuzz/target)
#   FUZZ_ARGS         extra arguments to libFuzzer (e.g. "-max_len=8192")
#
# New inputs libFuzzer finds go to fuzz/corpus/TARGET (not checked in); the checked-in seeds in
# fuzz/seeds/TARGET are read, never written. A crash leaves its input in fuzz/artifacts/TARGET/
# and this script exits non-zero after naming it.
set -euo pipefail
cd "$(dirname "$0")/.."

runs="${1:-1000000}"
if ! [[ "$runs" =~ ^[0-9]+$ ]]; then
    echo "fuzz.sh: RUNS must be a number of executions, not \`$runs\`" >&2
    exit 64
fi

if ! command -v rustup >/dev/null || ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz.sh: no nightly Rust toolchain here; cargo-fuzz needs one (\`rustup toolchain install nightly\`)." >&2
    echo "fuzz.sh: on stable, the bounded run is: cargo test -p meridian-e2e --test fuzz_smoke" >&2
    exit 69
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    echo "fuzz.sh: installing cargo-fuzz" >&2
    cargo install --locked cargo-fuzz
fi

target_dir="${FUZZ_TARGET_DIR:-fuzz/target}"
read -r -a extra <<<"${FUZZ_ARGS:-}"
targets=$(cargo +nightly fuzz list)

cargo +nightly fuzz build --target-dir "$target_dir"

status=0
printf '%-18s %12s %9s  %s\n' target executions seconds outcome
for target in $targets; do
    mkdir -p "fuzz/corpus/$target"
    log="$(mktemp)"
    start=$(date +%s%N)
    if cargo +nightly fuzz run --target-dir "$target_dir" "$target" "fuzz/corpus/$target" "fuzz/seeds/$target" -- \
        -runs="$runs" "${extra[@]}" >"$log" 2>&1; then
        outcome="no crash"
    else
        outcome="FAILED: $(grep -m1 -E 'panicked|ERROR|Test unit written' "$log" || tail -n1 "$log")"
        status=1
    fi
    millis=$((($(date +%s%N) - start) / 1000000))
    # libFuzzer ends with "Done 1000000 runs in 35 second(s)"; a crash run, with its last "#N" line.
    executions=$(grep -oE '^Done [0-9]+ runs' "$log" | grep -oE '[0-9]+' || true)
    [ -n "$executions" ] || executions=$(grep -oE '^#[0-9]+' "$log" | tail -n1 | tr -d '#' || true)
    printf '%-18s %12s %5d.%03d  %s\n' "$target" "${executions:-?}" $((millis / 1000)) $((millis % 1000)) "$outcome"
    if [ "$status" -ne 0 ]; then
        echo "--- last lines of the $target run ($log):" >&2
        tail -n 30 "$log" >&2
    else
        rm -f "$log"
    fi
done
exit "$status"
