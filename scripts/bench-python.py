#!/usr/bin/env python3
"""moge_rs beside the moge command line (and upstream PyTorch, if installed), side by side.

    python scripts/bench-python.py CHECKPOINT [--photos N] [--size WxH] [--rounds R] [--moge target/release/moge]

Run with the interpreter of an environment where moge_rs is installed (`pip install ./ffi/python`);
upstream is measured too where `torch` and `moge` (PyPI dlr-moge) import and CHECKPOINT is a
`model.pt`. Every figure is a whole process (start, model load, N photos) minus the same process
with one photo, divided by N - 1: the per-photo cost with the load taken out. The variants run
alternated, R rounds; medians are printed, with every round.

- `moge predict` (N photos in one call) against `model(path)` + `save_npz` (the same work: the
  CLI writes each photo's npz), and against `model(path)` alone. `moge predict` runs its photos
  through the pipeline, so it decodes the next photo and writes the last one's npz while the
  network runs; one `model(path)` call after another does each of those in turn;
- `moge batch DIR` against `model.predict_many(paths)` + `save_npz`;
- upstream: `MoGeModel.infer` on the same photos decoded by cv2, as upstream's CLI reads them.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY_ONE = """
import sys, moge_rs, pathlib
ckpt, out, photos = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
m = moge_rs.MoGeModel.from_pretrained(ckpt)
for p in photos:
    m(p).save_npz(out / (pathlib.Path(p).stem + ".npz"))
"""

PY_ONLY = """
import sys, moge_rs
ckpt, photos = sys.argv[1], sys.argv[3:]
m = moge_rs.MoGeModel.from_pretrained(ckpt)
for p in photos:
    m(p)
"""

PY_MANY = """
import sys, moge_rs, pathlib
ckpt, out, photos = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3:]
m = moge_rs.MoGeModel.from_pretrained(ckpt)
for p, o in zip(photos, m.imap(photos)):
    o.save_npz(out / (pathlib.Path(p).stem + ".npz"))
"""

UPSTREAM = """
import sys, cv2, torch
from moge.model.v2 import MoGeModel
torch.set_num_threads(len(__import__('os').sched_getaffinity(0)))
ckpt, photos = sys.argv[1], sys.argv[3:]
m = MoGeModel.from_pretrained(ckpt).eval()
for p in photos:
    img = cv2.cvtColor(cv2.imread(p), cv2.COLOR_BGR2RGB)
    t = torch.tensor(img / 255, dtype=torch.float32).permute(2, 0, 1)
    m.infer(t, num_tokens=1800, use_fp16=False)
"""


def wall(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(map(str, cmd))}\n{r.stderr}")
    return time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--photos", type=int, default=4)
    ap.add_argument("--size", default="1280x720")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--moge", default="target/release/moge")
    ap.add_argument("--only", help="a comma list of the variants to run (default: all)")
    args = ap.parse_args()
    import numpy as np
    from PIL import Image

    w, h = map(int, args.size.split("x"))
    tmp = Path(tempfile.mkdtemp(prefix="moge-bench-py-"))
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:h, 0:w]
    photos = []
    for i in range(args.photos):
        base = np.stack([(xx * (i + 1) / w) % 1, (yy / h), ((xx + yy) / (w + h))], -1) * 200
        img = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        p = tmp / "photos" / f"p{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(img).save(p, quality=92)
        photos.append(str(p))
    one_dir = tmp / "one"
    one_dir.mkdir()
    os.link(photos[0], one_dir / "p0.jpg")
    ck, moge_bin = args.checkpoint, args.moge

    def out():
        return tempfile.mkdtemp(dir=tmp)

    variants = {
        "moge predict": lambda ps: wall([moge_bin, "predict", *ps, "--weights", ck, "-o", out()]),
        "model(path)": lambda ps: wall([sys.executable, "-c", PY_ONE, ck, out(), *ps]),
        "model(path) alone": lambda ps: wall([sys.executable, "-c", PY_ONLY, ck, "-", *ps]),
        "moge batch": lambda ps: wall([moge_bin, "batch", str(tmp / "photos") if len(ps) > 1 else str(one_dir), "--weights", ck, "-o", out()]),
        "predict_many": lambda ps: wall([sys.executable, "-c", PY_MANY, ck, out(), *ps]),
    }
    try:
        import moge.model.v2  # noqa: F401  (binds the name `moge` here: hence moge_bin)
        import torch  # noqa: F401

        if ck.endswith(".pt"):
            variants["upstream infer"] = lambda ps: wall([sys.executable, "-c", UPSTREAM, ck, "-", *ps])
    except ImportError:
        print("upstream: not installed here (torch and dlr-moge), not measured")

    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    per = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, run in variants.items():
            full, single = run(photos), run(photos[:1])
            per[name].append((full - single) / (len(photos) - 1))
            print(f"round {r + 1}: {name:>15}: {per[name][-1]:.3f} s per photo (whole {full:.2f} s, one photo {single:.2f} s)", flush=True)
    med = {k: statistics.median(v) for k, v in per.items()}
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"\n{cpu}, {os.cpu_count()} cores, {args.photos} photos {args.size}, {args.rounds} rounds, medians:")
    for k, v in med.items():
        print(f"  {k:>15}: {v:.3f} s per photo  (rounds: {', '.join(f'{x:.3f}' for x in per[k])})")
    for a, b, fmt in [
        ("model(path)", "moge predict", "{:.3f}"),
        ("model(path) alone", "moge predict", "{:.3f}"),
        ("predict_many", "moge batch", "{:.3f}"),
        ("upstream infer", "model(path)", "{:.2f}x"),
    ]:
        if a in med and b in med:
            print(f"  {a} / {b}: " + fmt.format(med[a] / med[b]))


if __name__ == "__main__":
    main()
