#!/usr/bin/env bash
# Scores high-priority jobs' waits with member preemption (issue 21's goal) over a grid of cells
# and seeds.
#
#   scripts/placement-preemption.sh OUT_DIR [SEEDS] [FLEETS]
#
# For each fleet (hybrid-3region, fleet-12), profile (llm, philly) at load 1.0 and each seed
# 1..SEEDS (default 5), runs `meridian sim --compare --preemption 0.1,0.5` (10 % high-priority
# jobs, half of the rest preemptible; members preempt after a 30 s grace) at estimate error 0.5
# over backfilling members, keeps each run's text under OUT_DIR, and prints per cell the
# seed-averaged mean and p99 queueing delay of the high-priority jobs: Meridian's and the best
# baseline's (goal: no worse on both), with the preemptions each made.
# Runs the release binary; build it first (`cargo build --release --bin meridian`).
# MERIDIAN_PLACEMENT=FILE replays Meridian with those placement weights (e.g. `quoteCandidates: 0`:
# no start quotes, so no offer counts on a preemption); use a fresh OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/placement-preemption.sh OUT_DIR [SEEDS] [FLEETS]}
seeds=${2:-5}
fleets=${3:-"hybrid-3region fleet-12"}
bin=${MERIDIAN_BIN:-${CARGO_TARGET_DIR:-target}/release/meridian}
# MERIDIAN_SIM_JOBS=N: N jobs per workload instead of the profile's own count (a quick check).
jobs=${MERIDIAN_SIM_JOBS:+--jobs $MERIDIAN_SIM_JOBS}
mkdir -p "$out"
printf '%-26s %24s %24s %s\n' CELL "HIGH MEAN h (mer/best)" "HIGH P99 h (mer/best)" "GOALS (preemptions mer/best-mean policy)"
for fleet in $fleets; do
  for profile in llm philly; do
    for seed in $(seq 1 "$seeds"); do
      file="$out/$fleet-$profile-load1.0-preemption-seed$seed.txt"
      [ -s "$file" ] && continue
      "$bin" sim --topology "deploy/sim/$fleet.yaml" --profile "$profile" --load 1.0 $jobs --seed "$seed" \
        --estimate-error 0.5 --preemption 0.1,0.5 ${MERIDIAN_PLACEMENT:+--placement "$MERIDIAN_PLACEMENT"} \
        --compare >"$file.tmp" 2>/dev/null
      mv "$file.tmp" "$file"
    done
    # The preemption table's rows: POLICY HIGH_JOBS MEAN_H P99_H PREEMPTIONS LOST.
    awk -v cell="$fleet $profile 1.0" '
      /^Priority and preemption/ { table = 1; next }
      table && $1 == "POLICY" { next }
      table && NF == 6 { mean[$1] += $3; p99[$1] += $4; pre[$1] += $5; n[$1]++ }
      table && NF == 0 { table = 0 }
      END {
        bm = -1; bp = -1
        for (p in n) if (p != "meridian") {
          m = mean[p] / n[p]; q = p99[p] / n[p]
          if (bm < 0 || m < bm) { bm = m; bmp = p }
          if (bp < 0 || q < bp) bp = q
        }
        mm = mean["meridian"] / n["meridian"]; mq = p99["meridian"] / n["meridian"]
        goals = (mm <= bm ? "mean" : "-") "," (mq <= bp ? "p99" : "-")
        printf "%-26s %24s %24s %s (%d/%d %s)\n", cell, sprintf("%.2f/%.2f", mm, bm), sprintf("%.2f/%.2f", mq, bp), goals,
          pre["meridian"] / n["meridian"], pre[bmp] / n[bmp], bmp
      }' "$out/$fleet-$profile-load1.0-preemption-seed"*.txt
  done
done
