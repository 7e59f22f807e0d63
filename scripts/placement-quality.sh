#!/usr/bin/env bash
# Regenerates the comparison tables and charts of docs/placement-quality.md:
#   scripts/placement-quality.sh            (needs ../shared/traces/philly.csv for the trace runs)
# Writes docs/placement-quality/<experiment>.txt (the `--compare` table) and .svg (the chart).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet --bin meridian
bin=${CARGO_TARGET_DIR:-target}/release/meridian
out=docs/placement-quality
mkdir -p "$out"
trace=../shared/traces/philly.csv

run() { # name, then `meridian sim` arguments
  local name=$1
  shift
  echo "== $name: meridian sim $* --compare" >&2
  "$bin" sim "$@" --compare --plot "$out/$name.svg" >"$out/$name.txt"
}

if [[ -f $trace ]]; then
  run philly-trace-hybrid --topology deploy/sim/hybrid-3region.yaml --trace "$trace"
  run philly-trace-fleet12 --topology deploy/sim/fleet-12.yaml --trace "$trace"
else
  echo "skipping the Philly trace runs: $trace is not present" >&2
fi
for profile in philly llm mixed; do
  for load in 0.8 1.0 1.2; do
    run "$profile-load$load-hybrid" --topology deploy/sim/hybrid-3region.yaml --profile "$profile" --load "$load" --seed 1
  done
done
