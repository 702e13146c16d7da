#!/usr/bin/env python3
"""The Python half of scripts/gpu-check.sh (run it through that script).

  gpu_check.py checkpoints OUT VARIANT...   synthetic full-size checkpoints (tests/make_fullsize_reference.py's
                                            published configs, tests/synth_weights.py at its fixed seed)
  gpu_check.py compare REF.npz GOT.npz --label L [--min-pcc 0.9999]
                                            PCC of points, depth, normal and mask agreement; exit 1 on a fail
  gpu_check.py torch CKPT --device cuda --width W --height H --tokens N --runs R [--modes ...]
                                            upstream MoGeModel (PyPI dlr-moge) timings: forward and infer()
  gpu_check.py jpegs OUT N W H              synthetic photo-like JPEGs (needs Pillow)
  gpu_check.py probe                        whether torch and upstream import here
  gpu_check.py summary RESULTS.jsonl        the table of every measured line

Every subcommand prints JSON lines (one per measurement) that `summary` reads back. The npz reader
works without numpy (CI has none) on the uncompressed files `--npz-compression none` writes.
"""
from __future__ import annotations

import argparse
import ast
import json
import math
import os
import statistics
import struct
import sys
import time
import types
import zipfile
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"


def emit(rec: dict) -> None:
    print(json.dumps(rec), flush=True)


def stub_missing_modules() -> None:
    """The GPU machine has torch but not everything dlr-moge and the fixture scripts import at
    module level: cv2 (tests/make_fixtures.py's image reader, not used here), huggingface_hub
    (hub names; checkpoints here are local files) and scipy (upstream infer()'s focal/shift
    solve on the host: without it only forward() is timed). A stub fails when it is used."""
    for name, attrs in (("cv2", {}), ("huggingface_hub", {"hf_hub_download": None}), ("scipy", {}), ("scipy.signal", {}),
                        ("scipy.optimize", {})):
        try:
            __import__(name)
        except ImportError:
            mod = types.ModuleType(name)

            def missing(*_a, _n=name, **_k):
                raise RuntimeError(f"{_n} is not installed on this machine")

            for a in attrs:
                setattr(mod, a, missing)
            mod.__getattr__ = lambda a, _n=name: missing  # noqa: E731 - any other attribute
            sys.modules[name] = mod


# ------------------------------------------------------------------------------------------------
# checkpoints


def cmd_checkpoints(args) -> int:
    import torch  # noqa: F401 - fail early and clearly without it

    stub_missing_modules()
    sys.path.insert(0, str(TESTS))
    from make_fullsize_reference import VARIANTS  # noqa: E402
    from make_fixtures import SEED, save_checkpoint  # noqa: E402
    from synth_weights import keys_and_shapes, synth_state_dict  # noqa: E402
    from moge.model.v2 import MoGeModel  # noqa: E402

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for v in args.variants:
        path = out / f"{v}.pt"
        if path.exists():
            emit({"step": "checkpoint", "variant": v, "path": str(path), "reused": True})
            continue
        t0 = time.time()
        cfg = VARIANTS[v]
        import copy

        model = MoGeModel(**copy.deepcopy(cfg))
        keys = keys_and_shapes(model=model)
        del model
        sd = synth_state_dict(cfg, SEED, shape_geometry=True, keys=keys)
        save_checkpoint(path, cfg, sd)
        emit({"step": "checkpoint", "variant": v, "path": str(path), "seed": SEED, "seconds": round(time.time() - t0, 1),
              "bytes": path.stat().st_size})
    return 0


# ------------------------------------------------------------------------------------------------
# npz comparison


def read_npz(path: Path) -> dict:
    """{name: (shape, flat values)} of an npz whose members are stored (not deflated), with
    numpy when present."""
    try:
        import numpy as np

        with np.load(path) as z:
            return {k: (z[k].shape, z[k].reshape(-1)) for k in z.files}
    except ImportError:
        pass
    out = {}
    with zipfile.ZipFile(path) as z:
        for info in z.infolist():
            raw = z.read(info)
            assert raw[:6] == b"\x93NUMPY", f"{info.filename}: not an npy file"
            major = raw[6]
            (hlen,), off = (struct.unpack("<H", raw[8:10]), 10) if major == 1 else (struct.unpack("<I", raw[8:12]), 12)
            header = ast.literal_eval(raw[off:off + hlen].decode("latin1"))
            data = raw[off + hlen:]
            descr, shape = header["descr"], tuple(header["shape"])
            assert not header["fortran_order"], info.filename
            code = {"<f4": "f", "|u1": "B", "<u1": "B", "|b1": "B"}.get(descr)
            if code is None:
                continue
            a = array(code)
            a.frombytes(data)
            out[info.filename.removesuffix(".npy")] = (shape, a)
    return out


