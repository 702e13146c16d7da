"""Build the MoGe-3 test fixtures under tests/fixtures/moge3/ (a tiny checkpoint + reference outputs).

Run from the repository root with the Python reference venv of ``tests/make_fixtures.py`` active
(torch, numpy, opencv-python-headless 4.10.0.84, dlr-moge 2.0.0, dlr-utils3d 1.3; see that file)::

    OMP_NUM_THREADS=2 python tests/make_moge3_fixtures.py

and, to also check the float64 refiner below against the MLX port (mlx-vlm 0.7.10,
``mlx_vlm/models/moge3/refiner.py``), a second venv that the script calls in a subprocess::

    python3 -m venv venv-mlx && venv-mlx/bin/pip install "mlx[cpu]" mlx-vlm==0.7.10 numpy
    OMP_NUM_THREADS=2 python tests/make_moge3_fixtures.py --check-mlx --mlx-python venv-mlx/bin/python

CI runs neither; the outputs are committed. Everything is seeded: running twice gives identical array
contents (and an identical checkpoint and summary.json).

Why a reference of our own: upstream's MoGe-3 (``moge/model/v3.py``) needs FlexGEMM (Triton/CUDA) for its
sparse refiner and is not on PyPI, so it cannot run here. The reference is therefore assembled from
  * the MoGe-2 network of dlr-moge 2.0.0 (``moge.model.v2.MoGeModel``, remap_output='exp'): its own encoder,
    neck, heads and scale head modules, called in the order of v3's ``forward``;
  * ``refine_f64`` below: a float64 numpy implementation of the sparse 3D U-Net refiner (``Sparse3DUNet``),
    checked against the MLX port with ``--check-mlx`` (figures in summary.json);
  * torch code that mirrors v3's resize / remap / ``infer`` per refinement step, calling dlr-moge's
    ``recover_focal_shift`` and utils3d's ``intrinsics_from_focal_center`` / ``depth_map_to_point_map``,
    exactly as dlr-moge's v2 ``infer`` does for its single point map.
One difference from a float32 refiner: each refinement step computes ``logz_new = f32(f64(logz) + out_f64)``,
i.e. the correction is evaluated in float64 and the sum is rounded once to float32 (as torch rounds its
f32 + f32 sum). The voxel topology of step s+1 depends on these rounded values.

What it writes (all CPU, fp32 network, ``model.eval()``, ``torch.set_num_threads(2)``):

* ``fixtures/moge3/tiny_moge3.pt``: ``torch.save({'model_config': cfg, 'model': state_dict}, path)``, a plain dict
  of float32 tensors in upstream's model.pt format. cfg = make_fixtures' ``tiny_vitl`` config (``BASE``; its
  smallest with shaped geometry, no normal head) without its ``remap_output`` key (v3 forces 'exp') plus
  ``refiner`` (see ``REFINER_CONFIG``) and ``refiner_depth_resolution`` 256. Weights: tiny_vitl's
  (``synth_numpy_state_dict('tiny_vitl')``, the same values as fixtures/tiny_vitl.pt) plus 86 ``refiner.*`` tensors from ``refiner_state_dict``
  (numpy default_rng(REFINER_SEED); PyTorch-default-like uniform init, LayerNorm weight 1 + 0.1 N(0,1),
  bias 0.1 N(0,1), out_proj scaled by OUT_PROJ_SCALE so the log-depth correction is non-trivial).
  Uses the test-only backbone ``dinov2_vitt14`` of make_fixtures.py (E=64, depth 4, 1 head).
* ``fixtures/moge3/<case>.npz`` for the cases in ``CASES`` (image from fixtures/images/, loaded as the upstream
  CLI does). H, W = image size; h, w = head size = 16 * grid; S = refine_steps. Keys (float32 unless noted):
    image_u8 (H,W,3 u8), num_tokens () i64, refine_steps () i64, fov_x () (nan = none), grid (2,) i64
    (base_h, base_w);
    points (H,W,3), depth (H,W), mask (H,W u8), intrinsics (3,3): infer()'s final outputs
    (points/depth inf where mask is 0);
    points_{s}, depth_{s}, intrinsics_{s}, mask_{s} (u8), s = 0..S: infer()'s per-step outputs
    (return_per_step=True; step 0 = unrefined; each masked with its own mask_{s}); focal_{s}, shift_{s}: the
    focal and shift they used, and focal_converged_{s}, shift_converged_{s}: the same solve run to convergence
    (``converged_solver``);
    raw_coord_0 (3,h,w): the points head's (x/z, y/z, log z) at head resolution; raw_logz_{s} (h,w), s = 1..S:
    its log z after step s (x/z and y/z are unchanged);
    voxels_{s} (5,) i64, s = 0..S-1: active voxels per refiner level in refinement step s;
    enc_map (C,base_h,base_w): F0 = encoder features ++ uv (the refiner's encoder_feature, channel-first);
    fwd_mask (H,W): forward()'s mask (after resize + sigmoid); metric_scale () (after exp).
  Case m3_rgb_60 also holds the refiner in isolation for step 0:
    iso_coords (M,4) i32 (b,i,j,z) (the features are raw_coord_0 channel-last), iso_shape (4,) i64 (B,H,W,Z), iso_out (M,) f64
    (refine_f64's output), iso_level_counts (5,) i64.
* ``fixtures/moge3/tiny_moge3_swiglu.pt``: the same with a SwiGLU FFN in the backbone (what MoGe-3 ViT-g's
  ``dinov2_vitg14`` has, ``ffn_layer="swiglufused"``): cfg = tiny_moge3's with the backbone renamed
  ``dinov2_vitt14_swiglu`` (see ``register_swiglu_backbone``); weights = tiny_moge3's (the same refiner) less the
  blocks' ``mlp.fc1.*`` / ``mlp.fc2.*``, plus ``encoder.backbone.blocks.N.mlp.w12.{weight,bias}`` (2 * 176, 64)
  and ``...mlp.w3.{weight,bias}`` (64, 176) (hidden = (int(4E * 2 / 3) + 7) // 8 * 8 = 176 for E = 64) from
  numpy default_rng(SWIGLU_SEED), uniform +-1/sqrt(fan_in) (PyTorch's default Linear init, bias included).
  Its cases (``SWIGLU_CASES``, prefix m3g_) have the keys above (no iso_*). Without xformers dlr-moge's
  ``SwiGLUFFNFused`` is the plain ``SwiGLUFFN`` (w3(silu(x1) * x2), x1, x2 = w12(x).chunk(2)); summary.json
  records the class that ran.
* ``fixtures/moge3/fullsize_refiner.npz``: the refiner alone at the released ViT-L widths
  (``FULLSIZE_REFINER_CONFIG``: encoder_channels 1026, model_channels [32, 64, 128, 256, 512]), on ISO_CASE's
  step-0 voxels. Weights (not stored): ``synth_weights.synth_tensor(key, shape, 7)`` for every (key, shape) of
  ``refiner_keys_and_shapes`` (unshaped); summary.json["fullsize_refiner"] holds their sha256 (whole and per
  tensor) and sums. Keys: coords (M,4) i32, feats (M,3) f32 (= iso_coords / raw_coord_0 channel-last),
  shape (4,) i64, enc_map (1026,7,9) f32 = f32(sin(0.37 c + 1.3 y + 0.71 x)) (float64 inside), out (M,) f64
  (refine_f64), level_counts (5,) i64, w_probe (2,8) f32 (first 8 values of FULLSIZE_PROBES' tensors), seed () i64.
* ``fixtures/moge3/summary.json``: per case statistics (voxel counts, std of each step's correction, focal,
  mask fraction, ...), sizes and the refiner-vs-MLX figures (kept from an earlier ``--check-mlx`` run only when
  the refiner weights and inputs are unchanged; re-run with the flag otherwise).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_fixtures as mf  # noqa: E402

OUT = mf.FIX / "moge3"
REFINER_SEED = 3003
# out_proj weight and bias are multiplied by this after the default init (chosen by hand so the per-step
# log-depth correction has a std of a few hundredths on the fixture images; summary.json has the values).
OUT_PROJ_SCALE = 0.5
LN_EPS = 1e-6

torch.set_num_threads(2)

REFINER_CONFIG = {
    "in_channels": 3, "out_channels": 1, "encoder_channels": None,  # dim_out + 2, filled in by moge3_config
    "model_channels": [8, 16, 16, 24, 32], "encoder_blocks_per_level": 1, "decoder_blocks_per_level": 1,
    "bottleneck_blocks": 1, "downsample_factors": [2, 2, 2, 2], "encoder_downsample": 16,
}

CASES = [
    # name, image, num_tokens, fov_x, refine_steps
    ("m3_rgb_60", "rgb_64x48.png", 60, None, 3),
    ("m3_portrait_80_fov", "rgb_40x72.png", 80, 60.0, 2),
    ("m3_rgb_60_steps0", "rgb_64x48.png", 60, None, 0),
    ("m3_gray_48_steps1", "gray_50x50.png", 48, None, 1),
]
ISO_CASE = "m3_rgb_60"
# The MoGe-2 part: make_fixtures' smallest checkpoint with shaped geometry (no normal head).
BASE = "tiny_vitl"

# The SwiGLU variant (tiny_moge3_swiglu.pt): test-only backbone name and the seed of its w12/w3 tensors.
SWIGLU_BACKBONE = "dinov2_vitt14_swiglu"
SWIGLU_SEED = 3004
SWIGLU_CASES = [
    ("m3g_rgb_60", "rgb_64x48.png", 60, None, 2),
    ("m3g_rgb_60_steps0", "rgb_64x48.png", 60, None, 0),
]

# The refiner alone at the released MoGe-3 ViT-L widths (fullsize_refiner.npz): config, synth_weights seed.
FULLSIZE_REFINER_CONFIG = {
    "in_channels": 3, "out_channels": 1, "encoder_channels": 1026,
    "model_channels": [32, 64, 128, 256, 512], "encoder_blocks_per_level": 1, "decoder_blocks_per_level": 1,
    "bottleneck_blocks": 1, "downsample_factors": [2, 2, 2, 2], "encoder_downsample": 16,
}
FULLSIZE_SEED = 7
FULLSIZE_PROBES = ("refiner.down_stages.0.0.conv1.weight", "refiner.out_proj.weight")


# ----------------------------------------------------------------------------------------------------------------
# the focal/shift solve run to convergence

@contextlib.contextmanager
def converged_solver():
    """Upstream's solve (``scipy.optimize.least_squares``, LM) with its tolerances at 1e-15 instead of ftol 1e-3:
    on some point maps SciPy stops early enough to leave focal/shift ~1e-4 off the optimum (seen on m3_rgb_60
    step 3: focal 2.00210 vs 2.00232), which an engine solving to convergence cannot match. The cases store both."""
    import scipy.optimize as so
    orig = so.least_squares

    def tight(*a, **k):
        k.update(ftol=1e-15, xtol=1e-15, gtol=1e-15)
        return orig(*a, **k)

    so.least_squares = tight
    try:
        yield
    finally:
        so.least_squares = orig


# ----------------------------------------------------------------------------------------------------------------
# config and weights

def moge3_config(backbone: str = None) -> dict:
    cfg = copy.deepcopy(mf.CHECKPOINTS[BASE]["config"])
    del cfg["remap_output"]
    if backbone is not None:
        cfg["encoder"]["backbone"] = backbone
    ref = copy.deepcopy(REFINER_CONFIG)
    ref["encoder_channels"] = cfg["encoder"]["dim_out"] + 2
    cfg["refiner"] = ref
    cfg["refiner_depth_resolution"] = 256
    return cfg


def refiner_keys_and_shapes(rcfg: dict) -> list:
    """(key, shape) of the refiner's tensors, upstream names, in module order. Linear weights (out, in),
    submanifold conv weights (Co, 3, 3, 3, Ci)."""
    ch = rcfg["model_channels"]
    n = len(ch)
    c4 = ch[-1]
    out = []

    def lin(name, i, o):
        out.append((f"refiner.{name}.weight", (o, i)))
        out.append((f"refiner.{name}.bias", (o,)))

    def block(name, c):
        out.append((f"refiner.{name}.norm1.weight", (c,)))
        out.append((f"refiner.{name}.norm1.bias", (c,)))
        for conv in ("conv1", "conv2"):
            out.append((f"refiner.{name}.{conv}.weight", (c, 3, 3, 3, c)))
            out.append((f"refiner.{name}.{conv}.bias", (c,)))

    lin("input_proj", rcfg["in_channels"], ch[0])
    lin("encoder_fuse", rcfg["encoder_channels"], c4)
    lin("fuse_proj.0", 2 * c4, c4)
    lin("fuse_proj.2", c4, c4)
    for k in range(n):
        block(f"down_stages.{k}.0", ch[k])
    for k in range(n - 1):
        lin(f"downsample_blocks.{k}.linear", ch[k], ch[k + 1])
    block("bottleneck_stage.0", c4)
    for i in range(n - 1):
        lin(f"upsample_blocks.{i}.linear", ch[n - 1 - i], ch[n - 2 - i])
    for i in range(n - 1):
        block(f"up_stages.{i}.0", ch[n - 2 - i])
    lin("out_proj", ch[0], rcfg["out_channels"])
    return out


def refiner_state_dict(rcfg: dict) -> dict:
    rng = np.random.default_rng(REFINER_SEED)
    shapes = dict(refiner_keys_and_shapes(rcfg))
    sd = {}
    for key, shape in shapes.items():
        if ".norm1." in key:
            base = 1.0 if key.endswith(".weight") else 0.0
            v = base + 0.1 * rng.standard_normal(shape)
        else:
            wshape = shapes[key.rsplit(".", 1)[0] + ".weight"]
            fan_in = int(np.prod(wshape[1:]))  # Linear: in; conv: 27 * Ci
            bound = 1.0 / math.sqrt(fan_in)
            v = rng.uniform(-bound, bound, shape)
            if key.startswith("refiner.out_proj."):
                v = v * OUT_PROJ_SCALE
        sd[key] = v.astype(np.float32)
    assert len(sd) == 86, len(sd)
    return sd


def v2_config(cfg: dict) -> dict:
    v2cfg = {k: v for k, v in copy.deepcopy(cfg).items() if k not in ("refiner", "refiner_depth_resolution")}
    v2cfg["remap_output"] = "exp"
    return v2cfg


def build_v2_model(cfg: dict, sd_np: dict):
    """dlr-moge's MoGe-2 MoGeModel for the non-refiner part (remap_output='exp', strict load)."""
    ck = mf.CHECKPOINTS[BASE]
    mf.register_tiny_backbone(ck["embed_dim"], ck["depth"])
    register_swiglu_backbone(ck["embed_dim"], ck["depth"])
    return mf.build_model(v2_config(cfg), {k: v for k, v in sd_np.items() if not k.startswith("refiner.")})


