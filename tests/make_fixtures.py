"""Build every committed test fixture under tests/fixtures/ with the upstream MoGe-2 package.

Run from the repository root with the Python reference venv active::

    python3 -m venv venv && . venv/bin/activate
    pip install -U pip wheel
    pip install torch numpy scipy
    pip install --no-deps dlr-moge==2.0.0 dlr-utils3d==1.3
    pip install opencv-python-headless==4.10.0.84 huggingface_hub click trimesh pillow matplotlib tqdm psutil

    OMP_NUM_THREADS=2 python tests/make_fixtures.py            # everything
    OMP_NUM_THREADS=2 python tests/make_fixtures.py --only images checkpoints cases stages numerics synth_check

Everything is seeded, so re-running produces the same files (verified: byte-identical .pt/.png/.json, identical
array contents in the .npz files).

What it writes (all CPU, fp32, ``model.eval()``, ``torch.set_num_threads(2)``):

* ``fixtures/<checkpoint>.pt``: ``torch.save({'model_config': cfg, 'model': state_dict}, path)`` (published format)
  for the tiny checkpoints ``tiny_normal``, ``tiny_vitl``, ``random_normal`` (weights: ``synth_weights.py``, seed 7).
  ``tiny_normal`` holds a plain dict; ``tiny_vitl`` and ``random_normal`` hold ``model.state_dict()`` (an
  ``OrderedDict`` with ``_metadata``), as training code saves them. ``tiny_normal_f16`` / ``tiny_normal_bf16``:
  ``model.half().state_dict()`` / ``model.bfloat16().state_dict()`` of tiny_normal; their cases run upstream's
  ``MoGeModel.from_pretrained`` on those files (the rounded weights in an fp32 model).
  They use the test-only backbone name ``dinov2_vitt14`` (see ``register_tiny_backbone``): a DINOv2 ViT/14 with
  img_size 518, embed dim E and depth N as given by the checkpoint shapes, heads = E / 64, everything else as in the
  published ``vit_small``/``vit_base``/``vit_large`` backbones.
* ``fixtures/images/*.png``: synthetic test images (numpy, fixed seed).
* ``fixtures/cases/<case>.npz`` + ``fixtures/cases.json``: end-to-end ``MoGeModel.infer`` references.
* ``fixtures/stages/<checkpoint>.npz``: per-layer intermediate tensors (forward hooks), num_tokens 40 on rgb_64x48.
* ``fixtures/numerics.npz``: pos-embed bicubic interpolation (first 16 channels only), antialiased/plain
  bilinear, linspace, nearest (the 700x900 arange source of ``nn_big_out`` is not stored: value = row*900 + col).
* ``fixtures/synth_check.json``: values of the synthetic-weight rule for the Rust twin (``tests/it/support/synth.rs``).
* ``fuzz/corpus/{decode,checkpoint_pt,checkpoint_pickle,checkpoint_safetensors}/``: small photos in every format and variant
  (Pillow) and small checkpoints in every form torch writes, seeds of the fuzz targets.

Keys of a case file (H, W = image size):
  image_u8 (H,W,3 u8, RGB as cv2.imread+cvtColor decoded it), points (H,W,3), depth (H,W), normal (H,W,3, if the
  model has a normal head), mask (H,W u8 0/1), intrinsics (3,3)  -- the ``infer()`` outputs (inf where masked);
  fwd_points (H,W,3), fwd_normal (H,W,3), fwd_mask (H,W, after sigmoid), fwd_metric_scale () -- ``forward()`` outputs;
  focal (), shift () -- what ``infer()`` computes from fwd_points / fwd_mask > 0.5 (with the fov_x focal if given);
  num_tokens () int, grid (2,) = (base_h, base_w).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
from functools import partial
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import cv2
import numpy as np
import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from synth_weights import synth_state_dict, synth_tensor, keys_and_shapes  # noqa: E402

FIX = HERE / "fixtures"
SEED = 7

torch.manual_seed(0)
torch.set_num_threads(2)


# ----------------------------------------------------------------------------------------------------------------
# configs

def head_cfg(ladder, c, num_res_blocks=(0, 1, 1, 1, 0)):
    return {
        "dim_in": list(ladder), "dim_out": [None, None, None, None, c],
        "dim_res_blocks": list(ladder), "num_res_blocks": list(num_res_blocks),
        "res_block_in_norm": "none", "res_block_hidden_norm": "none",
        "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"],
    }


def model_cfg(backbone, layers, ladder, neck_blocks, head_blocks, scale_dims, normal=True):
    d = ladder[0]
    cfg = {
        "encoder": {"backbone": backbone, "intermediate_layers": list(layers), "dim_out": d},
        "neck": {"dim_in": [d + 2, 2, 2, 2, 2], "dim_out": None, "dim_res_blocks": list(ladder),
                 "num_res_blocks": list(neck_blocks), "res_block_in_norm": "none", "res_block_hidden_norm": "none",
                 "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"]},
        "points_head": head_cfg(ladder, 3, head_blocks),
    }
    if normal:
        cfg["normal_head"] = head_cfg(ladder, 3, head_blocks)
    cfg["mask_head"] = head_cfg(ladder, 1, head_blocks)
    cfg["scale_head"] = {"dims": list(scale_dims)}
    cfg["remap_output"] = "exp"
    cfg["num_tokens_range"] = [1200, 3600]
    return cfg


CHECKPOINTS = {
    "tiny_normal": dict(
        embed_dim=128, depth=3, shaped=True,
        config=model_cfg("dinov2_vitt14", [1, 2], [96, 32, 24, 16, 8], [0, 1, 1, 1, 0], [0, 1, 1, 1, 0],
                         [128, 64, 64, 1])),
    "tiny_vitl": dict(
        embed_dim=64, depth=4, shaped=True,
        config=model_cfg("dinov2_vitt14", [0, 1, 2, 3], [64, 24, 16, 8, 8], [0, 2, 2, 2, 0], [0, 1, 1, 1, 0],
                         [64, 64, 64, 1], normal=False)),
    "random_normal": dict(
        embed_dim=64, depth=2, shaped=False,
        config=model_cfg("dinov2_vitt14", [0, 1], [64, 16, 16, 8, 8], [0, 1, 1, 1, 0], [0, 1, 1, 1, 0],
                         [64, 64, 64, 1])),
}

IMAGES = ["rgb_64x48.png", "rgb_40x72.png", "gray_50x50.png", "rgba_45x30.png", "rgb16_48x36.png", "tiny_8x8.png"]

CASES = [
    # name, checkpoint, image, options
    ("n_rgb_1200", "tiny_normal", "rgb_64x48.png", dict(num_tokens=1200)),
    ("n_rgb_3600_fov", "tiny_normal", "rgb_64x48.png", dict(num_tokens=3600, fov_x=60)),
    ("n_portrait_1200", "tiny_normal", "rgb_40x72.png", dict(num_tokens=1200)),
    ("n_gray_1369", "tiny_normal", "gray_50x50.png", dict(num_tokens=1369)),
    ("n_rgba_level0", "tiny_normal", "rgba_45x30.png", dict(resolution_level=0)),
    ("n_rgb16_1800_fov", "tiny_normal", "rgb16_48x36.png", dict(num_tokens=1800, fov_x=70)),
    ("n_tiny8_1200", "tiny_normal", "tiny_8x8.png", dict(num_tokens=1200)),
    ("n_rgb_noproj_nomask", "tiny_normal", "rgb_64x48.png",
     dict(num_tokens=1200, force_projection=False, apply_mask=False)),
    ("l_rgb_1800", "tiny_vitl", "rgb_64x48.png", dict(num_tokens=1800)),
    ("l_portrait_3600_fov", "tiny_vitl", "rgb_40x72.png", dict(num_tokens=3600, fov_x=55)),
    ("r_rgb_1200", "random_normal", "rgb_64x48.png", dict(num_tokens=1200)),
    ("f16_rgb_1200", "tiny_normal_f16", "rgb_64x48.png", dict(num_tokens=1200)),
    ("bf16_portrait_1800", "tiny_normal_bf16", "rgb_40x72.png", dict(num_tokens=1800)),
]


# ----------------------------------------------------------------------------------------------------------------
# model construction

def register_tiny_backbone(embed_dim: int, depth: int, name: str = "dinov2_vitt14", ffn_layer: str = "mlp") -> None:
    """(Re)define ``moge.model.dinov2.hub.backbones.<name>`` as a DINOv2 ViT/14 with the given E and N (and FFN:
    make_moge3_fixtures.py registers ``dinov2_vitt14_swiglu`` with ViT-g's ``swiglufused``)."""
    from moge.model.dinov2.hub import backbones
    from moge.model.dinov2.layers import MemEffAttention, NestedTensorBlock as Block
    from moge.model.dinov2.models.vision_transformer import DinoVisionTransformer

    assert embed_dim % 64 == 0

    def backbone(pretrained=False, **kw):
        assert not pretrained
        return DinoVisionTransformer(
            img_size=518, patch_size=14, embed_dim=embed_dim, depth=depth, num_heads=embed_dim // 64, mlp_ratio=4,
            init_values=1.0, ffn_layer=ffn_layer, block_chunks=0, num_register_tokens=0,
            interpolate_antialias=False, interpolate_offset=0.1,
            # same block class as the published vit_small/base/large (MemEffAttention == Attention without xformers)
            block_fn=partial(Block, attn_class=MemEffAttention),
        )

    setattr(backbones, name, backbone)


def synth_numpy_state_dict(name: str) -> dict:
    ck = CHECKPOINTS[name]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    return synth_state_dict(ck["config"], SEED, shape_geometry=ck["shaped"])


def build_model(config: dict, sd_np: dict):
    from moge.model.v2 import MoGeModel

    model = MoGeModel(**copy.deepcopy(config))
    sd = {k: torch.from_numpy(v.copy()) for k, v in sd_np.items()}
    model.load_state_dict(sd, strict=True)
    model.eval()
    model.float()
    return model


def load_tiny(name: str):
    ck = CHECKPOINTS[name]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    return build_model(ck["config"], synth_numpy_state_dict(name))


def save_checkpoint(path: Path, config: dict, sd_np: dict) -> None:
    """A plain ``{key: tensor}`` dict as the state dict."""
    sd = {k: torch.from_numpy(np.ascontiguousarray(v).copy()) for k, v in sd_np.items()}
    torch.save({"model_config": copy.deepcopy(config), "model": sd}, str(path))


def save_module_checkpoint(path: Path, config: dict, model) -> None:
    """What training code writes: ``model.state_dict()``, the ``OrderedDict`` whose ``_metadata``
    attribute holds per-module versions (pickled as the dict's state)."""
    sd = model.state_dict()
    assert hasattr(sd, "_metadata") and len(sd._metadata) > 0
    torch.save({"model_config": copy.deepcopy(config), "model": sd}, str(path))


# Reduced-precision copies of tiny_normal, as users make them (``model.half().state_dict()``), and
# the dtype each stores.
VARIANTS = {"tiny_normal_f16": torch.float16, "tiny_normal_bf16": torch.bfloat16}


def make_variants(model_tiny_normal) -> dict:
    """Writes ``tiny_normal_{f16,bf16}.pt``, then loads each with upstream's own loader
    (``MoGeModel.from_pretrained``: ``load_state_dict`` into an fp32 model), which is the reference
    the cases of these checkpoints are run on."""
    from moge.model.v2 import MoGeModel

    ck = CHECKPOINTS["tiny_normal"]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    out = {}
    for name, dtype in VARIANTS.items():
        reduced = copy.deepcopy(model_tiny_normal).to(dtype)
        save_module_checkpoint(FIX / f"{name}.pt", ck["config"], reduced)
        m = MoGeModel.from_pretrained(str(FIX / f"{name}.pt"))
        m.eval()
        assert all(p.dtype == torch.float32 for p in m.parameters())
        out[name] = m
    return out


# ----------------------------------------------------------------------------------------------------------------
# images

def _smooth_rgb(rng, h, w, hi=255.0, noise=10.0):
    y, x = np.mgrid[0:h, 0:w].astype(np.float64)
    fy, fx = y / max(h - 1, 1), x / max(w - 1, 1)
    r = 0.15 + 0.7 * fx + 0.1 * np.sin(6.0 * fy + 1.0)
    g = 0.2 + 0.6 * fy + 0.15 * np.cos(5.0 * fx * fy + 0.3)
    b = 0.5 + 0.35 * np.sin(4.0 * (fx - fy)) + 0.1 * np.cos(9.0 * fx)
    img = np.stack([r, g, b], -1) * hi + rng.normal(0.0, noise * hi / 255.0, (h, w, 3))
    return np.clip(np.rint(img), 0, hi)


def make_images() -> None:
    out = FIX / "images"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20240601)
    # cv2.imwrite takes BGR(A) channel order; the arrays below are built in RGB(A) order and flipped.
    rgb = _smooth_rgb(rng, 48, 64).astype(np.uint8)
    cv2.imwrite(str(out / "rgb_64x48.png"), rgb[..., ::-1])
    rgb = _smooth_rgb(rng, 72, 40).astype(np.uint8)
    cv2.imwrite(str(out / "rgb_40x72.png"), rgb[..., ::-1])
    gray = _smooth_rgb(rng, 50, 50)[..., 1].astype(np.uint8)
    cv2.imwrite(str(out / "gray_50x50.png"), gray)
    rgba = _smooth_rgb(rng, 30, 45).astype(np.uint8)
    y, x = np.mgrid[0:30, 0:45]
    alpha = np.clip(np.rint(255 * (x / 44.0) * (0.5 + 0.5 * (y / 29.0))), 0, 255).astype(np.uint8)
    alpha[5:12, 30:40] = 0            # fully transparent block with non-trivial colour underneath
    alpha[20:25, 3:10] = 255
    cv2.imwrite(str(out / "rgba_45x30.png"), np.dstack([rgba[..., ::-1], alpha]))
    rgb16 = _smooth_rgb(rng, 36, 48, hi=65535.0).astype(np.uint16)
    # probes for the 16 -> 8 bit conversion of cv2.imread (truncation v >> 8 vs rounding):
    rgb16[0, 0] = [0x12FF, 0x1280, 0x127F]
    rgb16[0, 1] = [0xFFFF, 0xFF80, 0x00FF]
    rgb16[0, 2] = [0x0080, 0x007F, 0x8081]
    cv2.imwrite(str(out / "rgb16_48x36.png"), rgb16[..., ::-1])
    tiny = _smooth_rgb(rng, 8, 8, noise=25.0).astype(np.uint8)
    cv2.imwrite(str(out / "tiny_8x8.png"), tiny[..., ::-1])


