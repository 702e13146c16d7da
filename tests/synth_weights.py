"""Deterministic synthetic MoGe-2 weights, defined so that Rust can regenerate them bit-for-bit.

The Rust twin is ``tests/it/support/synth.rs``; ``tests/fixtures/synth_check.json`` pins a few values.

Usage (Python reference venv, see below)::

    from synth_weights import synth_state_dict, TINY_CONFIGS
    sd = synth_state_dict(config, seed=7)                 # dict[str, np.ndarray float32], shaped geometry
    sd = synth_state_dict(config, seed=7, shape_geometry=False)   # "pure_random" variant

    python tests/synth_weights.py            # prints a summary of the tiny_normal state dict

Reference venv (PyPI only; torch is the large part)::

    python3 -m venv venv && . venv/bin/activate
    pip install -U pip wheel
    pip install torch numpy scipy
    pip install --no-deps dlr-moge==2.0.0 dlr-utils3d==1.3
    pip install opencv-python-headless==4.10.0.84 huggingface_hub click trimesh pillow matplotlib tqdm psutil

WEIGHT RULE (this text is the normative definition; the Rust twin implements exactly this)
=========================================================================================

Keys and shapes are exactly those of ``MoGeModel(**model_config).state_dict()`` (upstream class, including the two
buffers ``encoder.image_mean`` / ``encoder.image_std``). Every tensor is then overwritten. All arithmetic on
integers is modulo 2^64 (u64 wrapping), all float arithmetic is IEEE float32 with one rounding per operation
(no fused multiply-add).

1. Per tensor ``key`` (UTF-8 bytes) with shape ``shape`` and flat row-major element index ``i = 0..n-1``::

       h     = fnv1a64(key)            # offset basis 0xcbf29ce484222325, prime 0x100000001b3,
                                       # for each byte b: h = (h ^ b) * prime
       state = h ^ (seed * 0x9E3779B97F4A7C15)
       z = state + (i + 1) * 0x9E3779B97F4A7C15
       z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
       z = (z ^ (z >> 27)) * 0x94D049BB133111EB
       z =  z ^ (z >> 31)                                  # splitmix64 finaliser
       u = f32((z >> 40) - 2^23) * f32(2^-23)              # exact; u in [-1, 1)
       value = f32(u * scale) + offset                     # two separate f32 roundings (scale, offset are f32)

   (scale, offset) by key, first matching rule wins:

   * ``encoder.image_mean``: the f32 constants [0.485, 0.456, 0.406]   (no random numbers)
   * ``encoder.image_std``:  the f32 constants [0.229, 0.224, 0.225]   (no random numbers)
   * ``encoder.backbone.mask_token``: all 0.0                          (no random numbers)
   * key ends with ``.weight`` and ndim >= 2: scale = f32(sqrt(3.0 / fan_in)) computed in f64 then rounded to f32,
     fan_in = prod(shape[1:]) (also for ConvTranspose2d weights (in, out, kh, kw): just a rule); offset 0.0
   * key ends with ``.weight`` and ndim == 1 (LayerNorm): scale 0.1, offset 1.0
   * key ends with ``.bias``: scale 0.1, offset 0.0
   * key ends with ``.gamma`` (LayerScale): scale 0.1, offset 0.0
   * key ends with ``cls_token`` or ``pos_embed``: scale 0.5, offset 0.0
   * anything else: error.

   ("0.1", "0.5", "0.01", ... below always mean the nearest f32 to that decimal.)

2. Geometry shaping (default ``shape_geometry=True``; the "pure_random" variant skips it). In-place f32 edits,
   applied in this order, with ``L = len(neck.dim_res_blocks) - 1`` (= 4) and ``R = L - 1`` (= 3, the last
   resampler, whose ``.1`` is the 3x3 conv after the bilinear upsample). ``x *= s`` means ``x = f32(x * s)``,
   ``x += a`` means ``x = f32(x + a)``; indices are [out, in, kh, kw]:

   1. ``neck.input_blocks.L.weight[0, :, 0, 0] = [1, 0]``, ``[1, :, 0, 0] = [0, 1]``;
      ``neck.input_blocks.L.bias[0] = 0``, ``[1] = 0``.
   2. ``neck.resamplers.R.1.weight *= 0.01``, ``neck.resamplers.R.1.bias *= 0.01``.
   3. For each head H present, in the order points_head, normal_head, mask_head:
      ``H.input_blocks.L.weight[0, :, 0, 0] = e0`` (1 at in-channel 0, 0 elsewhere), ``[1, :, 0, 0] = e1``;
      ``H.input_blocks.L.bias[0] = 0``, ``[1] = 0``;
      ``H.resamplers.R.1.weight *= 0.01``, ``H.resamplers.R.1.bias *= 0.01``.
   4. (if points_head) ``points_head.output_blocks.L.weight *= 0.01``; then ``+= 0.5`` at [0,0,0,0],
      ``+= 0.5`` at [1,1,0,0], ``+= 0.3`` at [2,0,0,0], ``+= 0.2`` at [2,1,0,0];
      ``points_head.output_blocks.L.bias = [0.0, 0.0, 1.0]``.
   5. (if mask_head) ``mask_head.output_blocks.L.weight *= 0.01``; then ``+= 20.0`` at [0,0,0,0];
      ``mask_head.output_blocks.L.bias = [3.0]``.
   6. (if scale_head) with ``K = 2 * (len(scale_head.dims) - 2)`` (key index of the last Linear, = 4):
      ``scale_head.K.weight *= 0.1``; ``scale_head.K.bias = 0``.

   Effect: level-L neck channels 0/1 carry the view-plane uv (u, v) almost unchanged, the heads pass them through,
   so the raw points are approximately (0.5u, 0.5v, 1 + 0.3u + 0.2v) -> after the ``exp`` remap a smooth surface that
   projects with focal 2 and shift 0; the mask logit is approximately 20u + 3 (valid to the right of u = -0.15,
   i.e. a vertical boundary with ~60 % valid pixels); metric scale close to 1.
"""
from __future__ import annotations