def register_swiglu_backbone(embed_dim: int, depth: int) -> None:
    """Define ``moge.model.dinov2.hub.backbones.dinov2_vitt14_swiglu``: make_fixtures' ``dinov2_vitt14`` with the
    FFN of the published ``dinov2_vitg14`` (``ffn_layer="swiglufused"``)."""
    mf.register_tiny_backbone(embed_dim, depth, name=SWIGLU_BACKBONE, ffn_layer="swiglufused")


def swiglu_hidden(embed_dim: int) -> int:
    """SwiGLUFFNFused's hidden width for the block's hidden_features = 4E."""
    return (int(4 * embed_dim * 2 / 3) + 7) // 8 * 8


def swiglu_v2_state_dict(cfg: dict) -> tuple:
    """The MoGe-2 part of tiny_moge3_swiglu.pt, in MoGeModel state-dict order: tiny_vitl's tensors less the
    blocks' mlp.fc1/fc2, plus mlp.w12/w3 from default_rng(SWIGLU_SEED). Returns (state dict, new keys)."""
    from synth_weights import keys_and_shapes

    base = mf.synth_numpy_state_dict(BASE)
    ck = mf.CHECKPOINTS[BASE]
    register_swiglu_backbone(ck["embed_dim"], ck["depth"])
    shapes = keys_and_shapes(v2_config(cfg))
    hid, e = swiglu_hidden(ck["embed_dim"]), ck["embed_dim"]
    rng = np.random.default_rng(SWIGLU_SEED)
    sd, new = {}, []
    for key, shape in shapes:
        if ".mlp.w12." in key or ".mlp.w3." in key:
            wshape = dict(shapes)[key.rsplit(".", 1)[0] + ".weight"]
            bound = 1.0 / math.sqrt(wshape[1])
            sd[key] = rng.uniform(-bound, bound, shape).astype(np.float32)
            new.append(key)
        else:
            assert base[key].shape == shape, key
            sd[key] = base[key]
    dropped = sorted(set(base) - set(sd))
    assert all(".mlp.fc1." in k or ".mlp.fc2." in k for k in dropped) and len(dropped) == 4 * ck["depth"], dropped
    assert len(new) == 4 * ck["depth"], new
    for n in range(ck["depth"]):
        pre = f"encoder.backbone.blocks.{n}.mlp."
        assert sd[pre + "w12.weight"].shape == (2 * hid, e) and sd[pre + "w12.bias"].shape == (2 * hid,)
        assert sd[pre + "w3.weight"].shape == (e, hid) and sd[pre + "w3.bias"].shape == (e,)
    return sd, new


