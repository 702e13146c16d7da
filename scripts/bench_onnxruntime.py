"""moge beside ONNX Runtime and PyTorch on the CPU, in one run: the same checkpoint,
photo and token count; forward only for the Python engines, `moge bench` (its model call and its
whole image: decode, forward, post-process, write) for moge. ONNX Runtime and moge take turns,
`--rounds` times: this machine's speed drifts by a third between minutes, so each round's ratio is
measured side by side, and the rounds' ratios are what is reported (their median and range).

    scripts/bench-vs-onnxruntime.sh VENV CHECKPOINT [TOKENS] [RUNS]   (sets up what this needs)
    python scripts/bench_onnxruntime.py CHECKPOINT --moge BIN [--tokens 1800] [--runs 5]
        [--ort-variants fp32,int8-dynamic,int8-static] [--cache DIR]

The model is exported with the reference package (`dlr-moge`) by PyTorch's dynamo exporter at
opset 18, the photo's size fixed, and run by ONNX Runtime with all graph optimisations; the
ONNX outputs are compared with PyTorch's before any time is reported. ONNX Runtime runs it in up
to three forms (`--ort-variants`): fp32 as exported; int8-dynamic, `quantize_dynamic`'s int8
weights with activations quantised at run time; int8-static, `quantize_static`'s QDQ graph, its
activation ranges calibrated on a few more synthetic photos. Both quantise the linears only,
weights per channel, in the types ONNX Runtime recommends for the CPU. The models are built once
per run, or once per `--cache DIR`. Outside CI: it needs PyTorch, onnx, onnxscript and
onnxruntime (pip).
"""

import argparse
import atexit
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VARIANTS = ("fp32", "int8-dynamic", "int8-static")
# Calibration photos for int8-static: the timed photo's scene, other phases and noise.
CALIBRATION_PHOTOS = 4


def timed(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def summary(times):
    return {"median_s": statistics.median(times), "min_s": min(times), "all_s": times}


def ort_key(variant):
    return f"onnxruntime_{variant.replace('-', '_')}_forward"


def synthetic_photo(np, width, height, i):
    """A smooth synthetic scene with noise, as scripts/bench-vs-upstream.sh draws its photo i."""
    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.stack([(x / width) * 200, (y / height) * 180, 120 + 60 * np.sin(x / 40 + i)], -1)
    return np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)


def built(folder, make):
    """`folder`/moge.onnx, made by `make(path)` unless a run before this one left it there; the
    seconds it took, None when it was there. Made beside and renamed in, so that a run stopped
    half-way leaves nothing that looks finished."""
    path = folder / "moge.onnx"
    if path.exists():
        return path, None
    partial = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    t = time.perf_counter()
    try:
        make(partial / "moge.onnx")
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    took = time.perf_counter() - t
    partial.rename(folder)
    return path, took


