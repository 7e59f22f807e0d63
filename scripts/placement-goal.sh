#!/usr/bin/env bash
# Scores Meridian against the placement goal (issue 21) over a grid of placement-lab cells and
# seeds.
#
#   scripts/placement-goal.sh OUT_DIR [SEEDS] [SIGMA] [MEMBER_POLICY] [FLEETS]
#
# For each fleet (hybrid-3region, fleet-12), synthetic profile (philly, llm, mixed) and load
# (0.8, 1.0, 1.2), and each seed 1..SEEDS (default 5), runs `meridian sim --compare -o json` at
# estimate error SIGMA (default 0.5) over MEMBER_POLICY members (default backfill), keeping each
# run's JSON under OUT_DIR, then prints one line per cell with the seed-averaged figures:
#   - mean queueing delay: Meridian's and the best baseline's (goal: lowest of all);
#   - p99 queueing delay: Meridian's and the best baseline's (goal: no worse in 16 of 18 cells);
#   - total cost: Meridian's, least-loaded's and first-admit's (goal: ≤ both);
#   - data moved: Meridian's and the least of every baseline but home-only and locality-first,
#     which keep jobs at home or at their data (goal: no more);
#   - Jain's fairness index over tenants: Meridian's, first-admit's and least-loaded's (goal: no
#     lower than either, less 0.02).
# Needs `jq`. Runs the release binary; build it first (`cargo build --release --bin meridian`).
# MERIDIAN_PLACEMENT=FILE replays Meridian with those placement weights (the gateway config's
# `placement` section, e.g. `quoteCandidates: 0` for no start quotes); use a fresh OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/placement-goal.sh OUT_DIR [SEEDS] [SIGMA] [MEMBER_POLICY] [FLEETS]}
seeds=${2:-5}
sigma=${3:-0.5}
members=${4:-backfill}
fleets=${5:-"hybrid-3region fleet-12"}
bin=${MERIDIAN_BIN:-${CARGO_TARGET_DIR:-target}/release/meridian}
# MERIDIAN_SIM_JOBS=N: N jobs per workload instead of the profile's own count (a quick check).
jobs=${MERIDIAN_SIM_JOBS:+--jobs $MERIDIAN_SIM_JOBS}
mkdir -p "$out"
for fleet in $fleets; do
  for profile in philly llm mixed; do
    for load in 0.8 1.0 1.2; do
      for seed in $(seq 1 "$seeds"); do
        file="$out/$fleet-$profile-load$load-sigma$sigma-$members-seed$seed.json"
        [ -s "$file" ] && continue
        "$bin" sim --topology "deploy/sim/$fleet.yaml" --profile "$profile" --load "$load" $jobs --seed "$seed" \
          --estimate-error "$sigma" --member-policy "$members" ${MERIDIAN_PLACEMENT:+--placement "$MERIDIAN_PLACEMENT"} \
          --compare -o json >"$file.tmp" 2>/dev/null
        mv "$file.tmp" "$file"
      done
    done
  done
done
printf '%-34s %21s %21s %30s %26s %20s %s\n' CELL "MEAN h (mer/best)" "P99 h (mer/best)" "COST k$ (mer/ll/fa)" "MOVED TB (mer/least)" "JAIN (mer/fa/ll)" GOALS
for fleet in $fleets; do
  for profile in philly llm mixed; do
    for load in 0.8 1.0 1.2; do
      cell="$fleet $profile $load"
      jq -s -r --arg cell "$cell" '
        def avg(f): (map(f) | add) / length;
        # Per policy, the seed-averaged figures.
        (map(.runs[]) | group_by(.policy) | map({
          policy: .[0].policy,
          mean: (avg(.overall.queueMeanSecs) / 3600),
          p99: (avg(.overall.queueP99Secs) / 3600),
          cost: (avg(.totalUsd) / 1000),
          moved: (avg(.movedGb) / 1000),
          jain: avg(.jainFairness)
        }) | INDEX(.policy)) as $p
        | ($p | to_entries | map(select(.key != "meridian")) | map(.value)) as $base
        | ($base | map(.mean) | min) as $bmean
        | ($base | map(.p99) | min) as $bp99
        | ($base | map(select(.policy != "home-only" and .policy != "locality-first")) | map(.moved) | min) as $bmoved
        | $p.meridian as $m
        | [ (if $m.mean <= $bmean then "mean" else "-" end),
            (if $m.p99 <= $bp99 then "p99" else "-" end),
            (if $m.cost <= $p["least-loaded"].cost and $m.cost <= $p["first-admit"].cost then "cost" else "-" end),
            (if $m.moved <= $bmoved then "data" else "-" end),
            (if $m.jain >= $p["first-admit"].jain - 0.02 and $m.jain >= $p["least-loaded"].jain - 0.02 then "jain" else "-" end)
          ] as $goals
        | "\($cell|.[0:34]) \($m.mean*100|round/100)/\($bmean*100|round/100) \($m.p99*100|round/100)/\($bp99*100|round/100) \($m.cost|round)/\($p["least-loaded"].cost|round)/\($p["first-admit"].cost|round) \($m.moved|round)/\($bmoved|round) \($m.jain*1000|round/1000)/\($p["first-admit"].jain*1000|round/1000)/\($p["least-loaded"].jain*1000|round/1000) \($goals|join(","))"
      ' "$out/$fleet-$profile-load$load-sigma$sigma-$members-seed"*.json
    done
  done
done