def make_corpus() -> None:
    """``fuzz/corpus/decode/``: small photos in every format and variant the decoders see in the
    wild, written by Pillow (libjpeg, libpng, libwebp, libtiff): the seeds of the image fuzz target
    and of the CI replay test, and the whole files the truncation tests cut short."""
    from PIL import Image

    out = HERE / "fuzz" / "corpus" / "decode"
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(20241130)
    rgb = _smooth_rgb(rng, 48, 64).astype(np.uint8)
    im = Image.fromarray(rgb)
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to view
    exif[0x010F] = "moge-test"
    im.save(out / "baseline_exif6.jpg", quality=90, exif=exif.tobytes())
    im.save(out / "progressive.jpg", quality=85, progressive=True)
    im.save(out / "restart_markers.jpg", quality=80, restart_marker_blocks=2)
    im.save(out / "subsampling_444.jpg", quality=95, subsampling=0)
    im.convert("L").save(out / "gray.jpg", quality=90)
    im.convert("CMYK").save(out / "cmyk.jpg", quality=90)
    im.save(out / "rgb.png")
    im.convert("P", palette=Image.Palette.ADAPTIVE, colors=32).save(out / "palette.png")
    Image.fromarray((rgb.astype(np.uint16) * 257)[..., 0]).save(out / "gray16.png")
    rgba = np.dstack([rgb, np.linspace(0, 255, 64, dtype=np.uint8)[None, :].repeat(48, 0)])
    Image.fromarray(rgba).save(out / "rgba.png")
    im.save(out / "lossy.webp", quality=80)
    im.save(out / "lossless.webp", lossless=True)
    Image.fromarray(rgba).save(out / "alpha.webp", quality=80)
    im.save(out / "raw.tif")
    im.save(out / "lzw.tif", compression="tiff_lzw")
    im.save(out / "deflate.tif", compression="tiff_adobe_deflate")
    im.save(out / "rgb24.bmp")
    Image.fromarray(rgba).save(out / "rgba32.bmp")


