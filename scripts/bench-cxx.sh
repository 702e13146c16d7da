#!/usr/bin/env bash
# The C++ library's infer_rgb beside the Rust library's Model::infer on the same pixels, the two
# programs alternated round by round (the machine is shared: read the ratio):
#
#   scripts/bench-cxx.sh CHECKPOINT [WIDTH HEIGHT RUNS ROUNDS]   (default 1280 720 5 3)
#
# Builds both with the cargo profile MOGE_PROFILE (default release; ci: the test suite's, without
# link-time optimisation), then the C++ program with CMake and g++.
set -euo pipefail
cd "$(dirname "$0")/.."
ckpt=$1 w=${2:-1280} h=${3:-720} runs=${4:-5} rounds=${5:-3}
profile=${MOGE_PROFILE:-release}
cargo build --profile "$profile" --locked --example infer_bench
cmake -S ffi/cxx -B "target/cxx-bench-$profile" -DMOGE_CARGO_PROFILE="$profile" >/dev/null
cmake --build "target/cxx-bench-$profile" --target moge_bench -j "$(nproc)" >/dev/null
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-) ($(grep -m1 'cpu family' /proc/cpuinfo | tr -s ' \t' ' ')), $(nproc) cores"
echo "${w}x${h}, 1800 tokens, f32, CPU, profile $profile; median ms of $runs calls per round"
for r in $(seq "$rounds"); do
    rust=$(target/"$profile"/examples/infer_bench "$ckpt" "$w" "$h" "$runs")
    cxx=$(target/"cxx-bench-$profile"/moge_bench "$ckpt" "$w" "$h" "$runs")
    echo "round $r: Model::infer $rust ms, infer_rgb $cxx ms, ratio $(awk -v a="$cxx" -v b="$rust" 'BEGIN { printf "%.3f", a / b }')"
done