def pcc(a, b) -> float:
    """Pearson correlation over the entries finite in both."""
    try:
        import numpy as np

        a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
        keep = np.isfinite(a) & np.isfinite(b)
        a, b = a[keep], b[keep]
        if a.size < 2:
            return float("nan")
        a, b = a - a.mean(), b - b.mean()
        d = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
        return float((a * b).sum()) / d if d > 0 else (1.0 if np.array_equal(a, b) else float("nan"))
    except ImportError:
        pairs = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
        if len(pairs) < 2:
            return float("nan")
        ma = sum(p[0] for p in pairs) / len(pairs)
        mb = sum(p[1] for p in pairs) / len(pairs)
        sab = sum((x - ma) * (y - mb) for x, y in pairs)
        saa = sum((x - ma) ** 2 for x, _ in pairs)
        sbb = sum((y - mb) ** 2 for _, y in pairs)
        d = math.sqrt(saa * sbb)
        return sab / d if d > 0 else (1.0 if saa == sbb == 0 else float("nan"))


def cmd_compare(args) -> int:
    ref, got = read_npz(Path(args.ref)), read_npz(Path(args.got))
    rec = {"step": "parity", "label": args.label, "min_pcc": args.min_pcc}
    ok = True
    for key in ("points", "depth", "normal"):
        if key not in ref:
            continue
        if key not in got or ref[key][0] != got[key][0]:
            rec[key] = None
            ok = False
            continue
        rec[f"pcc_{key}"] = round(pcc(ref[key][1], got[key][1]), 7)
        ok &= rec[f"pcc_{key}"] >= args.min_pcc
    if "mask" in ref and "mask" in got:
        ma, mb = ref["mask"][1], got["mask"][1]
        agree = sum(1 for x, y in zip(ma, mb) if bool(x) == bool(y)) / max(1, len(ma))
        rec["mask_agreement"] = round(agree, 6)
        ok &= agree >= args.min_mask
    rec["pass"] = bool(ok)
    emit(rec)
    return 0 if ok else 1


# ------------------------------------------------------------------------------------------------
# upstream timings


