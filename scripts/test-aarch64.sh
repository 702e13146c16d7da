#!/usr/bin/env bash
# The aarch64 Linux build (Graviton, Jetson, and the Arm code of Apple Silicon), tested on this
# x86-64 machine: cross-compiled by Debian's aarch64 gcc against rustup's aarch64 std, clippy with
# every warning an error for that target, then the library's tests and a chosen set of the
# integration tests under qemu-user. binfmt is not registered here, so qemu is named as cargo's
# runner and as MOGE_TEST_RUNNER (how the tests start this build's `moge` and themselves).
# qemu runs the kernels (all portable off x86 for now) ~30x slower than a CPU would, so the
# integration tests run are those that cover the parity fixtures in every precision, MoGe-3 and
# the command line end to end at the least cost (each a few seconds under qemu). Speed under qemu
# means nothing and is not measured.
set -euo pipefail
cd "$(dirname "$0")/.."
step() {
    local start=$SECONDS
    "$@"
    echo "test-aarch64.sh: '$*' took $((SECONDS - start)) s" >&2
}
need=()
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
command -v aarch64-linux-gnu-g++ >/dev/null || need+=(g++-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/lib/libc.so.6 ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64-static >/dev/null || need+=(qemu-user-static)
if [ ${#need[@]} -gt 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    step sh -c "apt-get install -y --no-install-recommends ${need[*]} >/dev/null || { apt-get update >/dev/null && apt-get install -y --no-install-recommends ${need[*]} >/dev/null; }"
fi
rustup target list --installed | grep -qx aarch64-unknown-linux-gnu || step rustup target add aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64-static -L /usr/aarch64-linux-gnu"
export MOGE_TEST_RUNNER="$CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER"
target=(--profile ci --locked --target aarch64-unknown-linux-gnu)
step cargo clippy "${target[@]}" --workspace --all-targets -- -D warnings
step cargo test "${target[@]}" -p moge --lib --bins
# The chosen integration tests, by exact name (scripts/aarch64-tests.txt, one per line).
mapfile -t chosen < <(grep -v -e '^#' -e '^$' scripts/aarch64-tests.txt)
step cargo test "${target[@]}" -p moge --test it -- --exact "${chosen[@]}"
# The levels on CPUs that lack them, through qemu's CPU models: cortex-a72 (NEON only),
# neoverse-n1 (dotprod, as Graviton 2 and Jetson Orin) and the default `max` (i8mm and bf16, as
# Graviton 3 and Apple M2). Each is detected from the kernel's hwcaps as `moge info` reports it,
# and the int8 kernels' tests pass on each (an instruction the CPU lacks would be SIGILL).
qemu=(qemu-aarch64-static -L /usr/aarch64-linux-gnu)
for model in cortex-a72=neon neoverse-n1=dotprod max=bf16; do
    cpu=${model%=*} level=${model#*=}
    route=$("${qemu[@]}" -cpu "$cpu" target/aarch64-unknown-linux-gnu/ci/moge info | grep '^cpu route:')
    if [[ $route != "cpu route: $level (detected $level; "* ]]; then
        echo "test-aarch64.sh: -cpu $cpu should be detected as $level: $route" >&2
        exit 1
    fi
    [ "$cpu" = max ] && continue
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="${qemu[*]} -cpu $cpu" step cargo test "${target[@]}" -p moge --lib -- int8:: sparse_conv:: simd::
done