def check_swiglu_ffn(model, sd: dict) -> dict:
    """What FFN class runs in the backbone, and that it computes w3(silu(x1) * x2) (float64 numpy)."""
    mlp = model.encoder.backbone.blocks[0].mlp
    pre = "encoder.backbone.blocks.0.mlp."
    w = {k: sd[pre + k].astype(np.float64) for k in ("w12.weight", "w12.bias", "w3.weight", "w3.bias")}
    x = np.random.default_rng(0).standard_normal((5, w["w12.weight"].shape[1])).astype(np.float32)
    with torch.inference_mode():
        y = mlp(torch.from_numpy(x)).numpy().astype(np.float64)
    x12 = x.astype(np.float64) @ w["w12.weight"].T + w["w12.bias"]
    x1, x2 = np.split(x12, 2, axis=-1)
    ref = (_silu(x1) * x2) @ w["w3.weight"].T + w["w3.bias"]
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    assert err < 1e-5, err
    from moge.model.dinov2.layers import swiglu_ffn
    cls = type(mlp)
    return {"class": f"{cls.__module__}.{cls.__qualname__}",
            "mro": [c.__qualname__ for c in cls.__mro__[1:-1]],
            "forward": type(mlp).forward.__qualname__,
            "xformers_available": bool(swiglu_ffn.XFORMERS_AVAILABLE),
            "hidden": int(mlp.w3.in_features), "max_rel_err_vs_f64": err}


