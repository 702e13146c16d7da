#!/usr/bin/env bash
# Panoramas, side by side in one run, at upstream's default sizes (12 views of 512, merged at
# 1920 x 960 from a 3840 x 1920 photo):
#  1. the merge alone on the same twelve view maps (a synthetic room, each view with its own
#     scale error): upstream's `merge_panorama_depth` (dlr-moge 2.0.0, scipy) and moge's
#     (`examples/panorama_merge.rs`), their times and how far apart the two maps are;
#  2. `moge panorama` on a synthetic photo with CHECKPOINT, f32 and bf16: the views' time, the
#     merge's, and the merge's share.
# With UPSTREAM=1, 3. upstream's command on the same photo and checkpoint, as its
# `infer_panorama.py` does it with the MoGe-2 class (its script loads MoGe-1's): split, the views
# in batches of 4 through `model.infer` (PyTorch fp32, 2 threads) at TOKENS, the merge, the resize
# and the points; outputs not written. TOKENS 3600 is upstream's default (resolution level 9).
#
#   scripts/bench-panorama.sh VENV CHECKPOINT [TOKENS]
#
# VENV: a Python venv with the reference (see tests/make_fixtures.py), CHECKPOINT: a model.pt
# (tests/make_fullsize_reference.py --save-checkpoint DIR writes synthetic full-size ones).
set -euo pipefail
venv=$1; ckpt=$2; tokens=${3:-1800}
root=$(cd "$(dirname "$0")/.." && pwd)
moge=${MOGE:-$root/target/release/moge}
merge_bin=${MERGE:-$root/target/release/examples/panorama_merge}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2 MKL_NUM_THREADS=2 RAYON_NUM_THREADS=2
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs) (cpu family $(grep -m1 'cpu family' /proc/cpuinfo | cut -d: -f2 | xargs), model $(grep -m1 '^model' /proc/cpuinfo | cut -d: -f2 | xargs)), threads: 2, moge $(git -C "$root" rev-parse --short HEAD)"
"$venv/bin/python" - "$root" "$work" <<'PY'
import sys, time
root, work = sys.argv[1], sys.argv[2]
sys.path.insert(0, f"{root}/tests")
import cv2, numpy as np
import moge.utils.panorama as pano
import utils3d
from make_panorama_fixtures import make_panorama
cv2.imwrite(f"{work}/pano.png", make_panorama(1920, 3840)[..., ::-1])
# A 6 x 8 x 2.7 m room seen from 1.5 m above its floor, a skylight in the ceiling (masked), a
# pillar; each view's distances scaled by its own error, as a model's views are.
ext, intr = pano.get_panorama_cameras()
uv = utils3d.np.uv_map((512, 512))
rng = np.random.default_rng(1)
dist, masks = [], []
for i in range(12):
    d = utils3d.np.unproject_cv(uv, np.ones_like(uv[..., 0]), extrinsics=ext[i], intrinsics=intr[i]).astype(np.float64)
    d /= np.linalg.norm(d, axis=-1, keepdims=True)
    with np.errstate(divide="ignore"):
        t = np.stack([np.where(d[..., 0] > 0, 3.0, -3.0) / d[..., 0], np.where(d[..., 1] > 0, 4.0, -4.0) / d[..., 1],
                      np.where(d[..., 2] > 0, 1.2, -1.5) / d[..., 2]], -1)
    t = np.where(t > 0, t, np.inf).min(-1)
    hit = d * t[..., None]
    pillar = (np.abs(np.arctan2(d[..., 1], d[..., 0]) - 0.6) < 0.12) & (np.abs(d[..., 2]) < 0.5)
    t = np.where(pillar, 0.6 * t, t) * (1 + 0.002 * np.sin(9 * hit[..., 0]) * np.cos(7 * hit[..., 1]))
    m = ~((d[..., 2] > 0) & (np.abs(hit[..., 0]) < 1.0) & (np.abs(hit[..., 1]) < 1.5))
    dist.append((t * (1 + 0.05 * rng.standard_normal())).astype(np.float32)); masks.append(m)