def make_checkpoint_corpus() -> None:
    """``fuzz/corpus/checkpoint_pt/`` and ``checkpoint_safetensors/``: small checkpoints written
    by torch itself (a few tensors each: float32, float16, bfloat16, a transposed view, an
    ``nn.Parameter``, an ``OrderedDict`` with ``_metadata``), seeds of the checkpoint fuzz targets.
    They do not bind to a model; the loader's reading of every form is what is fuzzed."""
    from safetensors.torch import save as st_save

    cfg = CHECKPOINTS["random_normal"]["config"]
    g = torch.Generator().manual_seed(SEED)
    out = HERE / "fuzz" / "corpus" / "checkpoint_pt"
    out.mkdir(parents=True, exist_ok=True)
    lin = torch.nn.Linear(4, 3)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(3, 4, generator=g))
    sd = lin.state_dict()
    torch.save({"model_config": cfg, "model": sd}, out / "state_dict.pt")
    torch.save({"model_config": cfg, "model": {"w": torch.randn(2, 3, generator=g).half(),
                                                 "b": torch.randn(3, generator=g).bfloat16()}}, out / "half_bf16.pt")
    base = torch.randn(3, 5, generator=g)
    torch.save({"model_config": cfg, "model": {"t": base.t(), "row": base[1], "p": torch.nn.Parameter(base[:2, 1:3])}},
               out / "views_param.pt")
    torch.save(sd, out / "bare_state_dict.pt")
    # One state dict under two keys: pickle writes the second as a memo reference.
    torch.save({"model_config": cfg, "ema": sd, "model": sd}, out / "shared_ema.pt")
    # A broadcast view (stride 0) repeats storage elements.
    torch.save({"model_config": cfg, "model": {"e": torch.arange(3.0).expand(4, 3)}}, out / "expanded.pt")
    # The same pickles alone, for the target that wraps a data.pkl in an archive of its own.
    import zipfile
    pk = HERE / "fuzz" / "corpus" / "checkpoint_pickle"
    pk.mkdir(parents=True, exist_ok=True)
    for f in sorted(out.glob("*.pt")):
        with zipfile.ZipFile(f) as z:
            name = next(n for n in z.namelist() if n.endswith("data.pkl"))
            (pk / f"{f.stem}.pkl").write_bytes(z.read(name))
    st = HERE / "fuzz" / "corpus" / "checkpoint_safetensors"
    st.mkdir(parents=True, exist_ok=True)
    blob = st_save({"encoder.image_mean": torch.tensor([[[[0.485]], [[0.456]], [[0.406]]]]),
                    "w": torch.randn(2, 2, generator=g).half()})
    (st / "small.bin").write_bytes(json.dumps(cfg).encode() + b"\0" + blob)


