"""The MLX port's MoGe-3 refiner (PyPI mlx-vlm, ``mlx_vlm.models.moge3.refiner.Sparse3DUNet``, the
released ViT-L architecture) on the scene of ``examples/refiner_bench.rs``, timed per call, to be
run in the same sitting as that example (the machines are shared: compare the ratio).

    python3 -m venv venv-mlx && venv-mlx/bin/pip install "mlx[cpu]" mlx-vlm==0.7.10 numpy
    venv-mlx/bin/python scripts/bench_mlx_refiner.py 560 832 3
    cargo run --release --example refiner_bench -- 560 832 3

The voxels are built as MoGe-3 builds them (``round(log z * 256)`` less the minimum, one per
pixel, raster order); the per-level voxel counts printed by both tell that they ran the same
scene. The weights are MLX's initial values (the time does not depend on them).
"""
import sys
import time

import mlx.core as mx
import numpy as np
from mlx_vlm.models.moge3.config import RefinerConfig
from mlx_vlm.models.moge3.refiner import Sparse3DUNet


def scene(h: int, w: int) -> np.ndarray:
    i = (np.arange(h, dtype=np.float32) / np.float32(h))[:, None]
    j = (np.arange(w, dtype=np.float32) / np.float32(w))[None, :]
    d = np.where(i < 0.4, np.float32(6.0), np.float32(1.0) + np.float32(5.0) * ((1 - i) / np.float32(0.6)) ** 2)
    return np.log(d + np.float32(0.05) * np.sin(20 * j) * np.cos(14 * i)).astype(np.float32)


def main() -> None:
    h, w, reps = (int(a) for a in (sys.argv[1:4] + ["560", "832", "3"][len(sys.argv[1:4]):]))
    logz = scene(h, w)
    zq = np.round(logz * np.float32(256)).astype(np.int64)
    z = (zq - zq.min()).astype(np.int32)
    ii, jj = np.meshgrid(np.arange(h, dtype=np.int32), np.arange(w, dtype=np.int32), indexing="ij")
    coords = np.stack([np.zeros_like(ii), ii, jj, z], -1).reshape(-1, 4)
    feats = np.stack([jj / np.float32(w) - 0.5, ii / np.float32(h) - 0.5, logz], -1).reshape(-1, 3).astype(np.float32)
    shape = (1, h, w, int(z.max()) + 1)
    enc = np.random.default_rng(7).uniform(-1, 1, (1, h // 16, w // 16, 1026)).astype(np.float32)
    net = Sparse3DUNet(RefinerConfig())
    mx.eval(net.parameters())
    args = (mx.array(feats), mx.array(coords), shape, mx.array(enc))
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        mx.eval(net(*args))
        times.append(time.perf_counter() - t)
    # Voxels per level, as the pooling makes them (coord // 2, deduplicated).
    counts, c = [], coords[:, 1:].astype(np.int64)
    for _ in range(5):
        u = np.unique(c, axis=0)
        counts.append(len(u))
        c = u // 2
    print(f"mlx {mx.__version__}: refiner, {h}x{w} ({len(coords)} voxels), median {sorted(times)[len(times) // 2]:.3f} s a call "
          f"(all: {', '.join(f'{t:.3f}' for t in times)}); voxels per level {counts}")


if __name__ == "__main__":
    main()
