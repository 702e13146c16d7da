#!/usr/bin/env python3
"""Ray Data with moge_rs.ray against one `moge batch` process, on the same photos and cores.

    python scripts/bench-ray.py CHECKPOINT [--photos 40] [--size 640x480] [--rounds 2]

In an environment with moge_rs and ray (scripts/test.sh makes one: target/pytest-venv). Writes
--photos JPEGs (seeded noise over gradients), then alternates, round by round:
  - `moge batch DIR -o OUT --format npz` with RAYON_NUM_THREADS=2 (one process, 2 threads for
    the forwards, --jobs 2 for the host stages);
  - Ray (ray.init(num_cpus=2), a local cluster, started once): read_binary_files -> map_batches
    (MoGePredictor, 2 actors x num_cpus=1, so 1 thread each, npz per row into OUT).
Each is timed end to end: model loads and actor starts included, the cluster's start not.
Then, in this process (1 thread), the adapter's own cost per row: MoGePredictor.__call__ on
batches of the same photos, less the time inside the native predict calls it makes.
Prints the walls, the throughput ratio (Ray over native; 1.0 = no cost) and the per-row
overhead, with the CPU's name.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


def make_photos(folder, n, w, h):
    from PIL import Image

    rng = np.random.default_rng(7)
    folder.mkdir(parents=True)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    for i in range(n):
        base = np.stack([x / w, y / h, (x * y) / (w * h)], -1) * 180 + rng.integers(0, 75, (h, w, 3))
        Image.fromarray(base.clip(0, 255).astype(np.uint8)).save(folder / f"p{i:03d}.jpg", quality=92)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint")
    ap.add_argument("--photos", type=int, default=40)
    ap.add_argument("--size", default="640x480")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--moge", default=shutil.which("moge") or "target/release/moge", help="the moge binary")
    args = ap.parse_args()
    w, h = map(int, args.size.split("x"))

    import ray
    from moge_rs.ray import MoGePredictor

    work = Path(tempfile.mkdtemp(prefix="moge-bench-ray-"))
    try:
        photos = work / "photos"
        make_photos(photos, args.photos, w, h)
        model = {"model": str(Path(args.checkpoint).resolve()), "precision": args.precision, "device": "cpu"}
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        ray.data.DataContext.get_current().enable_progress_bars = False
        walls = {"native": [], "ray": []}
        for r in range(args.rounds):
            for kind in ("native", "ray") if r % 2 == 0 else ("ray", "native"):
                out = work / f"out-{kind}-{r}"
                t = time.perf_counter()
                if kind == "native":
                    env = {**os.environ, "RAYON_NUM_THREADS": "2"}
                    cmd = [args.moge, "batch", str(photos), "-o", str(out), "--weights", model["model"], "--precision", args.precision, "--device", "cpu", "--format", "npz", "--jobs", "2", "--quiet"]
                    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if p.returncode != 0:
                        sys.exit(f"moge batch failed: {p.stderr}")
                else:
                    ds = ray.data.read_binary_files(str(photos), include_paths=True, num_cpus=0)
                    rows = ds.map_batches(MoGePredictor, fn_constructor_kwargs={**model, "output_dir": str(out)}, compute=ray.data.ActorPoolStrategy(size=2), num_cpus=1, batch_size=4).take_all()
                    bad = [r["error"] for r in rows if r["error"]]
                    if len(rows) != args.photos or bad:
                        sys.exit(f"ray: {len(rows)} rows, errors: {bad[:3]}")
                walls[kind].append(time.perf_counter() - t)
                written = sorted(out.rglob("*.npz"))
                assert len(written) == args.photos, f"{kind}: {len(written)} npz files"
                print(f"round {r} {kind:6s}: {walls[kind][-1]:7.2f} s", flush=True)
        ray.shutdown()
        # The same npz either way (the adapter writes moge predict's bytes).
        same = all((work / "out-native-0" / f.name).read_bytes() == f.read_bytes() for f in sorted((work / "out-ray-0").rglob("*.npz")))

        # The adapter's own cost per row, in this process with one thread.
        pred = MoGePredictor(**model, threads=1, output_dir=str(work / "out-overhead"))
        inside = [0.0]

        def timed(f):
            def call(*a, **k):
                t0 = time.perf_counter()
                try:
                    return f(*a, **k)
                finally:
                    inside[0] += time.perf_counter() - t0

            return call

        native = pred.runner.model._native

        class Timed:
            def __getattr__(self, name):
                return timed(getattr(native, name))

        pred.runner.model._native = Timed()
        # Writing the npz is work `moge batch` does too: timed as inside.
        import moge_rs

        moge_rs._native.save_npz = timed(moge_rs._native.save_npz)
        files = sorted(photos.iterdir())[:8]
        batch = {"bytes": np.array([f.read_bytes() for f in files], dtype=object), "path": np.array([str(f) for f in files], dtype=object)}
        per_row = []
        for _ in range(2):
            inside[0] = 0.0
            t = time.perf_counter()
            pred(batch)
            per_row.append((time.perf_counter() - t - inside[0]) / len(files) * 1e3)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    n, nat, ry = args.photos, statistics.median(walls["native"]), statistics.median(walls["ray"])
    print(f"\n{cpu_name()}, {os.cpu_count()} CPUs; {n} photos {w}x{h}; {Path(args.checkpoint).name}, precision {args.precision}")
    print(f"moge batch (1 process, 2 threads): median {nat:.2f} s  ({n / nat:.2f} photos/s)  runs {', '.join(f'{x:.2f}' for x in walls['native'])}")
    print(f"Ray Data (2 actors x 1 thread):    median {ry:.2f} s  ({n / ry:.2f} photos/s)  runs {', '.join(f'{x:.2f}' for x in walls['ray'])}")
    print(f"throughput, Ray over moge batch: {nat / ry:.3f}")
    print(f"npz files identical: {same}")
    print(f"adapter overhead per row (outside the native predict and npz writing): {min(per_row):.2f} ms")


if __name__ == "__main__":
    main()