def load_image(path: Path):
    """Exactly the upstream CLI (moge/scripts/infer.py): returns (uint8 HxWx3 RGB, float32 (3,H,W) tensor)."""
    image = cv2.cvtColor(cv2.imread(str(path)), cv2.COLOR_BGR2RGB)
    tensor = torch.tensor(image / 255, dtype=torch.float32).permute(2, 0, 1)
    return image, tensor


# ----------------------------------------------------------------------------------------------------------------
# reference cases

def grid_for(num_tokens: int, h: int, w: int):
    a = w / h
    return round((num_tokens / a) ** 0.5), round((num_tokens * a) ** 0.5)


def mirror_focal_shift(points: torch.Tensor, mask_binary: torch.Tensor, fov_x, w: int, h: int):
    """What infer() does to get focal and shift (v2.py), calling the same upstream function."""
    from moge.utils.geometry_torch import recover_focal_shift

    aspect_ratio = w / h
    if fov_x is None:
        focal, shift = recover_focal_shift(points, mask_binary)
    else:
        focal = aspect_ratio / (1 + aspect_ratio ** 2) ** 0.5 / torch.tan(
            torch.deg2rad(torch.as_tensor(fov_x, device=points.device, dtype=points.dtype) / 2))
        if focal.ndim == 0:
            focal = focal[None].expand(points.shape[0])
        _, shift = recover_focal_shift(points, mask_binary, focal=focal)
    return focal, shift