import math
import sys

import numpy as np

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
GOLDEN = 0x9E3779B97F4A7C15
M64 = (1 << 64) - 1

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & M64
    return h


def _splitmix_u(state: int, n: int, chunk: int = 1 << 22) -> np.ndarray:
    """u values (float32 in [-1, 1)) for element indices 0..n-1 of a tensor with the given state."""
    out = np.empty(n, dtype=np.float32)
    g = np.uint64(GOLDEN)
    st = np.uint64(state)
    c1, c2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
    s30, s27, s31, s40 = np.uint64(30), np.uint64(27), np.uint64(31), np.uint64(40)
    inv = np.float32(2.0 ** -23)
    with np.errstate(over="ignore"):
        for start in range(0, n, chunk):
            stop = min(n, start + chunk)
            z = np.arange(start + 1, stop + 1, dtype=np.uint64)
            z *= g
            z += st
            z ^= z >> s30
            z *= c1
            z ^= z >> s27
            z *= c2
            z ^= z >> s31
            z >>= s40
            t = z.astype(np.int64) - (1 << 23)
            out[start:stop] = t.astype(np.float32) * inv
    return out


def scale_offset(key: str, shape) -> tuple[np.float32, np.float32]:
    ndim = len(shape)
    if key.endswith(".weight") and ndim >= 2:
        fan_in = int(np.prod(shape[1:]))
        return np.float32(math.sqrt(3.0 / fan_in)), np.float32(0.0)
    if key.endswith(".weight") and ndim == 1:
        return np.float32(0.1), np.float32(1.0)
    if key.endswith(".bias"):
        return np.float32(0.1), np.float32(0.0)
    if key.endswith(".gamma"):
        return np.float32(0.1), np.float32(0.0)
    if key.endswith("cls_token") or key.endswith("pos_embed"):
        return np.float32(0.5), np.float32(0.0)
    raise KeyError(f"synth_weights: no rule for key {key!r} with shape {tuple(shape)}")


def synth_tensor(key: str, shape, seed: int) -> np.ndarray:
    """Unshaped synthetic value of one tensor (float32 array of the given shape)."""
    shape = tuple(int(s) for s in shape)
    n = int(np.prod(shape)) if shape else 1
    if key == "encoder.image_mean":
        return np.array(IMAGENET_MEAN, dtype=np.float32).reshape(shape)
    if key == "encoder.image_std":
        return np.array(IMAGENET_STD, dtype=np.float32).reshape(shape)
    if key == "encoder.backbone.mask_token":
        return np.zeros(shape, dtype=np.float32)
    scale, offset = scale_offset(key, shape)
    state = fnv1a64(key.encode("utf-8")) ^ ((seed * GOLDEN) & M64)
    u = _splitmix_u(state, n)
    v = (u * scale).astype(np.float32)  # f32 * f32 -> f32
    v = (v + offset).astype(np.float32)
    return v.reshape(shape)


