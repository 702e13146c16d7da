"""What the Ray and Spark tests share: 40 photos as users have them (JPEG and PNG, two folders,
a few sizes) and one damaged, the `moge predict` npz of each, and a predictor that counts its
model loads. Imported by Ray's workers too (the tests put this folder on their PYTHONPATH)."""

import contextlib
import os
import subprocess
import threading
import uuid
from pathlib import Path

import numpy as np

from moge_rs import _native
from moge_rs.ray import MoGePredictor

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "tests" / "fixtures" / "tiny_normal.pt"
MOGE = Path(os.environ.get("MOGE_BIN", ROOT / "target" / "ci" / "moge"))
# The options of every run: the fixture checkpoint, exact f32 on the CPU.
MODEL = {"model": str(TINY), "precision": "f32", "device": "cpu"}
CLI_MODEL = ["--weights", str(TINY), "--precision", "f32", "--device", "cpu"]
SIZES = [(64, 48), (48, 64), (40, 30), (72, 40)]


def make_photos(root: Path, n: int = 40):
    """n photos under root/a and root/b (every fourth a PNG, the rest JPEG) with smooth content
    and noise, seeded; returns their paths, sorted."""
    from PIL import Image

    rng = np.random.default_rng(46)
    paths = []
    for i in range(n):
        w, h = SIZES[i % len(SIZES)]
        y, x = np.mgrid[0:h, 0:w].astype(np.float32)
        base = np.stack([x / w, y / h, (x + y) / (w + h)], axis=-1) * 200 + rng.integers(0, 55, (h, w, 3))
        img = Image.fromarray(base.clip(0, 255).astype(np.uint8))
        folder = root / ("a" if i < n // 2 else "b")
        folder.mkdir(parents=True, exist_ok=True)
        if i % 4 == 0:
            p = folder / f"p{i:02d}.png"
            img.save(p)
        else:
            p = folder / f"p{i:02d}.jpg"
            img.save(p, quality=90)
        paths.append(p)
    return sorted(paths)


def damage(path: Path) -> Path:
    """A JPEG cut short, as an interrupted copy leaves it."""
    bad = path.with_name("damaged.jpg")
    data = path.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return bad


def predict_npz(photos, out: Path):
    """`moge predict`'s npz of each photo (unique names), in out/."""
    assert MOGE.is_file(), f"{MOGE}: build it first (cargo test --profile ci)"
    r = subprocess.run([str(MOGE), "predict", *map(str, photos), "-o", str(out), *CLI_MODEL], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {p.stem: out / f"{p.stem}.npz" for p in photos}


def assert_row_is_npz(row, npz: Path, keys=("points", "depth", "normal", "mask", "intrinsics")):
    """Every array of a result row equals the npz's, bit for bit (flattened rows are reshaped)."""
    with np.load(npz) as z:
        for k in keys:
            want = z[k].astype(bool) if k == "mask" else z[k]
            got = np.asarray(row[k])
            assert got.size == want.size, f"{npz.stem}: {k} has {got.size} values, the npz {want.size}"
            got = got.reshape(want.shape).astype(want.dtype)
            assert np.array_equal(got.view(np.uint8) if want.dtype == bool else got.view(np.uint32), want.view(np.uint8) if want.dtype == bool else want.view(np.uint32)), f"{npz.stem}: {k} differs from moge predict's"
        assert float(row["metric_scale"]) == float(z["metric_scale"])
        assert float(row["fov_x"]) == float(z["fov_x"]) and float(row["fov_y"]) == float(z["fov_y"])


class CountingPredictor(MoGePredictor):
    """MoGePredictor that leaves one file per construction in `loads_dir`: its process and the
    threads its forwards were given."""

    def __init__(self, *, loads_dir: str, **kwargs):
        super().__init__(**kwargs)
        Path(loads_dir, f"{os.getpid()}-{uuid.uuid4().hex}").write_text(str(_native.threads()))


@contextlib.contextmanager
def serve():
    """`moge serve` with the fixture checkpoint on a free loopback port; its URL. Stopped on exit."""
    proc = subprocess.Popen(
        [str(MOGE), "serve", *CLI_MODEL, "--port", "0", "--host", "127.0.0.1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(60)
    try:
        assert lines and lines[0].startswith("moge: listening on "), f"no ready line; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        yield lines[0].strip().removeprefix("moge: listening on ")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