def run_case(model, image_u8: np.ndarray, tensor: torch.Tensor, opts: dict) -> dict:
    h, w = image_u8.shape[:2]
    num_tokens = opts.get("num_tokens")
    level = opts.get("resolution_level", 9)
    fov_x = opts.get("fov_x")
    force_projection = opts.get("force_projection", True)
    apply_mask = opts.get("apply_mask", True)
    out = model.infer(tensor, num_tokens=num_tokens, resolution_level=level, fov_x=fov_x,
                      force_projection=force_projection, apply_mask=apply_mask, use_fp16=False)
    if num_tokens is None:
        lo, hi = model.num_tokens_range
        num_tokens = int(lo + (level / 9) * (hi - lo))
    with torch.inference_mode():
        fwd = model.forward(tensor[None], num_tokens=num_tokens)
        focal, shift = mirror_focal_shift(fwd["points"].float(), fwd["mask"] > 0.5, fov_x, w, h)
    res = {
        "image_u8": image_u8.astype(np.uint8),
        "points": out["points"].numpy().astype(np.float32),
        "depth": out["depth"].numpy().astype(np.float32),
        "mask": out["mask"].numpy().astype(np.uint8),
        "intrinsics": out["intrinsics"].numpy().astype(np.float32),
        "fwd_points": fwd["points"][0].numpy().astype(np.float32),
        "fwd_mask": fwd["mask"][0].numpy().astype(np.float32),
        "fwd_metric_scale": np.float32(fwd["metric_scale"][0].item()),
        "focal": np.float32(focal[0].item()),
        "shift": np.float32(shift[0].item()),
        "num_tokens": np.int64(num_tokens),
        "grid": np.array(grid_for(num_tokens, h, w), dtype=np.int64),
    }
    if "normal" in out:
        res["normal"] = out["normal"].numpy().astype(np.float32)
        res["fwd_normal"] = fwd["normal"][0].numpy().astype(np.float32)
    # consistency of the mirrored focal/shift with infer's intrinsics / depth
    a = w / h
    fx_expect = float(res["focal"]) / 2 * (1 + a * a) ** 0.5 / a
    assert abs(fx_expect - float(res["intrinsics"][0, 0])) <= 1e-5 * abs(fx_expect), (fx_expect, res["intrinsics"])
    m = res["mask"].astype(bool)
    if m.any():
        d_expect = (res["fwd_points"][..., 2] + res["shift"]) * res["fwd_metric_scale"]
        np.testing.assert_allclose(res["depth"][m], d_expect[m], rtol=1e-5)
    return res