# ----------------------------------------------------------------------------------------------------------------
# float64 refiner

_TAPS = [(a - 1, b - 1, c - 1) for a in range(3) for b in range(3) for c in range(3)]  # tap v = 9a + 3b + c


def _keys(coords: np.ndarray, shape) -> np.ndarray:
    _, H, W, Z = shape
    return ((coords[:, 0] * H + coords[:, 1]) * W + coords[:, 2]) * Z + coords[:, 3]


def _neighbours(coords: np.ndarray, shape) -> list:
    """Per tap: (rows, src) index pairs: output row rows[n] reads input row src[n] (active, in bounds)."""
    _, H, W, Z = shape
    keys = _keys(coords, shape)
    assert keys.size == 0 or np.all(keys[1:] > keys[:-1]), "coords must be unique and in raster order"
    b, i, j, z = (coords[:, c] for c in range(4))
    out = []
    for di, dj, dz in _TAPS:
        ni, nj, nz = i + di, j + dj, z + dz
        inb = (ni >= 0) & (ni < H) & (nj >= 0) & (nj < W) & (nz >= 0) & (nz < Z)
        nk = ((b * H + ni) * W + nj) * Z + nz
        pos = np.minimum(np.searchsorted(keys, nk), keys.size - 1)
        hit = inb & (keys[pos] == nk)
        rows = np.nonzero(hit)[0]
        out.append((rows, pos[rows]))
    return out


