#!/usr/bin/env bash
# How much the field of view and the metric scale change from frame to frame: the mean
# |fov(k+1) - fov(k)| (degrees) and |log s(k+1) - log s(k)| over a clip's frames, from the
# sidecars, with each frame's own (raw), --video-scale smooth, --video-scale smooth with
# --video-fov smooth, and --video-fov shared --shared-scale.
#   scripts/video-flicker.sh WEIGHTS [CLIP] [SMOOTH]    (SMOOTH: default `smooth`, or smooth=T)
# Without CLIP, a 4 s 10 fps 320x240 clip is made with ffmpeg: a moving crop of a 640x480
# picture (testsrc2), as a panning camera films it. Needs ffmpeg and python3; uses
# target/release/moge (cargo build --release).
set -euo pipefail
weights=$1
clip=${2:-}
smooth=${3:-smooth}
moge=${MOGE:-target/release/moge}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$clip" ]; then
    clip=$work/pan.mp4
    ffmpeg -nostdin -v error -f lavfi -i "testsrc2=size=640x480:rate=10:duration=4" \
        -vf "crop=320:240:x='t*70':y='t*50'" -c:v libx264 -pix_fmt yuv420p "$clip"
fi
"$moge" batch "$clip" -o "$work/raw" --weights "$weights" --format json --quiet
"$moge" batch "$clip" -o "$work/smooth" --weights "$weights" --format json --video-scale "$smooth" --quiet
"$moge" batch "$clip" -o "$work/smooth_fov" --weights "$weights" --format json --video-scale "$smooth" --video-fov "$smooth" --quiet
"$moge" batch "$clip" -o "$work/shared" --weights "$weights" --format json --video-fov shared --shared-scale --quiet
python3 - "$work" raw smooth smooth_fov shared <<'PY'
import glob, json, math, sys
work, modes = sys.argv[1], sys.argv[2:]
for mode in modes:
    js = [json.load(open(f)) for f in sorted(glob.glob(f"{work}/{mode}/*/*.json"))]
    s, f = [j["metric_scale"] for j in js], [j["fov_x"] for j in js]
    ds = [abs(math.log(b) - math.log(a)) for a, b in zip(s, s[1:])]
    df = [abs(b - a) for a, b in zip(f, f[1:])]
    print(f"{mode:>10}: {len(s)} frames, fov {min(f):.2f}..{max(f):.2f} deg, mean |dfov| per frame {sum(df) / len(df):.3f} deg (max {max(df):.3f}); "
          f"scale {min(s):.4f}..{max(s):.4f}, mean |dlog s| {sum(ds) / len(ds):.2e} (max {max(ds):.2e})")
PY