def summarize(name: str, r: dict) -> dict:
    m = r["mask"].astype(bool)
    return {
        "case": name, "grid": [int(x) for x in r["grid"]], "num_tokens": int(r["num_tokens"]),
        "mask_frac": float(m.mean()), "focal": float(r["focal"]), "shift": float(r["shift"]),
        "metric_scale": float(r["fwd_metric_scale"]),
        "mask_margin": float(np.abs(r["fwd_mask"].astype(np.float64) - 0.5).min()),
        "depth_range": [float(r["depth"][m].min()), float(r["depth"][m].max())] if m.any() else None,
        "nan": bool(any(np.isnan(v).any() for v in r.values() if isinstance(v, np.ndarray) and v.dtype.kind == "f")),
    }


def make_cases(models: dict) -> list:
    (FIX / "cases").mkdir(parents=True, exist_ok=True)
    listing, summaries = [], []
    for name, ck, img, opts in CASES:
        image_u8, tensor = load_image(FIX / "images" / img)
        r = run_case(models[ck], image_u8, tensor, opts)
        np.savez_compressed(FIX / "cases" / f"{name}.npz", **r)
        s = summarize(name, r)
        summaries.append(s)
        print(json.dumps(s))
        listing.append({
            "name": name, "checkpoint": f"{ck}.pt", "image": f"images/{img}",
            "num_tokens": opts.get("num_tokens"),
            "resolution_level": opts.get("resolution_level") if opts.get("num_tokens") is None else None,
            "fov_x": opts.get("fov_x"),
            "force_projection": opts.get("force_projection", True),
            "apply_mask": opts.get("apply_mask", True),
            "num_tokens_used": int(r["num_tokens"]),
            "grid": [int(x) for x in r["grid"]],
        })
    with open(FIX / "cases.json", "w") as f:
        checkpoints = {f"{k}.pt": {"embed_dim": v["embed_dim"], "depth": v["depth"], "num_heads": v["embed_dim"] // 64,
                                   "shaped": v["shaped"], "seed": SEED} for k, v in CHECKPOINTS.items()}
        json.dump({"seed": SEED, "checkpoints": checkpoints, "cases": listing}, f, indent=1)
        f.write("\n")
    return summaries


# ----------------------------------------------------------------------------------------------------------------
# per-stage fixtures

