#!/usr/bin/env bash
# Regenerates the "fairer lab" runs of docs/placement-quality.md (issue 9): estimate error
# σ = 0 / 0.5 / 1.0 over backfilling members, and σ = 0.5 over strict and best-effort members,
# for the three synthetic profiles at loads 0.8 / 1.0 / 1.2 over the hybrid fleet, seed 1.
# Writes docs/placement-quality/fair/<profile>-load<L>-sigma<S>-<memberPolicy>.txt. About 4 minutes
# on 2 cores after the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --quiet --bin meridian
bin=${CARGO_TARGET_DIR:-target}/release/meridian
out=docs/placement-quality/fair
mkdir -p "$out"
sim() { "$bin" sim --topology deploy/sim/hybrid-3region.yaml --seed 1 --compare "$@"; }
for sigma in 0 0.5 1.0; do
  for profile in philly llm mixed; do
    for load in 0.8 1.0 1.2; do
      sim --profile "$profile" --load "$load" --estimate-error "$sigma" >"$out/$profile-load$load-sigma$sigma-backfill.txt"
    done
  done
done
for policy in strict bestEffort; do
  for profile in philly llm mixed; do
    sim --profile "$profile" --load 1.0 --estimate-error 0.5 --member-policy "$policy" \
      >"$out/$profile-load1.0-sigma0.5-$policy.txt"
  done
done
