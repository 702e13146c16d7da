#!/usr/bin/env bash
# Side-by-side, in one run: upstream `moge infer --device cpu` (PyTorch fp32, 2 threads) and
# `moge batch` (npz out) on the same photos, weights and token count; whole process, wall time
# and peak RSS.
#
#   scripts/bench-vs-upstream.sh VENV CHECKPOINT [N_IMAGES] [TOKENS]
#   ISA=avx2 scripts/bench-vs-upstream.sh ...   both held to AVX2 (as on a CPU without AVX-512):
#       moge by MOGE_MAX_CPU_ISA=avx2, PyTorch by ATEN_CPU_CAPABILITY=avx2,
#       ONEDNN_MAX_CPU_ISA=AVX2 and MKL_ENABLE_INSTRUCTIONS=AVX2
#
# VENV: a Python venv with the reference (see tests/make_fixtures.py), CHECKPOINT: an upstream
# model.pt (tests/make_fullsize_reference.py --save-checkpoint DIR writes synthetic full-size
# ones). Photos: N synthetic 640x480 PNGs. Prints one line per run and the ratios.
set -euo pipefail
venv=$1; ckpt=$2; n=${3:-4}; tokens=${4:-1800}
root=$(cd "$(dirname "$0")/.." && pwd)
moge=${MOGE:-$root/target/release/moge}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mkdir -p "$work/photos"
"$venv/bin/python" - "$work/photos" "$n" <<'PY'
import sys, numpy as np
from PIL import Image
out, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
for i in range(n):
    y, x = np.mgrid[0:480, 0:640].astype(np.float32)
    img = np.stack([(x / 640) * 200, (y / 480) * 180, 120 + 60 * np.sin(x / 40 + i)], -1)
    img += rng.normal(0, 12, img.shape)
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(f"{out}/photo_{i:03d}.png")
PY
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 RAYON_NUM_THREADS=2 OPENCV_IO_ENABLE_OPENEXR=1
case "${ISA:-}" in
  "") ;;
  avx2) export MOGE_MAX_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  *) echo "bench-vs-upstream.sh: ISA=$ISA: only avx2 (or unset) is known" >&2; exit 2 ;;
esac
measure() { # label, command...
  local label=$1; shift
  /usr/bin/time -f "%e %M" -o "$work/time" "$@" > "$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  read -r wall rss < "$work/time"
  printf '%-34s wall %8.2f s   %6.2f s/image   peak RSS %6.0f MiB\n' "$label" "$wall" "$(echo "$wall / $n" | bc -l)" "$(echo "$rss / 1024" | bc -l)"
  echo "$wall $rss" > "$work/$label.t"
}
echo "photos: $n x 640x480, tokens: $tokens, checkpoint: $ckpt, CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (cpu family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs)), threads: 2, ISA cap: ${ISA:-none}"
"$moge" info 2>/dev/null | grep -E '^cpu (route|kernels)' || true
measure upstream "$venv/bin/moge" infer -i "$work/photos" -o "$work/up" --pretrained "$ckpt" --device cpu --num_tokens "$tokens" --maps
measure moge-f32 "$moge" batch "$work/photos" -o "$work/f32" --weights "$ckpt" --num-tokens "$tokens" --precision f32 --quiet
measure moge-bf16 "$moge" batch "$work/photos" -o "$work/bf16" --weights "$ckpt" --num-tokens "$tokens" --precision bf16 --quiet
read -r up _ < "$work/upstream.t"; read -r f _ < "$work/moge-f32.t"; read -r b _ < "$work/moge-bf16.t"
printf 'speed-up vs upstream: f32 %.2fx, bf16 %.2fx\n' "$(echo "$up / $f" | bc -l)" "$(echo "$up / $b" | bc -l)"
