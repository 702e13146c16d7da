"""Full-size published MoGe-2 architectures with synthetic weights: reference outputs of upstream ``infer``.

Run from the repository root with the Python reference venv active::

    python3 -m venv venv && . venv/bin/activate
    pip install -U pip wheel
    pip install torch numpy scipy
    pip install --no-deps dlr-moge==2.0.0 dlr-utils3d==1.3
    pip install opencv-python-headless==4.10.0.84 huggingface_hub click trimesh pillow matplotlib tqdm psutil

    OMP_NUM_THREADS=2 python tests/make_fullsize_reference.py                       # all four variants
    OMP_NUM_THREADS=2 python tests/make_fullsize_reference.py vits-normal --save-checkpoint /work/scratch

For each variant (``vits-normal``, ``vitb-normal``, ``vitl-normal``, ``vitl``) it builds ``MoGeModel(**cfg)`` with the
exact ``model_config`` of the published checkpoint (``published_config`` below), loads ``synth_state_dict(cfg, seed=7)`` (shaped geometry, see
``synth_weights.py``), runs ``infer`` on ``tests/fixtures/images/rgb_64x48.png`` with num_tokens 1800 (fp32, CPU,
2 threads) and writes ``tests/fixtures/fullsize/<variant>.npz`` with the keys of a case file (see make_fixtures.py)
plus ``cls_token`` (1, D) and ``metric_scale_raw`` (1, 1) (scale-head output before exp).

The checkpoints are NOT written into the repository (ViT-L is 1.3 GB); ``--save-checkpoint DIR`` writes
``DIR/<variant>.pt`` in the published format ``{'model_config': cfg, 'model': state_dict}``. The Rust side can also
regenerate the weights bit-for-bit with ``tests/it/support/synth.rs``.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from synth_weights import keys_and_shapes, synth_state_dict  # noqa: E402
from make_fixtures import FIX, SEED, head_cfg, load_image, run_case, save_checkpoint, summarize  # noqa: E402

torch.manual_seed(0)
torch.set_num_threads(2)


def published_config(backbone: str, layers, d: int, neck_blocks, normal: bool = True) -> dict:
    ladder = [d, 256, 128, 64, 32]
    cfg = {
        "encoder": {"backbone": backbone, "intermediate_layers": list(layers), "dim_out": d},
        "neck": {"dim_in": [d + 2, 2, 2, 2, 2], "dim_out": None, "dim_res_blocks": ladder,
                 "num_res_blocks": list(neck_blocks), "res_block_in_norm": "none", "res_block_hidden_norm": "none",
                 "resamplers": ["conv_transpose", "conv_transpose", "conv_transpose", "bilinear"]},
        "points_head": head_cfg(ladder, 3),
    }
    if normal:
        cfg["normal_head"] = head_cfg(ladder, 3)
    cfg["mask_head"] = head_cfg(ladder, 1)
    cfg["scale_head"] = {"dims": [d, d, d, 1]}
    cfg["remap_output"] = "exp"
    cfg["num_tokens_range"] = [1200, 3600]
    return cfg


VARIANTS = {
    "vits-normal": published_config("dinov2_vits14", [5, 11], 384, [0, 1, 1, 1, 0]),
    "vitb-normal": published_config("dinov2_vitb14", [5, 11], 768, [0, 1, 1, 1, 0]),
    "vitl-normal": published_config("dinov2_vitl14", [5, 11, 17, 23], 1024, [0, 2, 2, 2, 0]),
    "vitl": published_config("dinov2_vitl14", [5, 11, 17, 23], 1024, [0, 2, 2, 2, 0], normal=False),
}

IMAGE = "rgb_64x48.png"
NUM_TOKENS = 1800


def run_variant(name: str, save_dir: Path | None) -> dict:
    from moge.model.v2 import MoGeModel

    cfg = VARIANTS[name]
    t0 = time.time()
    model = MoGeModel(**copy.deepcopy(cfg))
    keys = keys_and_shapes(model=model)
    sd = synth_state_dict(cfg, SEED, shape_geometry=True, keys=keys)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=True)
    model.eval()
    t1 = time.time()
    if save_dir is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
        save_checkpoint(save_dir / f"{name}.pt", cfg, sd)
    del sd

    rec = {}
    h1 = model.encoder.register_forward_hook(lambda m, i, o: rec.__setitem__("cls", o[1].detach().clone()))
    h2 = model.scale_head.register_forward_hook(lambda m, i, o: rec.__setitem__("scale", o.detach().clone()))
    image_u8, tensor = load_image(FIX / "images" / IMAGE)
    t2 = time.time()
    r = run_case(model, image_u8, tensor, dict(num_tokens=NUM_TOKENS))   # hooks: last call = the raw forward()
    t3 = time.time()
    h1.remove()
    h2.remove()
    r["cls_token"] = rec["cls"].numpy().astype(np.float32)
    r["metric_scale_raw"] = rec["scale"].numpy().astype(np.float32)
    out = FIX / "fullsize"
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / f"{name}.npz", **r)
    s = summarize(name, r)
    s["params"] = int(sum(p.numel() for p in model.parameters()))
    s["keys"] = len(keys)
    s["build_s"] = round(t1 - t0, 1)
    s["infer_plus_forward_s"] = round(t3 - t2, 1)
    print(json.dumps(s), flush=True)
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--save-checkpoint", type=Path, default=None, metavar="DIR")
    args = ap.parse_args()
    for v in args.variants or list(VARIANTS):
        run_variant(v, args.save_checkpoint)


if __name__ == "__main__":
    main()