def capture_stages(model, tensor: torch.Tensor, num_tokens: int) -> dict:
    """Intermediate tensors of model.forward via hooks (no re-implementation)."""
    rec = {"taps": []}
    bb = model.encoder.backbone
    hooks = [
        bb.patch_embed.register_forward_pre_hook(lambda m, args: rec.__setitem__("vit_input", args[0].clone())),
        bb.norm.register_forward_hook(lambda m, i, o: rec["taps"].append(o.clone())),
        model.encoder.register_forward_hook(lambda m, i, o: rec.__setitem__("encoder", (o[0].clone(), o[1].clone()))),
        model.neck.register_forward_hook(lambda m, i, o: rec.__setitem__("neck", [t.clone() for t in o])),
        model.scale_head.register_forward_hook(lambda m, i, o: rec.__setitem__("scale", o.clone())),
    ]
    for head in ("points_head", "normal_head", "mask_head"):
        if hasattr(model, head):
            hooks.append(getattr(model, head).register_forward_hook(
                lambda m, i, o, head=head: rec.__setitem__(head, [t.clone() for t in o])))
    image = tensor[None]
    with torch.inference_mode():
        model.forward(image, num_tokens=num_tokens)
        h, w = image.shape[-2:]
        gh, gw = grid_for(num_tokens, h, w)
        dummy = torch.zeros(1, 1 + gh * gw, bb.embed_dim)
        pos = bb.interpolate_pos_encoding(dummy, 14 * gh, 14 * gw)
    for hk in hooks:
        hk.remove()
    layers = model.encoder.intermediate_layers
    assert len(rec["taps"]) == len(layers)
    out = {
        "image": image.numpy(), "grid": np.array([gh, gw], dtype=np.int64),
        "num_tokens": np.int64(num_tokens),
        "vit_input": rec["vit_input"].numpy(), "pos_embed": pos.numpy(),
        "features": rec["encoder"][0].numpy(), "cls_token": rec["encoder"][1].numpy(),
        "metric_scale_raw": rec["scale"].numpy(),
        "intermediate_layers": np.array(layers, dtype=np.int64),
    }
    for k, t in zip(layers, rec["taps"]):
        out[f"tap_{k}"] = t.numpy()
    for i, t in enumerate(rec["neck"]):
        out[f"neck_{i}"] = t.numpy()
    for head in ("points_head", "normal_head", "mask_head"):
        if head in rec:
            for i, t in enumerate(rec[head]):
                out[f"{head}_{i}"] = t.numpy()
    return {k: (v.astype(np.float32) if isinstance(v, np.ndarray) and v.dtype.kind == "f" else v)
            for k, v in out.items()}


def make_stages(models: dict) -> None:
    (FIX / "stages").mkdir(parents=True, exist_ok=True)
    _, tensor = load_image(FIX / "images" / "rgb_64x48.png")
    for name, model in models.items():
        st = capture_stages(model, tensor, 40)
        np.savez_compressed(FIX / "stages" / f"{name}.npz", **st)
        print(name, "stages:", {k: tuple(v.shape) for k, v in st.items()})


# ----------------------------------------------------------------------------------------------------------------
# numerics

POS_CHANNELS = 16


def make_numerics(model_tiny_normal) -> None:
    """numerics.npz. pos_<h>x<w>: interpolate_pos_encoding of the tiny_normal backbone (its pos_embed from
    tiny_normal.pt), shape (1, 1+h*w, POS_CHANNELS): channels [0, 16) of the (1, 1+h*w, 128) result only."""
    bb = model_tiny_normal.encoder.backbone
    out = {}
    with torch.inference_mode():
        for gh, gw in [(30, 40), (52, 69), (37, 49), (46, 26), (37, 37), (5, 7)]:
            dummy = torch.zeros(1, 1 + gh * gw, bb.embed_dim)
            pos = bb.interpolate_pos_encoding(dummy, 14 * gh, 14 * gw)
            # only the first POS_CHANNELS channels are stored (the op is per-channel; keeps the file small)
            out[f"pos_{gh}x{gw}"] = pos[..., :POS_CHANNELS].numpy().copy()
        out["pos_channels"] = np.int64(POS_CHANNELS)
        rng = np.random.default_rng(1234)
        aa_src = torch.from_numpy(rng.random((1, 3, 37, 53), dtype=np.float32))
        out["aa_src"] = aa_src.numpy()
        for key, size in [("aa_down", (14, 20)), ("aa_up", (70, 98)), ("aa_mixed", (37, 20))]:
            out[key] = F.interpolate(aa_src, size, mode="bilinear", align_corners=False, antialias=True).numpy()
        bl_src = torch.from_numpy(rng.random((1, 3, 40, 56), dtype=np.float32))
        out["bl_src"] = bl_src.numpy()
        for key, size in [("bl_a", (48, 64)), ("bl_b", (25, 33))]:
            out[key] = F.interpolate(bl_src, size, mode="bilinear", align_corners=False, antialias=False).numpy()
        for n in (37, 49, 784, 1919):
            out[f"lin_{n}"] = torch.linspace(-0.8, 0.8, n, dtype=torch.float32).numpy()
        nn_src = torch.arange(48 * 64, dtype=torch.float32).reshape(1, 1, 48, 64)
        out["nn_src"] = nn_src.numpy()
        out["nn_out"] = F.interpolate(nn_src, (64, 64), mode="nearest").numpy()
        # (1,1,700,900) arange source is not stored (regenerate it: value = row * 900 + col, float32)
        big = torch.arange(700 * 900, dtype=torch.float32).reshape(1, 1, 700, 900)
        out["nn_big_shape"] = np.array([700, 900], dtype=np.int64)
        out["nn_big_out"] = F.interpolate(big, (64, 64), mode="nearest").numpy()
    out = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in out.items()}
    np.savez_compressed(FIX / "numerics.npz", **out)


