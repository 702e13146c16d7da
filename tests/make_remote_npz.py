"""Write tests/fixtures/remote/numpy_prediction.npz: a prediction as a Python server writes it
with numpy alone, for tests/it/remote_client.rs (which recomputes every value below).

Run from the repository root with any Python that has numpy::

    python tests/make_remote_npz.py

The layout: np.savez_compressed (deflated entries), normal float16, mask numpy bool,
metric_scale float64, intrinsics float64, the rest float32; pixel (y=1, x=2) is invalid
(inf depth and points, zero normal). The arrays are computed, not random, so the file is the
same on every run.
"""

import numpy as np

H, W = 4, 5
y, x = np.mgrid[0:H, 0:W].astype(np.float32)
depth = 1.0 + 0.25 * x + 0.5 * y
points = np.stack([(x - 2.0) * 0.125 * depth, (y - 1.5) * 0.125 * depth, depth], axis=-1).astype(np.float32)
normal = np.stack([x / 8.0 - 0.25, y / 8.0 - 0.25, -np.ones_like(x)], axis=-1)
normal = (normal / np.linalg.norm(normal, axis=-1, keepdims=True)).astype(np.float16)
mask = np.ones((H, W), dtype=bool)
mask[1, 2] = False
depth[1, 2] = np.inf
points[1, 2] = np.inf
normal[1, 2] = 0
intrinsics = np.array([[0.8, 0.0, 0.5], [0.0, 1.0, 0.5], [0.0, 0.0, 1.0]], dtype=np.float64)
np.savez_compressed(
    "tests/fixtures/remote/numpy_prediction.npz",
    points=points,
    depth=depth.astype(np.float32),
    normal=normal,
    mask=mask,
    intrinsics=intrinsics,
    metric_scale=np.float64(2.5),
)
