#!/usr/bin/env bash
# `moge colmap`'s cost beside the model's, per image: the fit (sidecar colmap.fit_ms) and the
# whole post-process stage (fit, files, the solve) against the forward, on the synthetic room of
# tests/make_colmap_fixtures.py at a photo's size.
#
#   scripts/bench-colmap.sh PYTHON WEIGHTS [WxH] [POINTS]
#
# PYTHON has numpy, Pillow and pycolmap; WEIGHTS is a checkpoint (a full-size one, e.g. made by
# tests/make_fullsize_reference.py --save-checkpoint). Prints the medians over the images done.
set -euo pipefail
py=${1:?python with pycolmap}; weights=${2:?weights}; size=${3:-1280x960}; points=${4:-60000}
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$py" "$root/tests/make_colmap_fixtures.py" --size "$size" --points "$points" --out "$work/scene" >/dev/null
cargo build -q --release --manifest-path "$root/Cargo.toml"
"$root/target/release/moge" colmap "$work/scene/sparse_bin" --images "$work/scene/images" -o "$work/out" \
    --weights "$weights" -j 2 --quiet || true   # d, e, f fail by design
"$py" - "$work/out" "$size" "$points" <<'PY'
import json, pathlib, statistics, sys
out, size, points = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = []
for p in sorted(out.rglob("*.json")):
    s = json.loads(p.read_text())
    if "colmap" not in s:
        continue
    t = s["timings_ms"]
    rows.append((s["colmap"]["image_name"], s["colmap"]["fit"]["points"], s["colmap"]["fit_ms"], t["forward"], t["postprocess"]))
for r in rows:
    print(f"{r[0]:12s} points {r[1]:6d}  fit {r[2]:8.3f} ms  forward {r[3]:9.1f} ms  postprocess {r[4]:8.1f} ms")
fit, fwd, post = (statistics.median(r[i] for r in rows) for i in (2, 3, 4))
print(f"{size}, {points} scene points: median fit {fit:.3f} ms = {100 * fit / fwd:.3f} % of the forward ({fwd:.0f} ms); "
      f"post-process stage (solve, fit, files) {post:.0f} ms = {100 * post / fwd:.1f} %")
PY
