#!/usr/bin/env bash
# Instruction counts of the aarch64 build under qemu-user, one route against another: what can be
# measured of the Arm kernels without an Arm machine (qemu's timing means nothing; its counts are
# exact). Counts one `moge bench` process (the load and packing included, one image, one thread)
# of a synthetic ViT-S at each MOGE_MAX_CPU_ISA level and precision, with the TCG plugin in
# scripts/qemu-insn (self-contained: it declares the parts of qemu 7.2's plugin API it uses). Fewer
# instructions is not a speed: wall-clock speed on Arm is unmeasured.
#   scripts/count-aarch64-insns.sh [SIZE (196x140)] [TOKENS (200)] [PRECISION:LEVEL,LEVEL... ...]
# (each route ~10 min on one x86 core; by default every precision at each of its Arm routes).
set -euo pipefail
cd "$(dirname "$0")/.."
size=${1:-196x140} tokens=${2:-200}
specs=("${@:3}")
[ ${#specs[@]} -gt 0 ] || specs=(f32:portable,neon int8:portable,dotprod,i8mm bf16:portable,bf16)
work=${MOGE_INSN_WORK:-/tmp/moge-insn}
mkdir -p "$work"
command -v qemu-aarch64 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends qemu-user >/dev/null
gcc -O2 -Wall -Wextra -shared -fPIC -o "$work/libinsncount.so" scripts/qemu-insn/insncount.c
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
cargo build --release --locked --target aarch64-unknown-linux-gnu --bin moge >&2
# The checkpoint and its config beside it (vits.json).
[ -f "$work/vits.safetensors" ] && [ -f "$work/vits.json" ] || cargo run --release --locked --example synth_checkpoint -- vits-normal "$work/vits.safetensors" >&2
count() { # PRECISION LEVEL RUNS
    rm -f "$work/count"
    if ! env -i RAYON_NUM_THREADS=1 MOGE_MAX_CPU_ISA="$2" qemu-aarch64 -L /usr/aarch64-linux-gnu \
        -plugin "$work/libinsncount.so,mode=atomic,out=$work/count" target/aarch64-unknown-linux-gnu/release/moge \
        bench --weights "$work/vits.safetensors" --size "$size" --num-tokens "$tokens" --runs "$3" --warmup 0 --precision "$1" >/dev/null; then
        echo "count-aarch64-insns.sh: moge bench failed ($1 at $2, $3 runs)" >&2
        return 1
    fi
    awk '{print $2}' "$work/count"
}
# The whole process with one image (the load and the weights' packing included), and what a
# second image adds (one model call and its post-processing: the difference of two processes).
echo "| precision | route (MOGE_MAX_CPU_ISA) | process, 1 image | / portable | per image | / portable |"
echo "|---|---|---|---|---|---|"
for spec in "${specs[@]}"; do
    precision=${spec%%:*} base= base1=
    IFS=, read -ra levels <<<"${spec#*:}"
    for level in "${levels[@]}"; do
        n=$(count "$precision" "$level" 1)
        n2=$(count "$precision" "$level" 2)
        n1=$((n2 - n))
        base=${base:-$n} base1=${base1:-$n1}
        ratio() { awk -v n="$1" -v b="$2" 'BEGIN {printf "%.3f", n / b}'; }
        echo "| $precision | $level | $n | $(ratio "$n" "$base") | $n1 | $(ratio "$n1" "$base1") |"
    done
done