np.savez(f"{work}/views.npz", distance=np.stack(dist), mask=np.stack(masks).astype(np.uint8))
s = time.time()
out, mask = pano.merge_panorama_depth(1920, 960, dist, masks, ext, intr)
t = time.time() - s
np.savez(f"{work}/upstream.npz", distance=out, mask=mask)
print(f"upstream merge 1920x960 (scipy): {t:.2f} s")
open(f"{work}/upstream.t", "w").write(str(t))
PY
"$merge_bin" "$work/views.npz" "$work/moge.npz" | tee "$work/moge.log"
"$venv/bin/python" - "$work" <<'PY'
import sys, re, numpy as np
work = sys.argv[1]
u, m = np.load(f"{work}/upstream.npz"), np.load(f"{work}/moge.npz")
a, b = m["distance"], u["distance"]
print(f"moge vs upstream: PCC {np.corrcoef(a.ravel(), b.ravel())[0, 1]:.7f}, median relative difference "
      f"{np.median(np.abs(a - b) / b):.2e}, mask agreement {np.mean(m['mask'].astype(bool) == u['mask']):.5f}")
t = float(open(f"{work}/upstream.t").read())
mt = float(re.search(r": ([0-9.]+) s", open(f"{work}/moge.log").read()).group(1))
print(f"merge: moge {t / mt:.1f}x faster")
PY
for p in f32 bf16; do
  "$moge" panorama "$work/pano.png" -o "$work/$p" --weights "$ckpt" --precision "$p" --num-tokens "$tokens" --json > "$work/$p.json"
  "$venv/bin/python" - "$work/$p.json" "$p" "$tokens" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
total, merge = j["total_ms"] / 1e3, j["merge_ms"] / 1e3
print(f"moge panorama 3840x1920, {sys.argv[2]}, {sys.argv[3]} tokens: {total:.2f} s, of which the merge {merge:.2f} s "
      f"= {100 * merge / (total - merge):.1f} % of the rest (reading, views, writing)")
PY
done
if [ "${UPSTREAM:-0}" = 1 ]; then
  "$venv/bin/python" - "$ckpt" "$tokens" "$work/pano.png" <<'PY'
import sys, time, cv2, numpy as np, torch, utils3d
from moge.utils.panorama import get_panorama_cameras, split_panorama_image, merge_panorama_depth, spherical_uv_to_directions
from moge.model.v2 import MoGeModel
torch.set_num_threads(2)
model = MoGeModel.from_pretrained(sys.argv[1]).eval()
tokens = int(sys.argv[2])
start = time.time()
image = cv2.cvtColor(cv2.imread(sys.argv[3]), cv2.COLOR_BGR2RGB)
height, width = image.shape[:2]
ext, intr = get_panorama_cameras()
views = split_panorama_image(image, ext, intr, 512)
dist, masks = [], []
with torch.no_grad():
    for i in range(0, len(views), 4):
        t = torch.tensor(np.stack(views[i:i + 4]) / 255, dtype=torch.float32).permute(0, 3, 1, 2)
        fov_x, _ = np.rad2deg(utils3d.np.intrinsics_to_fov(np.array(intr[i:i + 4])))
        o = model.infer(t, fov_x=torch.tensor(fov_x, dtype=torch.float32), apply_mask=False, num_tokens=tokens)
        dist.extend(list(o["points"].norm(dim=-1).numpy())); masks.extend(list(o["mask"].numpy()))
views_s = time.time() - start
s = time.time()
d, m = merge_panorama_depth(min(1920, width), min(960, height), dist, masks, ext, intr)
merge_s = time.time() - s
d = cv2.resize(d.astype(np.float32), (width, height), cv2.INTER_LINEAR)
m = cv2.resize(m.astype(np.uint8), (width, height), cv2.INTER_NEAREST) > 0
points = d[:, :, None] * spherical_uv_to_directions(utils3d.np.uv_map(height, width))
total = time.time() - start
print(f"upstream's command (fp32), 3840x1920, {tokens} tokens: {total:.2f} s, of which the views {views_s:.2f} s, the merge {merge_s:.2f} s")
PY
fi