def cmd_torch(args) -> int:
    import warnings

    import torch

    # upstream's fp32 autocast region warns on the CPU (a dry run): not a finding.
    warnings.filterwarnings("ignore", message=".*autocast.*")

    stub_missing_modules()
    from moge.model.v2 import MoGeModel

    dev = torch.device(args.device)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = MoGeModel.from_pretrained(args.ckpt).to(dev).eval()
    # The fastest attention upstream offers (PyTorch's fused SDPA: flash / memory-efficient).
    model.enable_pytorch_native_sdpa()
    # A smooth synthetic photo: timing does not depend on the content.
    yy, xx = torch.meshgrid(torch.linspace(0, 1, args.height), torch.linspace(0, 1, args.width), indexing="ij")
    image = torch.stack([0.2 + 0.6 * xx, 0.3 + 0.5 * yy, 0.5 + 0.3 * xx * yy]).to(dev)

    def timed(fn, runs):
        out = []
        for _ in range(runs):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            out.append(time.perf_counter() - t)
        return out

    for mode in args.modes:
        rec = {"step": "torch", "mode": mode, "ckpt": Path(args.ckpt).stem, "device": str(dev), "tokens": args.tokens,
               "size": [args.width, args.height], "torch": torch.__version__}
        try:
            autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mode in ("bf16-autocast", "compile-bf16"))
            fwd = model.forward
            if mode == "compile-bf16":
                fwd = torch.compile(model.forward, mode="reduce-overhead", dynamic=False)
            batch = image.unsqueeze(0)

            def forward():
                with torch.inference_mode(), autocast:
                    return fwd(batch, num_tokens=args.tokens)

            def infer():
                # infer() with fp16 off; its forward under our autocast (bf16 modes) or none.
                model.forward = fwd
                try:
                    with torch.inference_mode(), autocast:
                        return model.infer(image, num_tokens=args.tokens, use_fp16=False)
                finally:
                    del model.forward

            t0 = time.perf_counter()
            warm = timed(forward, args.warmup)
            rec["warmup_s"] = round(time.perf_counter() - t0, 2)
            rec["first_call_s"] = round(warm[0], 3) if warm else None
            f = timed(forward, args.runs)
            rec["forward_ms"] = round(1e3 * statistics.median(f), 2)
            rec["forward_min_ms"] = round(1e3 * min(f), 2)
            if dev.type == "cuda":
                rec["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
            try:
                rec["infer_ms"] = round(1e3 * statistics.median(timed(infer, args.runs)), 2)
            except Exception as e:  # scipy absent: forward() alone is compared
                rec["infer_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        except Exception as e:  # one mode failing (a compiler missing) does not stop the others
            rec["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
        emit(rec)
    return 0


# ------------------------------------------------------------------------------------------------
# inputs and the summary


def cmd_jpegs(args) -> int:
    import numpy as np
    from PIL import Image

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    w, h = args.width, args.height
    y, x = np.mgrid[0:h, 0:w].astype(np.int64)
    fx, fy = x / w, y / h
    for k in range(args.count):
        # Smooth gradients plus a texture that differs per image (so no two files are alike).
        n = ((x * 73856093) ^ (y * 19349663) ^ (k * 83492791)) % 32
        rgb = np.stack([200 * fx + n, 180 * fy + n, 120 * (1 - fx * fy) + n + 8 * k], axis=-1)
        Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8)).save(out / f"photo_{k:03d}.jpg", quality=90)
    emit({"step": "jpegs", "out": str(out), "count": args.count, "size": [w, h]})
    return 0


def cmd_probe(_args) -> int:
    """Whether upstream imports here (with the stubs above)."""
    import torch

    stub_missing_modules()
    import moge.model.v2  # noqa: F401

    print(f"torch {torch.__version__}, cuda {torch.cuda.is_available()}")
    return 0


def cmd_summary(args) -> int:
    recs = [json.loads(l) for l in Path(args.results).read_text().splitlines() if l.startswith("{")]
    print("\n== gpu-check summary ==")
    for r in recs:
        s = r.get("step")
        if s == "parity":
            vals = ", ".join(f"{k[4:]} {r[k]:.6f}" for k in ("pcc_points", "pcc_depth", "pcc_normal") if r.get(k) is not None)
            print(f"parity  {r['label']:<34} PCC {vals}; mask {r.get('mask_agreement')}  -> {'PASS' if r['pass'] else 'FAIL'} (>= {r['min_pcc']})")
        elif s == "moge-bench":
            graphs = f"; graphs {r['cuda_graphs']}" if r.get("cuda_graphs") else ""
            print(f"moge    {r['variant']:<12} {r['label']:<20} forward {r['forward_ms']} ms (parts, synchronised), model call {r['model_call_ms']} ms, "
                  f"per image {r['per_image_ms']} ms ({r['device']}, {r['precision']}{graphs})")
        elif s == "moge-batch":
            print(f"batch   {r['variant']:<12} {r['label']:<20} {r['images']} images in {r['seconds']} s: {r['images_per_s']} images/s")
        elif s == "torch":
            if "error" in r:
                print(f"torch   {r['ckpt']:<12} {r['mode']:<20} failed: {r['error']}")
            else:
                infer = f"infer {r['infer_ms']} ms" if "infer_ms" in r else f"infer not timed ({r.get('infer_error')})"
                print(f"torch   {r['ckpt']:<12} {r['mode']:<20} forward {r['forward_ms']} ms, {infer} "
                      f"(warm-up {r['warmup_s']} s, {r['device']})")
        elif s == "skip":
            print(f"skipped {r['what']}: {r['why']}")
        elif s == "fail":
            print(f"FAILED  {r['what']}: {r['why']}")
    fails = [r for r in recs if r.get("step") == "parity" and not r["pass"]]
    print(f"parity: {sum(1 for r in recs if r.get('step') == 'parity') - len(fails)} passed, {len(fails)} failed")
    broken = [r for r in recs if r.get("step") == "fail"]
    if broken:
        print(f"{len(broken)} step(s) failed")
    return 1 if fails or broken else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("checkpoints")
    p.add_argument("out")
    p.add_argument("variants", nargs="+")
    p = sub.add_parser("compare")
    p.add_argument("ref")
    p.add_argument("got")
    p.add_argument("--label", required=True)
    p.add_argument("--min-pcc", type=float, default=0.9999)
    p.add_argument("--min-mask", type=float, default=0.995)
    p = sub.add_parser("torch")
    p.add_argument("ckpt")
    p.add_argument("--device", default="cuda")
    p.add_argument("--width", type=int, default=1920)
    p.add_argument("--height", type=int, default=1080)
    p.add_argument("--tokens", type=int, default=1800)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["eager-fp32", "bf16-autocast", "compile-bf16"],
                   choices=["eager-fp32", "bf16-autocast", "compile-bf16"])
    p = sub.add_parser("jpegs")
    p.add_argument("out")
    p.add_argument("count", type=int)
    p.add_argument("width", type=int)
    p.add_argument("height", type=int)
    sub.add_parser("probe")
    p = sub.add_parser("summary")
    p.add_argument("results")
    args = ap.parse_args()
    return {"checkpoints": cmd_checkpoints, "compare": cmd_compare, "torch": cmd_torch, "jpegs": cmd_jpegs, "probe": cmd_probe,
            "summary": cmd_summary}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
