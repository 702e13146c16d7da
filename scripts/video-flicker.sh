#!/usr/bin/env bash
# How much the metric scale changes from frame to frame, with `--video-scale raw` and `smooth`:
# the mean |log s(k+1) - log s(k)| over a clip's frames, from the sidecars.
#   scripts/video-flicker.sh WEIGHTS [CLIP] [SMOOTH]    (SMOOTH: default `smooth`, or smooth=T)
# Without CLIP, a 4 s 10 fps 320x240 test clip with noise that changes every frame is made
# with ffmpeg. Needs ffmpeg and python3; uses target/release/moge (cargo build --release).
set -euo pipefail
weights=$1
clip=${2:-}
smooth=${3:-smooth}
moge=${MOGE:-target/release/moge}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$clip" ]; then
    clip=$work/noisy.mp4
    ffmpeg -nostdin -v error -f lavfi -i "testsrc2=size=320x240:rate=10:duration=4,noise=alls=60:allf=t" \
        -c:v libx264 -pix_fmt yuv420p "$clip"
fi
for mode in raw "$smooth"; do
    "$moge" batch "$clip" -o "$work/$mode" --weights "$weights" --format json --video-scale "$mode" --quiet
done
python3 - "$work" raw "$smooth" <<'PY'
import glob, json, math, sys
work, modes = sys.argv[1], sys.argv[2:]
for mode in modes:
    s = [json.load(open(f))["metric_scale"] for f in sorted(glob.glob(f"{work}/{mode}/*/*.json"))]
    d = [abs(math.log(b) - math.log(a)) for a, b in zip(s, s[1:])]
    print(f"{mode:>12}: {len(s)} frames, scale {min(s):.4f}..{max(s):.4f}, mean |dlog s| per frame {sum(d) / len(d):.2e}, max {max(d):.2e}")
PY