# ----------------------------------------------------------------------------------------------------------------
# synth check

SYNTH_CHECK_KEYS = [
    "encoder.backbone.patch_embed.proj.weight",      # 4-D conv weight
    "encoder.backbone.blocks.0.norm1.weight",        # LayerNorm weight
    "encoder.backbone.blocks.1.attn.qkv.bias",       # bias
    "encoder.backbone.blocks.2.ls2.gamma",           # LayerScale gamma
    "encoder.backbone.pos_embed",
    "points_head.output_blocks.4.weight",            # shaped
    # extras
    "encoder.backbone.cls_token",
    "encoder.image_mean",
    "encoder.backbone.mask_token",
    "neck.resamplers.0.0.weight",                    # ConvTranspose2d weight (in, out, kh, kw)
    "neck.input_blocks.4.weight",                    # shaped
    "neck.resamplers.3.1.bias",                      # shaped (x 0.01)
    "mask_head.output_blocks.4.weight",              # shaped
    "mask_head.output_blocks.4.bias",                # shaped
    "scale_head.4.weight",                           # shaped
    "scale_head.0.weight",                           # 2-D Linear weight
]


def _entry(key, arr):
    flat = arr.reshape(-1)
    return {
        "key": key, "shape": list(arr.shape),
        "first": [float(x) for x in flat[:8]],
        "first_bits": [int(x) for x in flat[:8].view(np.uint32)],
        "sum": float(flat.astype(np.float64).sum()),
    }


def make_synth_check() -> None:
    ck = CHECKPOINTS["tiny_normal"]
    register_tiny_backbone(ck["embed_dim"], ck["depth"])
    keys = keys_and_shapes(ck["config"])
    shaped = synth_state_dict(ck["config"], SEED, shape_geometry=True, keys=keys)
    raw = synth_state_dict(ck["config"], SEED, shape_geometry=False, keys=keys)
    doc = {
        "config": "tiny_normal", "seed": SEED,
        "note": "first/first_bits: first 8 row-major values (f32, and their IEEE bits); sum: float64 sum of all values."
                " 'checks' and 'all' are shaped (shape_geometry=True); 'checks_unshaped' use shaped=false.",
        "checks": [_entry(k, shaped[k]) for k in SYNTH_CHECK_KEYS],
        "checks_unshaped": [_entry(k, raw[k]) for k in SYNTH_CHECK_KEYS],
        "all": [{"key": k, "shape": list(s), "sum": float(shaped[k].astype(np.float64).sum())} for k, s in keys],
        "other_seed": [dict(_entry(k, synth_tensor(k, dict(keys)[k], 12345)), seed=12345)
                       for k in ("encoder.backbone.blocks.0.mlp.fc1.weight", "neck.res_blocks.1.0.layers.2.bias")],
    }
    with open(FIX / "synth_check.json", "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


# ----------------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="*", default=None,
                    choices=["images", "checkpoints", "cases", "stages", "numerics", "synth_check", "corpus"])
    args = ap.parse_args()
    todo = set(args.only or ["images", "checkpoints", "cases", "stages", "numerics", "synth_check", "corpus"])
    FIX.mkdir(parents=True, exist_ok=True)

    if "images" in todo:
        make_images()
    if "corpus" in todo:
        make_corpus()
        make_checkpoint_corpus()
    if "synth_check" in todo:
        make_synth_check()
    models = {}
    if todo & {"checkpoints", "cases", "stages", "numerics"}:
        for name, ck in CHECKPOINTS.items():
            sd = synth_numpy_state_dict(name)
            register_tiny_backbone(ck["embed_dim"], ck["depth"])
            models[name] = build_model(ck["config"], sd)
            if "checkpoints" in todo:
                # tiny_normal as a plain dict; the others as model.state_dict() (an OrderedDict
                # with _metadata), so that the parity suite covers both.
                if name == "tiny_normal":
                    save_checkpoint(FIX / f"{name}.pt", ck["config"], sd)
                else:
                    save_module_checkpoint(FIX / f"{name}.pt", ck["config"], models[name])
        if "checkpoints" in todo or "cases" in todo:
            models.update(make_variants(models["tiny_normal"]))
    if "cases" in todo:
        make_cases(models)
    if "stages" in todo:
        make_stages(models)
    if "numerics" in todo:
        make_numerics(models["tiny_normal"])


if __name__ == "__main__":
    main()