HEADS = ("points_head", "normal_head", "mask_head")


def shape_geometry(sd: dict) -> None:
    """Apply the in-place geometry edits (rule 2 of the module docstring)."""
    f = np.float32
    # number of levels from the neck input blocks present
    L = max(int(k.split(".")[2]) for k in sd if k.startswith("neck.input_blocks."))
    R = L - 1

    w = sd[f"neck.input_blocks.{L}.weight"]
    w[0, :, 0, 0] = 0.0
    w[1, :, 0, 0] = 0.0
    w[0, 0, 0, 0] = 1.0
    w[1, 1, 0, 0] = 1.0
    sd[f"neck.input_blocks.{L}.bias"][0:2] = 0.0
    sd[f"neck.resamplers.{R}.1.weight"] *= f(0.01)
    sd[f"neck.resamplers.{R}.1.bias"] *= f(0.01)

    for H in HEADS:
        if f"{H}.input_blocks.{L}.weight" not in sd:
            continue
        w = sd[f"{H}.input_blocks.{L}.weight"]
        w[0, :, 0, 0] = 0.0
        w[1, :, 0, 0] = 0.0
        w[0, 0, 0, 0] = 1.0
        w[1, 1, 0, 0] = 1.0
        sd[f"{H}.input_blocks.{L}.bias"][0:2] = 0.0
        sd[f"{H}.resamplers.{R}.1.weight"] *= f(0.01)
        sd[f"{H}.resamplers.{R}.1.bias"] *= f(0.01)

    if f"points_head.output_blocks.{L}.weight" in sd:
        w = sd[f"points_head.output_blocks.{L}.weight"]
        w *= f(0.01)
        w[0, 0, 0, 0] += f(0.5)
        w[1, 1, 0, 0] += f(0.5)
        w[2, 0, 0, 0] += f(0.3)
        w[2, 1, 0, 0] += f(0.2)
        sd[f"points_head.output_blocks.{L}.bias"][:] = np.array([0.0, 0.0, 1.0], dtype=np.float32)

    if f"mask_head.output_blocks.{L}.weight" in sd:
        w = sd[f"mask_head.output_blocks.{L}.weight"]
        w *= f(0.01)
        w[0, 0, 0, 0] += f(20.0)
        sd[f"mask_head.output_blocks.{L}.bias"][:] = np.array([3.0], dtype=np.float32)

    scale_keys = [k for k in sd if k.startswith("scale_head.") and k.endswith(".weight")]
    if scale_keys:
        K = max(int(k.split(".")[1]) for k in scale_keys)
        sd[f"scale_head.{K}.weight"] *= f(0.1)
        sd[f"scale_head.{K}.bias"][:] = 0.0

    for k, v in sd.items():
        assert v.dtype == np.float32, k


def keys_and_shapes(config: dict = None, model=None) -> list[tuple[str, tuple]]:
    """Keys/shapes of MoGeModel(**config).state_dict(), in state-dict order (needs the upstream package).

    Pass an already constructed ``model`` to avoid building one. Backbone names not known to upstream (e.g. the tiny
    ``dinov2_vitt14`` of the test fixtures) must be registered by the caller first
    (see make_fixtures.register_tiny_backbone)."""
    if model is None:
        import copy
        from moge.model.v2 import MoGeModel

        model = MoGeModel(**copy.deepcopy(config))
    return [(k, tuple(v.shape)) for k, v in model.state_dict().items()]


def synth_state_dict(config: dict, seed: int, shape_geometry: bool = True, keys=None) -> dict:
    """Full synthetic state dict {key: float32 ndarray} for ``MoGeModel(**config)``.

    ``shape_geometry=False`` is the "pure_random" variant."""
    if keys is None:
        keys = keys_and_shapes(config)
    sd = {k: synth_tensor(k, s, seed) for k, s in keys}
    if shape_geometry:
        _apply_shaping(sd)  # the module-level shape_geometry(), shadowed here by the flag
    return sd


_apply_shaping = shape_geometry


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    from make_fixtures import CHECKPOINTS, register_tiny_backbone

    name = sys.argv[1] if len(sys.argv) > 1 else "tiny_normal"
    ck = CHECKPOINTS[name]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    sd = synth_state_dict(ck["config"], 7, shape_geometry=ck["shaped"])
    n = 0
    for k, v in sd.items():
        n += v.size
        print(f"{k:60s} {str(v.shape):20s} mean={v.mean():+.4f} std={v.std():.4f}")
    print(f"{len(sd)} tensors, {n} values")
