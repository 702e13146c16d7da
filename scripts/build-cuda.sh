#!/usr/bin/env bash
# Builds moge with the CUDA device on any x86-64 Linux machine, GPU and driver not needed:
#
#   scripts/build-cuda.sh [--jobs N] [--features cuda|cuda,cudnn] [--test]
#
# 1. a venv of its own (.cuda-build/venv) with the CUDA 13.0 toolkit wheels from PyPI (nvcc,
#    the runtime headers and static cudart, CCCL); 13.0 because cudarc 0.19 rejects newer nvcc
#    releases and driver 580 (CUDA 13.0) must run the kernels;
# 2. a copy of the registry's candle-core 0.11.1 with patches/candle-core-0.11.1-dynamic-loading.patch
#    applied (cudarc opens the driver, cuBLAS, cuRAND, NVRTC and cuDNN at run time instead of
#    linking them), used through a [patch.crates-io] given on the cargo command line only, from a
#    shadow of the checkout (.cuda-build/tree: links to its folders, its own Cargo.lock), so the
#    default build and the committed Cargo.lock never see it;
# 3. cudart linked statically, so the binary's NEEDED list has no CUDA library: it starts, and
#    runs on the CPU, on a machine without a driver;
# 4. the binary at target/cuda/release/moge, checked with readelf; with --test, the fixture
#    parity tests run with it (on the CPU where there is no GPU).
#
# Environment: MOGE_CUDA_WORK (default .cuda-build), CUDA_COMPUTE_CAP (default 90: H100/H200 only).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)

jobs=$(nproc)
features=cuda,cudnn
run_tests=0
while [ $# -gt 0 ]; do
    case "$1" in
        --jobs) jobs=$2; shift 2 ;;
        --features) features=$2; shift 2 ;;
        --test) run_tests=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-cuda.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

work=${MOGE_CUDA_WORK:-$root/.cuda-build}
target=$root/target/cuda
mkdir -p "$work"
say() { printf '[build-cuda %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

# 1. The toolkit. Exact pins: the set measured to build candle's kernels.
wheels=(nvidia-cuda-nvcc==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
        nvidia-nvvm==13.0.88 nvidia-cuda-cccl==13.0.85)
if [ "$(cat "$work/venv/.moge-wheels" 2>/dev/null)" != "${wheels[*]}" ]; then
    say "installing the CUDA 13.0 toolkit wheels into $work/venv"
    rm -rf "$work/venv"
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet --disable-pip-version-check "${wheels[@]}"
    echo "${wheels[*]}" > "$work/venv/.moge-wheels"
fi
cu=$(echo "$work"/venv/lib/python3.*/site-packages/nvidia/cu13)
[ -x "$cu/bin/nvcc" ] || { echo "build-cuda.sh: no nvcc under $cu" >&2; exit 1; }
export PATH=$cu/bin:$PATH CUDA_HOME=$cu CUDA_ROOT=$cu CUDA_PATH=$cu
# No GPU to ask: the target is given. 90 = H100/H200 (candle's kernels become sm_90a PTX, which
# runs on compute capability 9.0 only); set CUDA_COMPUTE_CAP=80, 89, 100... for another GPU.
export CUDA_COMPUTE_CAP=${CUDA_COMPUTE_CAP:-90}
export CUDARC_CUDA_VERSION=13000
say "nvcc: $(nvcc --version | tail -1)"

# 2. candle-core, patched. Its registry copy is where cargo put it (fetched first if absent).
cargo fetch --locked --quiet
src=$(cargo metadata --locked --format-version 1 | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(next(p["manifest_path"] for p in m["packages"] if p["name"] == "candle-core" and p["version"] == "0.11.1").rsplit("/", 1)[0])')
crate=$work/candle-core-0.11.1
# Made again only when the source or a patch changed (cargo rebuilds a path crate on any new mtime).
stamp="$src $(cat "$root"/patches/candle-core-0.11.1-*.patch | sha256sum)"
if [ "$(cat "$crate/.moge-stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$crate"
    cp -r "$src" "$crate"
    for p in "$root"/patches/candle-core-0.11.1-*.patch; do
        say "applying $(basename "$p")"
        patch --quiet --forward -p1 -d "$crate" < "$p"
    done
    echo "$stamp" > "$crate/.moge-stamp"
fi
grep -q '"dynamic-loading"' "$crate/Cargo.toml" || { echo "build-cuda.sh: the patch did not take" >&2; exit 1; }

# 3. Static cudart: candle-kernels asks for `cudart` without a search path; the only libcudart
# the linker can find is this archive.
mkdir -p "$work/cudart-static"
ln -sf "$cu/lib/libcudart_static.a" "$work/cudart-static/libcudart.a"
export RUSTFLAGS="${RUSTFLAGS:-} -L native=$work/cudart-static"

# Cargo rewrites the lock file for the patched source, so it builds from a shadow of the checkout
# with a lock file of its own (a build of the checkout running meanwhile is not disturbed).
tree=$work/tree
rm -rf "$tree"
mkdir -p "$tree"
for f in "$root"/*; do
    case "$(basename "$f")" in
        target) ;;
        Cargo.toml|Cargo.lock) cp "$f" "$tree/" ;;
        *) ln -s "$f" "$tree/" ;;
    esac
done
cd "$tree"
patch_cfg="patch.crates-io.candle-core.path=\"$crate\""

say "building moge --features $features (-j$jobs) into $target"
cargo build --release -j"$jobs" --features "$features" --target-dir "$target" --config "$patch_cfg"
bin=$target/release/moge

# 4. The binary must start without any CUDA library present.
needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
say "NEEDED: $needed"
if echo "$needed" | grep -Eq 'libcuda|libcudart|libcublas|libcurand|libnvrtc|libcudnn'; then
    echo "build-cuda.sh: the binary links a CUDA library: $needed" >&2
    exit 1
fi
"$bin" --version >/dev/null
size=$(du -m "$bin" | cut -f1)
say "built $bin (${size} MB) in $(( $(date +%s) - start )) s"

if [ "$run_tests" = 1 ]; then
    say "parity tests with --features $features"
    cargo test --release -j"$jobs" --features "$features" --target-dir "$target" --config "$patch_cfg" --test it -- parity:: generic_ops:: bench_cli:: predict::
    say "tests passed"
fi
say "done in $(( $(date +%s) - start )) s"
