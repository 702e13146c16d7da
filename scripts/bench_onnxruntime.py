"""moge beside ONNX Runtime and PyTorch on the CPU, in one run: the same checkpoint,
photo and token count; forward only for the Python engines, `moge bench` (its model call and its
whole image: decode, forward, post-process, write) for moge. ONNX Runtime and moge take turns,
`--rounds` times: this machine's speed drifts by a third between minutes, so each round's ratio is
measured side by side, and the rounds' ratios are what is reported (their median and range).

    scripts/bench-vs-onnxruntime.sh VENV CHECKPOINT [TOKENS] [RUNS]   (sets up what this needs)
    python scripts/bench_onnxruntime.py CHECKPOINT --moge BIN [--tokens 1800] [--runs 5]

The model is exported with the reference package (`dlr-moge`) by PyTorch's dynamo exporter at
opset 18, the photo's size fixed, and run by ONNX Runtime with all graph optimisations; the
ONNX outputs are compared with PyTorch's before any time is reported. Outside CI: it needs
PyTorch, onnx, onnxscript and onnxruntime (pip).
"""

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


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
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()

    import numpy as np
    import torch
    import onnxruntime as ort
    from PIL import Image
    from moge.model.v2 import MoGeModel

    torch.set_num_threads(args.threads)
    work = Path(tempfile.mkdtemp(prefix="moge-ort-"))
    # The exported model is as large as the checkpoint: gone on every way out, sys.exit included.
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    # The photo: a smooth synthetic scene with noise, as scripts/bench-vs-upstream.sh draws it.
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0 : args.height, 0 : args.width].astype(np.float32)
    img = np.stack([(x / args.width) * 200, (y / args.height) * 180, 120 + 60 * np.sin(x / 40)], -1)
    img = np.clip(img + rng.normal(0, 12, img.shape), 0, 255).astype(np.uint8)
    photo = work / "photo.png"
    Image.fromarray(img).save(photo)
    image = torch.from_numpy(img.astype(np.float32) / 255.0).permute(2, 0, 1)[None].contiguous()

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

    onnx_path = work / "moge.onnx"
    t = time.perf_counter()
    with torch.no_grad():
        torch.onnx.export(wrapped, (image,), str(onnx_path), dynamo=True, opset_version=18, external_data=True)
    export_s = time.perf_counter() - t

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.inter_op_num_threads = 1
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(str(onnx_path), so, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: image.numpy()}
    got = sess.run(None, feed)
    # The exported graph must compute the model: each output against PyTorch's.
    errors = []
    for w, g in zip(want, got):
        w = w.numpy()
        finite = np.isfinite(w) & np.isfinite(g)
        scale = float(np.abs(w[finite]).max()) or 1.0
        errors.append(float(np.abs(w[finite] - g[finite]).max()) / scale)
    if max(errors) > 1e-3:
        sys.exit(f"ONNX Runtime's outputs differ from PyTorch's (max relative error {max(errors):.2e}): not timing a different model")
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
        ort_times = timed(lambda: sess.run(None, feed), args.runs, args.warmup)
        rnd = {"onnxruntime_fp32_forward": summary(ort_times), "moge": {p: moge_bench(p) for p in precisions}}
        rounds.append(rnd)
        o = statistics.median(ort_times)
        line = f"round {r + 1}: ONNX Runtime {o * 1e3:.0f} ms"
        for p, m in rnd["moge"].items():
            line += f"; moge {p} model call {m['model_call_median_s'] * 1e3:.0f} ms ({o / m['model_call_median_s']:.2f}x), whole image {m['per_image_median_s'] * 1e3:.0f} ms ({o / m['per_image_median_s']:.2f}x)"
        print(line, flush=True)

    cpu = "?"
    family = "?"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and cpu == "?":
            cpu = line.split(":", 1)[1].strip()
        if line.startswith("cpu family") and family == "?":
            family = line.split(":", 1)[1].strip()
    result = {
        "cpu": cpu, "cpu_family": family, "threads": args.threads, "tokens": tokens, "photo": [args.width, args.height],
        "checkpoint": args.checkpoint, "versions": {"torch": torch.__version__, "onnxruntime": ort.__version__},
        "onnx_export_s": export_s, "onnx_max_rel_error_vs_torch": max(errors),
        "torch_fp32_forward": summary(torch_times), "rounds": rounds,
    }
    print(f"CPU: {cpu} (cpu family {family}), {args.threads} threads, {args.width}x{args.height}, {tokens} tokens, "
          f"{args.rounds} rounds of {args.runs} runs after {args.warmup} warm-up")
    print(f"ONNX export {export_s:.1f} s; ONNX Runtime vs PyTorch outputs: max relative error {max(errors):.1e}")
    print(f"{'PyTorch fp32 forward':28} {statistics.median(torch_times) * 1e3:9.1f} ms (before the rounds)")
    # Per round: ONNX Runtime's forward over moge's time, in the same round; > 1 means moge is faster.
    for name, key in [("model call", "model_call_median_s"), ("whole image", "per_image_median_s")]:
        for p in precisions:
            ratios = [statistics.median(rd["onnxruntime_fp32_forward"]["all_s"]) / rd["moge"][p][key] for rd in rounds]
            print(f"moge {p} {name:12} ONNX Runtime forward / moge: median {statistics.median(ratios):.2f}x "
                  f"(rounds: {', '.join(f'{x:.2f}' for x in ratios)})")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