def _linear(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    return x @ w[name + ".weight"].T + w[name + ".bias"]


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def _layer_norm(w: dict, name: str, x: np.ndarray) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    d = x - mu
    var = (d * d).mean(axis=-1, keepdims=True)
    return d / np.sqrt(var + LN_EPS) * w[name + ".weight"] + w[name + ".bias"]


def _subm_conv(w: dict, name: str, x: np.ndarray, nbr: list) -> np.ndarray:
    weight = w[name + ".weight"]  # (Co, 3, 3, 3, Ci)
    co, ci = weight.shape[0], weight.shape[-1]
    taps = weight.reshape(co, 27, ci)
    out = np.empty((x.shape[0], co), np.float64)
    out[:] = w[name + ".bias"]
    for t, (rows, src) in enumerate(nbr):
        if rows.size:
            out[rows] += x[src] @ taps[:, t, :].T
    return out


def _res_block(w: dict, name: str, x: np.ndarray, nbr: list) -> np.ndarray:
    h = _silu(_layer_norm(w, name + ".norm1", x))
    h = _subm_conv(w, name + ".conv1", h, nbr)
    h = _silu(h)
    h = _subm_conv(w, name + ".conv2", h, nbr)
    return h + x


def _pool_topology(coords: np.ndarray, shape):
    """2x2x2 parents: (parent coords in raster order, parent shape, parent index per child, child count per parent)."""
    B, H, W, Z = shape
    pshape = (B, -(-H // 2), -(-W // 2), -(-Z // 2))
    half = coords.copy()
    half[:, 1:] //= 2
    uk, parent, counts = np.unique(_keys(half, pshape), return_inverse=True, return_counts=True)
    _, H2, W2, Z2 = pshape
    pz = uk % Z2
    r = uk // Z2
    pj = r % W2
    r //= W2
    pi = r % H2
    pb = r // H2
    return np.stack([pb, pi, pj, pz], axis=1), pshape, parent.reshape(-1), counts


def _pool_mean(x: np.ndarray, parent: np.ndarray, counts: np.ndarray) -> np.ndarray:
    order = np.argsort(parent, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    return np.add.reduceat(x[order], starts, axis=0) / counts[:, None]


def refine_f64(weights: dict, feats: np.ndarray, coords: np.ndarray, shape, enc: np.ndarray,
               return_levels: bool = False):
    """MoGe-3's ``Sparse3DUNet`` in float64 (numpy).

    weights: the refiner's tensors, keys with or without the ``refiner.`` prefix (cast to float64);
    feats (M, 3) (x/z, y/z, logz) (cast to float64); coords (M, 4) (b, i, j, z), unique, in raster order;
    shape (B, H, W, Z); enc (B, C, H/16, W/16): F0, channel-first as torch holds it.
    Returns out (M,) float64 (the log-depth correction) [, voxel counts per level (n_levels,) int64].
    """
    w = {k[len("refiner."):] if k.startswith("refiner.") else k: np.asarray(v, np.float64)
         for k, v in weights.items() if not k.startswith(("encoder.", "neck.", "points_head.", "normal_head.",
                                                          "mask_head.", "scale_head."))}
    n_levels = sum(1 for k in w if k.startswith("down_stages.") and k.endswith(".0.norm1.weight"))
    x = np.asarray(feats, np.float64)
    coords = np.asarray(coords, np.int64)
    shape = tuple(int(s) for s in shape)
    enc = np.asarray(enc, np.float64)
    B, H, W, _ = shape
    assert enc.shape[0] == B and H == enc.shape[2] * 2 ** (n_levels - 1) and W == enc.shape[3] * 2 ** (n_levels - 1)

    x = _linear(w, "input_proj", x)
    nbrs, skips, parents, counts_per_level = [], [], [], []
    for k in range(n_levels):
        nbr = _neighbours(coords, shape)
        nbrs.append(nbr)
        counts_per_level.append(coords.shape[0])
        x = _res_block(w, f"down_stages.{k}.0", x, nbr)
        if k < n_levels - 1:
            skips.append(x)
            coords, shape, parent, counts = _pool_topology(coords, shape)
            parents.append(parent)
            x = _linear(w, f"downsample_blocks.{k}.linear", _pool_mean(x, parent, counts))

    enc_cl = np.moveaxis(enc, 1, -1)  # (B, h, w, C)
    e = _linear(w, "encoder_fuse", enc_cl[coords[:, 0], coords[:, 1], coords[:, 2]])
    x = np.concatenate([x, e], axis=-1)
    x = _linear(w, "fuse_proj.2", _silu(_linear(w, "fuse_proj.0", x)))
    x = _res_block(w, "bottleneck_stage.0", x, nbrs[-1])
    for i in range(n_levels - 1):
        lvl = n_levels - 2 - i
        x = _linear(w, f"upsample_blocks.{i}.linear", x)[parents[lvl]] + skips[lvl]
        x = _res_block(w, f"up_stages.{i}.0", x, nbrs[lvl])
    out = _linear(w, "out_proj", x)
    assert out.shape[1] == 1
    out = out[:, 0]
    if return_levels:
        return out, np.array(counts_per_level, dtype=np.int64)
    return out


# ----------------------------------------------------------------------------------------------------------------
# the MoGe-3 reference (v3 forward / infer mirrored)

def voxelize(current: torch.Tensor, depth_resolution):
    """v3 ``_voxelize``: current (B, H, W, 3) f32 (x/z, y/z, logz) -> feats (M,3) f32, coords (M,4) i32, shape."""
    bsz, height, width, _ = current.shape
    logz = current[..., 2].float()
    zq = torch.round(logz * depth_resolution).long()  # round half to even
    z_idx = zq - zq.amin(dim=(1, 2), keepdim=True)
    z_extent = int(z_idx.amax().item()) + 1
    b, i, j = torch.meshgrid(torch.arange(bsz), torch.arange(height), torch.arange(width), indexing="ij")
    coords = torch.stack([b, i, j, z_idx], dim=-1).reshape(-1, 4).to(torch.int32)
    feats = current.reshape(-1, 3).float()
    return feats.numpy().copy(), coords.numpy().copy(), (bsz, height, width, z_extent), logz


def run_moge3(model, refiner_w: dict, cfg: dict, image: torch.Tensor, num_tokens: int, refine_steps: int,
              fov_x=None, force_projection: bool = True, apply_mask: bool = True) -> dict:
    """v3 ``forward`` + ``infer(return_per_step=True)`` on image (B, 3, H, W), the refiner through refine_f64."""
    from moge.utils.geometry_torch import normalized_view_plane_uv, recover_focal_shift
    import utils3d

    batch_size, _, img_h, img_w = image.shape
    aspect_ratio = img_w / img_h
    base_h, base_w = round((num_tokens / aspect_ratio) ** 0.5), round((num_tokens * aspect_ratio) ** 0.5)
    rec = {"calls": []}
    with torch.inference_mode():
        # forward
        features, cls_token = model.encoder(image, base_h, base_w, return_class_token=True)
        features = [features, None, None, None, None]
        for level in range(5):
            uv = normalized_view_plane_uv(width=base_w * 2 ** level, height=base_h * 2 ** level,
                                          aspect_ratio=aspect_ratio, dtype=image.dtype, device=image.device)
            uv = uv.permute(2, 0, 1).unsqueeze(0).expand(batch_size, -1, -1, -1)
            features[level] = uv if features[level] is None else torch.concat([features[level], uv], dim=1)
        neck = model.neck(features)
        raw_coord = model.points_head(neck)[-1]
        normal = model.normal_head(neck)[-1] if hasattr(model, "normal_head") else None
        mask = model.mask_head(neck)[-1]
        metric_scale = model.scale_head(cls_token)

        f0 = features[0].float().numpy().copy()
        current = raw_coord.permute(0, 2, 3, 1).float()
        coord_per_step = [current]
        for _ in range(refine_steps):
            feats, coords, shape, logz = voxelize(current, cfg["refiner_depth_resolution"])
            out, counts = refine_f64(refiner_w, feats, coords, shape, f0, return_levels=True)
            t = (logz * cfg["refiner_depth_resolution"]).numpy().astype(np.float64)  # the f32 product
            margin = np.abs(np.abs(t - np.floor(t) - 0.5))  # distance (in bins) from a rounding boundary
            rec["calls"].append(dict(feats=feats, coords=coords, shape=np.array(shape, np.int64), out=out,
                                     counts=counts, round_margin=float(margin.min()),
                                     near_boundary=int((margin < 1e-3).sum())))
            logz_new = torch.from_numpy(
                (logz.numpy().astype(np.float64) + out.reshape(logz.shape)).astype(np.float32))
            current = torch.cat([current[..., :2], logz_new.unsqueeze(-1)], dim=-1)
            coord_per_step.append(current)

        def resize(x, channel_last=False):
            return F.interpolate(x.movedim(-1, -3) if channel_last else x, (img_h, img_w), mode="bilinear",
                                 align_corners=False, antialias=False).movedim(-3, -1 if channel_last else -3)

        coords_all = torch.stack(coord_per_step, dim=1)
        n_steps = coords_all.shape[1]
        coords_all = resize(coords_all.flatten(0, 1), channel_last=True).unflatten(0, (batch_size, n_steps))
        points_all = model._remap_points(coords_all)
        affine_per_step = [p.float() for p in points_all.unbind(dim=1)]
        normal = F.normalize(resize(normal).permute(0, 2, 3, 1), dim=-1) if normal is not None else None
        mask = resize(mask).squeeze(1).sigmoid()
        metric_scale = metric_scale.squeeze(1).exp()

        # infer
        mask_binary = mask > 0.5
        if fov_x is not None:
            focal_fixed = aspect_ratio / (1 + aspect_ratio ** 2) ** 0.5 / torch.tan(
                torch.deg2rad(torch.as_tensor(fov_x, dtype=torch.float32) / 2))
            if focal_fixed.ndim == 0:
                focal_fixed = focal_fixed[None].expand(batch_size)
        else:
            focal_fixed = None
        points_ps, depth_ps, intr_ps, focal_ps, shift_ps, conv_ps = [], [], [], [], [], []
        for affine in affine_per_step:
            if focal_fixed is None:
                focal_i, shift_i = recover_focal_shift(affine, mask_binary)
                with converged_solver():
                    conv_ps.append(tuple(float(v[0]) for v in recover_focal_shift(affine, mask_binary)))
            else:
                focal_i = focal_fixed
                _, shift_i = recover_focal_shift(affine, mask_binary, focal=focal_i)
                with converged_solver():
                    conv_ps.append((float(focal_i[0]), float(recover_focal_shift(affine, mask_binary, focal=focal_i)[1][0])))
            fx_i = focal_i / 2 * (1 + aspect_ratio ** 2) ** 0.5 / aspect_ratio
            fy_i = focal_i / 2 * (1 + aspect_ratio ** 2) ** 0.5
            intr_i = utils3d.pt.intrinsics_from_focal_center(fx_i, fy_i, 0.5, 0.5)
            pts = affine.clone()
            pts[..., 2] += shift_i[..., None, None]
            depth = pts[..., 2].clone()
            if force_projection:
                pts = utils3d.pt.depth_map_to_point_map(depth, intrinsics=intr_i)
            pts = pts * metric_scale[:, None, None, None]
            depth = depth * metric_scale[:, None, None]
            points_ps.append(pts)
            depth_ps.append(depth)
            intr_ps.append(intr_i)
            focal_ps.append(float(focal_i[0]))
            shift_ps.append(float(shift_i[0]))
        mask_ps = [mask_binary & (d > 0) for d in depth_ps]
        if apply_mask:
            points_ps = [torch.where(m[..., None], p, torch.inf) for p, m in zip(points_ps, mask_ps)]
            depth_ps = [torch.where(m, d, torch.inf) for d, m in zip(depth_ps, mask_ps)]
            if normal is not None:
                normal = torch.where(mask_ps[-1][..., None], normal, torch.zeros_like(normal))

    f32 = lambda t: t.float().numpy().astype(np.float32)  # noqa: E731
    res = {
        "grid": np.array([base_h, base_w], dtype=np.int64),
        "points": f32(points_ps[-1][0]), "depth": f32(depth_ps[-1][0]),
        "mask": mask_ps[-1][0].numpy().astype(np.uint8),
        "intrinsics": f32(intr_ps[-1][0]),
    }
    if normal is not None:
        res["normal"] = f32(normal[0])
    for s in range(n_steps):
        res[f"points_{s}"] = f32(points_ps[s][0])
        res[f"depth_{s}"] = f32(depth_ps[s][0])
        res[f"intrinsics_{s}"] = f32(intr_ps[s][0])
        res[f"mask_{s}"] = mask_ps[s][0].numpy().astype(np.uint8)
        # upstream's focal and shift (SciPy's LM stopped at ftol 1e-3) and the solve converged
        res[f"focal_{s}"], res[f"shift_{s}"] = np.float32(focal_ps[s]), np.float32(shift_ps[s])
        res[f"focal_converged_{s}"], res[f"shift_converged_{s}"] = np.float32(conv_ps[s][0]), np.float32(conv_ps[s][1])
        # x/z and y/z never change between steps: after step 0 only log z is kept.
        if s == 0:
            res["raw_coord_0"] = f32(coord_per_step[0][0].permute(2, 0, 1))
        else:
            res[f"raw_logz_{s}"] = f32(coord_per_step[s][0][..., 2])
    for s, call in enumerate(rec["calls"]):
        res[f"voxels_{s}"] = call["counts"]
    res["enc_map"] = f0[0].astype(np.float32)
    res["fwd_mask"] = f32(mask[0])
    res["metric_scale"] = np.float32(metric_scale[0].item())
    rec["focal"], rec["shift"] = focal_ps, shift_ps
    return res, rec


# ----------------------------------------------------------------------------------------------------------------
# MLX check (run in the MLX venv, a separate process)

MLX_HELPER = r'''
import sys
import numpy as np
import mlx.core as mx
from mlx_vlm.models.moge3.config import RefinerConfig
from mlx_vlm.models.moge3.refiner import Sparse3DUNet

src, dst = sys.argv[1], sys.argv[2]
d = np.load(src, allow_pickle=False)
import json
rcfg = json.loads(str(d["refiner_config"]))
net = Sparse3DUNet(RefinerConfig(**rcfg))
names = [k for k in d.files if k.startswith("w:")]
net.load_weights([(k[2:], mx.array(d[k])) for k in names], strict=True)
outs = {}
for c in range(int(d["n_calls"])):
    feats = mx.array(d[f"feats_{c}"])
    coords = mx.array(d[f"coords_{c}"])
    shape = tuple(int(s) for s in d[f"shape_{c}"])
    enc = mx.array(np.ascontiguousarray(np.moveaxis(d[f"enc_{c}"], 1, -1)))  # (B, h, w, C)
    out = net(feats, coords, shape, enc)
    mx.eval(out)
    outs[f"out_{c}"] = np.array(out).astype(np.float32)
np.savez(dst, **outs)
print("mlx", mx.__version__, "calls", int(d["n_calls"]))
'''


def check_mlx(mlx_python: str, rcfg: dict, refiner_w: dict, calls: list) -> dict:
    with tempfile.TemporaryDirectory() as td:
        td = Path(td)
        blob = {"refiner_config": np.array(json.dumps(rcfg)), "n_calls": np.int64(len(calls))}
        for k, v in refiner_w.items():
            blob["w:" + k[len("refiner."):]] = v
        for c, call in enumerate(calls):
            blob[f"feats_{c}"] = call["feats"]
            blob[f"coords_{c}"] = call["coords"]
            blob[f"shape_{c}"] = call["shape"]
            blob[f"enc_{c}"] = call["enc"]
        np.savez(td / "in.npz", **blob)
        (td / "helper.py").write_text(MLX_HELPER)
        p = subprocess.run([mlx_python, str(td / "helper.py"), str(td / "in.npz"), str(td / "out.npz")],
                           capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="2"))
        if p.returncode != 0:
            raise RuntimeError(f"MLX helper failed:\n{p.stdout}\n{p.stderr}")
        res = np.load(td / "out.npz")
        per_call = []
        for c, call in enumerate(calls):
            mlx_out = res[f"out_{c}"].reshape(-1).astype(np.float64)
            ref = call["out"]
            diff = np.abs(mlx_out - ref)
            per_call.append({
                "case": call["case"], "step": call["step"], "voxels": int(ref.size),
                "max_abs_diff": float(diff.max()), "max_abs_ref": float(np.abs(ref).max()),
                "max_abs_diff_over_max_abs_ref": float(diff.max() / np.abs(ref).max()),
                "max_rel_err": float((diff / np.maximum(np.abs(ref), 1e-30)).max()),
                "rel_err_p99": float(np.quantile(diff / np.maximum(np.abs(ref), 1e-30), 0.99)),
            })
    return {"mlx_helper_stdout": p.stdout.strip(), "calls": per_call,
            "worst_max_abs_diff_over_max_abs_ref": max(c["max_abs_diff_over_max_abs_ref"] for c in per_call),
            "worst_max_rel_err": max(c["max_rel_err"] for c in per_call)}


# ----------------------------------------------------------------------------------------------------------------

def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        h.update(str(a.dtype).encode() + str(a.shape).encode() + a.tobytes())
    return h.hexdigest()


def run_cases(model, sd_ref: dict, cfg: dict, cases: list, checkpoint: str = None):
    """Run and write the cases of one checkpoint: (summary entries, refiner calls, steps-0 vs v2 infer figures)."""
    entries, calls, steps0 = [], [], {}
    for name, img, num_tokens, fov_x, steps in cases:
        image_u8, tensor = mf.load_image(mf.FIX / "images" / img)
        res, rec = run_moge3(model, sd_ref, cfg, tensor[None], num_tokens, steps, fov_x=fov_x)
        case = {
            "image_u8": image_u8.astype(np.uint8), "num_tokens": np.int64(num_tokens),
            "refine_steps": np.int64(steps), "fov_x": np.float32(np.nan if fov_x is None else fov_x), **res,
        }
        if name == ISO_CASE:
            c0 = rec["calls"][0]
            case.update(iso_coords=c0["coords"].astype(np.int32),
                        iso_shape=c0["shape"].astype(np.int64), iso_out=c0["out"].astype(np.float64),
                        iso_level_counts=c0["counts"].astype(np.int64))
        if steps == 0:
            # refine_steps 0 must be MoGe-2's infer of the same weights (dlr-moge v2, same code path)
            ref = model.infer(tensor, num_tokens=num_tokens, fov_x=fov_x, use_fp16=False)
            m = ref["mask"].numpy()
            assert np.array_equal(m.astype(np.uint8), case["mask"])
            for k in ("points", "depth", "intrinsics", "normal"):
                if k not in ref or ref[k] is None:
                    continue
                a, b = ref[k].numpy(), case[k]
                fin = np.isfinite(a)
                assert np.array_equal(fin, np.isfinite(b)), k
                err = float(np.abs(a[fin] - b[fin]).max() / max(np.abs(a[fin]).max(), 1e-30))
                assert err <= 1e-6, (k, err)
                steps0[k] = err
        for s, c in enumerate(rec["calls"]):
            calls.append(dict(case=name, step=s, enc=case["enc_map"][None],
                              **{k: c[k] for k in ("feats", "coords", "shape", "out")}))
        np.savez_compressed(OUT / f"{name}.npz", **case)
        fm = case["fwd_mask"].astype(np.float64)
        entry = {
            "case": name, "image": f"images/{img}", "num_tokens": num_tokens, "fov_x": fov_x, "refine_steps": steps,
            "grid": [int(x) for x in res["grid"]], "head_hw": list(res["raw_coord_0"].shape[1:]),
            "voxels_per_level": [[int(x) for x in c["counts"]] for c in rec["calls"]],
            "z_extent": [int(c["shape"][3]) for c in rec["calls"]],
            "round_margin_bins": [c["round_margin"] for c in rec["calls"]],
            "pixels_within_1e-3_bins_of_rounding_boundary": [c["near_boundary"] for c in rec["calls"]],
            "correction_std": [float(c["out"].std()) for c in rec["calls"]],
            "correction_mean": [float(c["out"].mean()) for c in rec["calls"]],
            "correction_absmax": [float(np.abs(c["out"]).max()) for c in rec["calls"]],
            "focal": rec["focal"], "shift": rec["shift"],
            "mask_frac": [float(case[f"mask_{s}"].mean()) for s in range(steps + 1)],
            "mask_margin": float(np.abs(fm - 0.5).min()),
            "metric_scale": float(case["metric_scale"]),
            "file_bytes": (OUT / f"{name}.npz").stat().st_size,
            "keys": sorted(case.keys()),
        }
        if checkpoint is not None:
            entry = {"case": name, "checkpoint": checkpoint, **entry}
        entries.append(entry)
        print(json.dumps({k: v for k, v in entry.items() if k != "keys"}))
    return entries, calls, steps0


def fullsize_refiner_weights() -> dict:
    """The refiner's tensors at FULLSIZE_REFINER_CONFIG: synth_weights' rule, seed FULLSIZE_SEED, unshaped."""
    from synth_weights import synth_tensor

    return {k: synth_tensor(k, shape, FULLSIZE_SEED) for k, shape in refiner_keys_and_shapes(FULLSIZE_REFINER_CONFIG)}


def fullsize_enc_map(channels: int, h: int, w: int) -> np.ndarray:
    """enc[c, y, x] = f32(sin(0.37 c + 1.3 y + 0.71 x)), the argument and sine in float64 (sums left to right)."""
    c, y, x = np.meshgrid(np.arange(channels, dtype=np.float64), np.arange(h, dtype=np.float64),
                          np.arange(w, dtype=np.float64), indexing="ij")
    return np.sin(0.37 * c + 1.3 * y + 0.71 * x).astype(np.float32)


def write_fullsize_refiner(iso_call: dict) -> tuple:
    """Write fullsize_refiner.npz: refine_f64 at FULLSIZE_REFINER_CONFIG on ISO_CASE's step-0 voxels / features.
    Returns (summary entry, weights, the call for check_mlx)."""
    rcfg = FULLSIZE_REFINER_CONFIG
    w = fullsize_refiner_weights()
    coords = iso_call["coords"].astype(np.int32)
    feats = iso_call["feats"].astype(np.float32)
    shape = np.asarray(iso_call["shape"], np.int64)
    B, H, W, _ = (int(v) for v in shape)
    d = rcfg["encoder_downsample"]
    assert B == 1 and H % d == 0 and W % d == 0
    enc = fullsize_enc_map(rcfg["encoder_channels"], H // d, W // d)
    out, counts = refine_f64(w, feats, coords, shape, enc[None], return_levels=True)
    probe = np.stack([w[k].reshape(-1)[:8] for k in FULLSIZE_PROBES]).astype(np.float32)
    arrays = {"coords": coords, "feats": feats, "shape": shape, "enc_map": enc, "out": out.astype(np.float64),
              "level_counts": counts.astype(np.int64), "w_probe": probe, "seed": np.int64(FULLSIZE_SEED)}
    path = OUT / "fullsize_refiner.npz"
    np.savez_compressed(path, **arrays)

    whole = hashlib.sha256()
    per_tensor = []
    for k, s in refiner_keys_and_shapes(rcfg):
        b = np.ascontiguousarray(w[k], dtype="<f4").tobytes()
        whole.update(b)
        v = w[k].astype(np.float64)
        per_tensor.append({"key": k, "shape": list(s), "sha256": hashlib.sha256(b).hexdigest(),
                           "sum": float(v.sum()), "abs_sum": float(np.abs(v).sum())})
    entry = {
        "file": "fullsize_refiner.npz", "source": f"{ISO_CASE} step 0 (iso_coords, raw_coord_0 features)",
        "refiner_config": rcfg, "seed": FULLSIZE_SEED, "n_tensors": len(w),
        "params": int(sum(v.size for v in w.values())),
        "weights_sha256": whole.hexdigest(),
        "weights_sha256_rule": "sha256 of the float32 little-endian row-major bytes of every tensor, concatenated "
                               "in refiner_keys_and_shapes order (the order of 'tensors')",
        "w_probe_keys": list(FULLSIZE_PROBES), "w_probe": [[float(x) for x in r] for r in probe],
        "enc_map_rule": "enc[c, y, x] = f32(sin(0.37*c + 1.3*y + 0.71*x)) (float64 argument and sine)",
        "shape": [int(x) for x in shape], "voxels": int(out.size),
        "level_counts": [int(x) for x in counts],
        "out_min": float(out.min()), "out_max": float(out.max()), "out_mean": float(out.mean()),
        "out_std": float(out.std()), "out_absmax": float(np.abs(out).max()),
        "inputs_sha256": _digest([w[k] for k, _ in refiner_keys_and_shapes(rcfg)] + [feats, coords, enc]),
        "file_bytes": path.stat().st_size, "keys": sorted(arrays),
        "tensors": per_tensor,
    }
    call = dict(case="fullsize_refiner", step=0, feats=feats, coords=coords, shape=shape, enc=enc[None], out=out)
    return entry, w, call


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check-mlx", action="store_true", help="compare refine_f64 with mlx-vlm's Sparse3DUNet")
    ap.add_argument("--mlx-python", default=os.environ.get("MLX_PYTHON", "venv-mlx/bin/python"),
                    help="python of a venv with mlx[cpu] and mlx-vlm==0.7.10 (default: $MLX_PYTHON or venv-mlx/bin/python)")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)

    cfg = moge3_config()
    sd_v2 = mf.synth_numpy_state_dict(BASE)
    sd_ref = refiner_state_dict(cfg["refiner"])
    sd = {**sd_v2, **sd_ref}
    mf.save_checkpoint(OUT / "tiny_moge3.pt", cfg, sd)
    model = build_v2_model(cfg, sd)

    summary = {"checkpoint": "tiny_moge3.pt", "refiner_seed": REFINER_SEED, "out_proj_scale": OUT_PROJ_SCALE,
               "n_tensors": len(sd), "n_refiner_tensors": len(sd_ref),
               "refiner_params": int(sum(v.size for v in sd_ref.values())), "cases": []}
    entries, calls, steps0 = run_cases(model, sd_ref, cfg, CASES)
    summary["cases"] += entries
    if steps0:
        summary["steps0_vs_v2_infer_max_rel"] = steps0

    # the SwiGLU-backbone variant: same refiner, MoGe-2 part with w12/w3 in place of fc1/fc2
    cfg_g = moge3_config(SWIGLU_BACKBONE)
    sd_v2_g, new_keys = swiglu_v2_state_dict(cfg_g)
    sd_g = {**sd_v2_g, **sd_ref}
    mf.save_checkpoint(OUT / "tiny_moge3_swiglu.pt", cfg_g, sd_g)
    model_g = build_v2_model(cfg_g, sd_g)  # strict load
    ffn = check_swiglu_ffn(model_g, sd_g)
    print(json.dumps({"swiglu_ffn": ffn}))
    entries_g, calls_g, steps0_g = run_cases(model_g, sd_ref, cfg_g, SWIGLU_CASES, checkpoint="tiny_moge3_swiglu.pt")
    summary["cases"] += entries_g
    calls += calls_g
    summary["swiglu"] = {
        "checkpoint": "tiny_moge3_swiglu.pt", "backbone": SWIGLU_BACKBONE, "seed": SWIGLU_SEED,
        "n_tensors": len(sd_g), "new_keys": new_keys, "ffn": ffn,
        "cases": [n for n, *_ in SWIGLU_CASES], "steps0_vs_v2_infer_max_rel": steps0_g,
    }

    digest = _digest([sd_ref[k] for k in sorted(sd_ref)] + [a for c in calls for a in (c["feats"], c["coords"], c["enc"])])
    summary["refiner_inputs_sha256"] = digest
    old = {}
    if (OUT / "summary.json").exists():
        old = json.loads((OUT / "summary.json").read_text())
    if args.check_mlx:
        summary["mlx_check"] = check_mlx(args.mlx_python, cfg["refiner"], sd_ref, calls)
        print(json.dumps({k: v for k, v in summary["mlx_check"].items() if k != "calls"}))
    elif old.get("refiner_inputs_sha256") == digest and "mlx_check" in old:
        summary["mlx_check"] = old["mlx_check"]
    else:
        summary["mlx_check"] = None

    # the refiner alone at the released ViT-L widths, on ISO_CASE's step-0 voxels
    iso_call = next(c for c in calls if c["case"] == ISO_CASE and c["step"] == 0)
    full, full_w, full_call = write_fullsize_refiner(iso_call)
    print(json.dumps({k: v for k, v in full.items() if k not in ("tensors", "refiner_config")}))
    old_full = old.get("fullsize_refiner") or {}
    if args.check_mlx:
        full["mlx_check"] = check_mlx(args.mlx_python, FULLSIZE_REFINER_CONFIG, full_w, [full_call])
        print(json.dumps({"fullsize_refiner_mlx": {k: v for k, v in full["mlx_check"].items() if k != "calls"}}))
    elif old_full.get("inputs_sha256") == full["inputs_sha256"] and "mlx_check" in old_full:
        full["mlx_check"] = old_full["mlx_check"]
    else:
        full["mlx_check"] = None
    del full_w
    summary["fullsize_refiner"] = full
    summary["checkpoint_bytes"] = (OUT / "tiny_moge3.pt").stat().st_size
    summary["swiglu"]["checkpoint_bytes"] = (OUT / "tiny_moge3_swiglu.pt").stat().st_size
    with open(OUT / "summary.json", "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