def relative_errors(want, got, np):
    """Per output: the largest difference from PyTorch's, over PyTorch's largest magnitude."""
    errors = []
    for w, g in zip(want, got):
        w = w.numpy()
        finite = np.isfinite(w) & np.isfinite(g)
        scale = float(np.abs(w[finite]).max()) or 1.0
        errors.append(float(np.abs(w[finite] - g[finite]).max()) / scale)
    return errors


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--moge", required=True, help="the moge binary")
    ap.add_argument("--tokens", type=int, default=1800)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--width", type=int, default=640)
    ap.add_argument("--height", type=int, default=480)
    ap.add_argument("--rounds", type=int, default=3, help="ONNX Runtime and moge in turns, this many times")
    ap.add_argument("--precisions", default="f32,bf16", help="moge's precisions to run (comma list)")
    ap.add_argument("--ort-variants", default=",".join(VARIANTS), help=f"ONNX Runtime's forms to time (comma list of {', '.join(VARIANTS)})")
    ap.add_argument("--cache", help="keep the ONNX models here for later runs (default: a temporary folder, removed at exit)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    variants = [v for v in args.ort_variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or not variants:
        sys.exit(f"--ort-variants: {', '.join(unknown) or 'none given'}; known: {', '.join(VARIANTS)}")

    import numpy as np
    import onnx
    import onnxscript
    import torch
    import onnxruntime as ort
    from PIL import Image
    from moge.model.v2 import MoGeModel

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="moge-ort-"))
    # The exported model is as large as the checkpoint: gone on every way out, sys.exit included,
    # unless --cache asks for it to be kept.
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    img = synthetic_photo(np, args.width, args.height, 0)
    photo = work / "photo.png"
    Image.fromarray(img).save(photo)

    def preprocess(img):
        return torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)[None].contiguous()

    image = preprocess(img)

    model = MoGeModel.from_pretrained(args.checkpoint).eval()
    tokens = args.tokens

    class Forward(torch.nn.Module):
        """`MoGeModel.forward` at a fixed token count, its outputs as a tuple."""

        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, image):
            out = self.m.forward(image, num_tokens=tokens)
            return tuple(out[k] for k in ("points", "normal", "mask", "metric_scale") if out.get(k) is not None)

    wrapped = Forward(model).eval()
    with torch.inference_mode():
        want = wrapped(image)
        torch_times = timed(lambda: wrapped(image), args.runs, args.warmup)

    # One folder per checkpoint file, photo size, token count and exporter: what the export
    # depends on. The quantised forms sit inside it, named also by their settings.
    ckpt = Path(args.checkpoint).resolve()
    st = ckpt.stat()
    key = {"checkpoint": str(ckpt), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "tokens": tokens,
           "photo": [args.width, args.height], "torch": torch.__version__, "onnxscript": onnxscript.__version__,
           "onnx": onnx.__version__, "opset": 18}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    models = (Path(args.cache) if args.cache else work) / f"{ckpt.stem}-{args.width}x{args.height}-{tokens}t-{digest}"
    models.mkdir(parents=True, exist_ok=True)
    (models / "key.json").write_text(json.dumps(key, indent=1) + "\n")

    def export(path):
        with torch.no_grad():
            torch.onnx.export(wrapped, (image,), str(path), dynamo=True, opset_version=18, external_data=True)

    onnx_path, export_s = built(models / "fp32", export)

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    input_name = sess.get_inputs()[0].name
    feed = {input_name: image.numpy()}
    # The exported graph must compute the model: each output against PyTorch's.
    errors = relative_errors(want, sess.run(None, feed), np)
    if max(errors) > 1e-3:
        sys.exit(f"ONNX Runtime's outputs differ from PyTorch's (max relative error {max(errors):.2e}): not timing a different model")

    # ONNX Runtime's advice for x86: u8 activations, s8 weights; on a CPU without VNNI, 7-bit
    # weights, as its AVX2 u8 x s8 products can saturate.
    flags = next((line.split() for line in open("/proc/cpuinfo") if line.startswith("flags")), [])
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat, QuantType,
                                          quantize_dynamic, quantize_static)

    class Photos(CalibrationDataReader):
        """The calibration photos, preprocessed as the timed one."""

        def __init__(self):
            self.left = iter(range(1, CALIBRATION_PHOTOS + 1))

        def get_next(self):
            i = next(self.left, None)
            return None if i is None else {input_name: preprocess(synthetic_photo(np, args.width, args.height, i)).numpy()}

    # The linears only, as moge's int8. Not attention's own products (MatMulConstBOnly): most of its
    # probabilities are below 1/255 at these token counts. Not the convolutions: int8-static's
    # per-tensor activations there moved a synthetic ViT-S's normals by a quarter of their range.
    # use_external_data_format: weights beside the graph, as the export has them, clear of
    # protobuf's 2 GB limit (ViT-L's calibration copy is fp32).
    settings = {
        "int8-dynamic": dict(op_types_to_quantize=["MatMul", "Gemm"], per_channel=True, reduce_range=not vnni,
                             weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True}),
        "int8-static": dict(quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul", "Gemm"], per_channel=True,
                            reduce_range=not vnni, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                            calibrate_method=CalibrationMethod.MinMax, extra_options={"MatMulConstBOnly": True}),
    }
    quantise = {
        "int8-dynamic": lambda out: quantize_dynamic(str(onnx_path), str(out), use_external_data_format=True, **settings["int8-dynamic"]),
        "int8-static": lambda out: quantize_static(str(onnx_path), str(out), Photos(), use_external_data_format=True, **settings["int8-static"]),
    }
    sessions = {"fp32": sess}
    built_s = {"fp32": export_s}
    variant_errors = {"fp32": errors}
    for v in variants:
        if v == "fp32":
            continue
        described = json.dumps({"onnxruntime": ort.__version__, "calibration_photos": CALIBRATION_PHOTOS,
                                **settings[v]}, sort_keys=True, default=str)
        folder = models / f"{v}-{hashlib.sha256(described.encode()).hexdigest()[:8]}"
        print(f"ONNX Runtime {v}: {'quantising' if not (folder / 'moge.onnx').exists() else 'cached'} ({folder})", flush=True)
        path, built_s[v] = built(folder, quantise[v])
        sessions[v] = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        # Reported, not held to a bound: what int8 costs is part of the comparison.
        variant_errors[v] = relative_errors(want, sessions[v].run(None, feed), np)
    precisions = [p for p in args.precisions.split(",") if p]

    def moge_bench(precision):
        cmd = [args.moge, "bench", str(photo), "--weights", args.checkpoint, "--num-tokens", str(tokens), "--precision", precision,
               "--runs", str(args.runs), "--warmup", str(args.warmup), "--json"]
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
        b = json.loads(out)
        return {"model_call_median_s": b["model_call_s"]["median"], "per_image_median_s": b["per_image_s"]["median"],
                "route": b["conditions"]["cpu_route"]}

    rounds = []
    for r in range(args.rounds):
        rnd = {ort_key(v): summary(timed(lambda: sessions[v].run(None, feed), args.runs, args.warmup)) for v in variants}
        rnd["moge"] = {p: moge_bench(p) for p in precisions}
        rounds.append(rnd)
        line = f"round {r + 1}: ONNX Runtime " + ", ".join(f"{v} {rnd[ort_key(v)]['median_s'] * 1e3:.0f} ms" for v in variants)
        for p, m in rnd["moge"].items():
            line += f"; moge {p} model call {m['model_call_median_s'] * 1e3:.0f} ms, whole image {m['per_image_median_s'] * 1e3:.0f} ms"
        print(line, flush=True)

    cpu = "?"
    family = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and cpu == "?":
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("cpu family") and family == "?":
            family = line.split(":", 1)[1].strip()
    result = {
        "cpu": cpu, "cpu_family": family, "cpu_vnni": vnni, "threads": args.threads, "tokens": tokens, "photo": [args.width, args.height],
        "checkpoint": args.checkpoint, "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__},
        "onnx_export_s": export_s, "onnx_max_rel_error_vs_torch": max(errors), "ort_variants": variants,
        # build_s: export or quantisation, null when --cache already held the model.
        "onnx_models": {v: {"build_s": built_s[v], "max_rel_error_vs_torch": max(variant_errors[v]),
                            "rel_errors_vs_torch": variant_errors[v]} for v in variants},
        "torch_fp32_forward": summary(torch_times), "rounds": rounds,
    }
    print(f"CPU: {cpu} (cpu family {family}{', VNNI' if vnni else ''}), {args.threads} threads, {args.width}x{args.height}, "
          f"{tokens} tokens, {args.rounds} rounds of {args.runs} runs after {args.warmup} warm-up")
    print(f"ONNX export {'cached' if export_s is None else f'{export_s:.1f} s'}; ONNX Runtime vs PyTorch outputs: max relative error {max(errors):.1e}")
    for v in variants:
        if v != "fp32":
            print(f"ONNX Runtime {v}: {'quantised model cached' if built_s[v] is None else f'quantised in {built_s[v]:.1f} s'}; "
                  f"vs PyTorch outputs: max relative error {max(variant_errors[v]):.1e}")
    print(f"{'PyTorch fp32 forward':34} {statistics.median(torch_times) * 1e3:9.1f} ms (before the rounds)")
    for v in variants:
        per_round = [rd[ort_key(v)]["median_s"] for rd in rounds]
        print(f"{f'ONNX Runtime {v} forward':34} {statistics.median(per_round) * 1e3:9.1f} ms "
              f"(median of the rounds: {', '.join(f'{x * 1e3:.1f}' for x in per_round)})")
    # Per round: ONNX Runtime's forward over moge's time, in the same round; > 1 means moge is faster.
    for name, key in [("model call", "model_call_median_s"), ("whole image", "per_image_median_s")]:
        for p in precisions:
            parts = []
            for v in variants:
                ratios = [rd[ort_key(v)]["median_s"] / rd["moge"][p][key] for rd in rounds]
                parts.append(f"{v} {statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})")
            print(f"{f'moge {p} {name}':34} ONNX Runtime forward / moge, median (rounds): {'; '.join(parts)}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
