"""PyTorch's side of the AMX comparison (docs/precision-and-speed.md, PERFORMANCE.md): the products
and the MoGe-2 forward in fp32 and under bf16 autocast, which on an Intel CPU with AMX runs
oneDNN's tile kernels. Run it beside `moge bench` and `examples/bf16_bench.rs` in one sitting, on
an idle machine, with the same thread count.

    OMP_NUM_THREADS=2 VENV/bin/python scripts/bench_torch_amx.py products
    OMP_NUM_THREADS=2 VENV/bin/python scripts/bench_torch_amx.py convs
    OMP_NUM_THREADS=2 VENV/bin/python scripts/bench_torch_amx.py model CHECKPOINT.pt [--size 600x400] [--tokens 1800]

VENV: the reference venv of tests/make_fixtures.py; CHECKPOINT: an upstream model.pt
(tests/make_fullsize_reference.py --save-checkpoint writes synthetic full-size ones). The model is
timed through `forward`: `infer` wraps it in `autocast(enabled=use_fp16)`, which switches an outer
bf16 autocast off. Prints one line per measurement: median and best of the rounds.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")

import torch

# The product shapes of examples/bf16_bench.rs, as (M, K, N): ViT tokens x weights, then the
# decoder's convolutions as weights x im2col columns.
SHAPES = [(1800, 384, 1152), (1800, 1536, 384), (1800, 1024, 4096), (1800, 4096, 1024), (64, 576, 4096), (256, 2304, 2048)]


def timed(fn, rounds):
    fn()
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out), min(out)


def products(rounds):
    torch.manual_seed(0)
    for m, k, n in SHAPES:
        a, b = torch.rand(m, k) * 2 - 1, torch.rand(k, n) * 2 - 1
        flop = 2 * m * k * n
        for name, (x, y) in [("f32", (a, b)), ("bf16", (a.bfloat16(), b.bfloat16()))]:
            med, best = timed(lambda: torch.matmul(x, y), rounds)
            print(f"torch {name:>4} {m}x{k}x{n}: {flop / med / 1e9:8.1f} GFLOP/s median, {flop / best / 1e9:8.1f} best")


# The decoder's 3x3 convolutions as (channels, height, width): examples/conv3x3_bench.rs's
# shapes (the neck's and heads' at 640x480).
CONVS = [(256, 60, 80), (128, 120, 160), (64, 240, 320), (32, 480, 640)]


def convs(rounds):
    """The decoder's 3x3 convolutions (replicate padding, as upstream's) in fp32 and in bf16,
    channels last and first: oneDNN's fastest of the layouts."""
    torch.manual_seed(0)
    for c, h, w in CONVS:
        conv = torch.nn.Conv2d(c, c, 3, padding=1, padding_mode="replicate")
        x = torch.rand(1, c, h, w) * 2 - 1
        flop = 2 * c * c * 9 * h * w
        with torch.inference_mode():
            for name, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
                for fmt in [torch.contiguous_format, torch.channels_last]:
                    m = conv.to(dtype=dtype, memory_format=fmt)
                    xi = x.to(dtype=dtype, memory_format=fmt)
                    med, best = timed(lambda: m(xi), rounds)
                    layout = "NHWC" if fmt == torch.channels_last else "NCHW"
                    print(f"torch {name:>4} conv3x3 {c}->{c} {h}x{w} {layout}: {flop / med / 1e9:8.1f} GFLOP/s median ({med * 1e3:.2f} ms), {flop / best / 1e9:8.1f} best")


def model(path, size, tokens, rounds):
    from moge.model.v2 import MoGeModel

    ckpt = torch.load(path, map_location="cpu", weights_only=False)
    net = MoGeModel(**ckpt["model_config"])
    net.load_state_dict(ckpt["model"])
    net.eval()
    w, h = size
    torch.manual_seed(0)
    image = torch.rand(1, 3, h, w)
    with torch.inference_mode():
        for name, ctx in [("fp32", torch.autocast("cpu", enabled=False)), ("bf16 autocast", torch.autocast("cpu", dtype=torch.bfloat16))]:
            def run():
                with ctx:
                    net.forward(image, num_tokens=tokens)

            med, best = timed(run, rounds)
            print(f"torch {name} forward {w}x{h} {tokens} tokens: {med:.3f} s median, {best:.3f} s best ({rounds} rounds)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["products", "convs", "model"])
    ap.add_argument("checkpoint", nargs="?")
    ap.add_argument("--size", default="600x400")
    ap.add_argument("--tokens", type=int, default=1800)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    if args.what == "products":
        products(args.rounds)
    elif args.what == "convs":
        convs(args.rounds)
    else:
        if not args.checkpoint:
            ap.error("model needs a CHECKPOINT")
        w, h = (int(v) for v in args.size.lower().split("x"))
        model(args.checkpoint, (w, h), args.tokens, args.rounds)


if __name__ == "__main__":
    main()
