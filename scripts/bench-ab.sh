#!/usr/bin/env bash
# Two or more builds of `moge` timed in turns, round by round, on one checkpoint: the way the
# figures in PERFORMANCE.md compare a change with its base on a shared, noisy machine (each
# round runs every build once, so a busy minute hits them alike).
#
#   scripts/bench-ab.sh WEIGHTS PRECISION ROUNDS BIN [BIN...]
#
# Prints per build and round the model call's median and each stage's (`moge bench --runs 5
# --warmup 1` on a synthetic 600x400 JPEG at 1800 tokens). Keep copies of the builds, e.g.
# `cp target/release/moge /tmp/moge-base`, before switching commits.
set -euo pipefail
if [ $# -lt 4 ]; then
    sed -n '2,10p' "$0" >&2
    exit 2
fi
weights=$1 precision=$2 rounds=$3
shift 3
for round in $(seq "$rounds"); do
    for bin in "$@"; do
        out=$("$bin" bench --weights "$weights" --size 600x400 --num-tokens 1800 --runs 5 --warmup 1 --precision "$precision" 2>&1)
        call=$(awk '/^model call/ {print $7}' <<<"$out")
        stages=$(awk '/^(encoder|neck|points_head|normal_head|mask_head) / {printf "%s=%s ", $1, $2}' <<<"$out")
        echo "round $round $(basename "$bin") $precision call=$call $stages"
    done
done
