#!/usr/bin/env bash
# moge beside ONNX Runtime (and PyTorch) on the CPU, in one run: forward of the same checkpoint
# on the same photo at the same token count. Outside CI.
#
#   scripts/bench-vs-onnxruntime.sh VENV CHECKPOINT [TOKENS] [RUNS]
#
# VENV: a Python venv with the reference (see tests/make_fixtures.py); onnx, onnxscript and
# onnxruntime are installed into it from PyPI if missing. CHECKPOINT: an upstream model.pt
# (tests/make_fullsize_reference.py --save-checkpoint DIR writes synthetic full-size ones).
# MOGE= picks the binary (default target/release/moge); THREADS= the threads of every engine (2);
# ROUNDS= how many times ONNX Runtime and moge take turns (3); PRECISIONS= moge's (f32,bf16;
# PRECISIONS=f32,int8 sets moge's int8 beside ONNX Runtime's); ORT_VARIANTS= ONNX Runtime's forms
# (--ort-variants, default fp32,int8-dynamic,int8-static: as exported, quantize_dynamic's,
# quantize_static's QDQ); CACHE=DIR keeps the exported and quantised models there for the next
# run with the same checkpoint, token count and versions (default: rebuilt every run).
set -euo pipefail
venv=$1; ckpt=$2; tokens=${3:-1800}; runs=${4:-5}
root=$(cd "$(dirname "$0")/.." && pwd)
moge=${MOGE:-$root/target/release/moge}
threads=${THREADS:-2}
"$venv/bin/python" -c "import onnx, onnxscript, onnxruntime" 2>/dev/null \
  || "$venv/bin/pip" install -q onnx onnxscript onnxruntime
export OMP_NUM_THREADS=$threads MKL_NUM_THREADS=$threads
exec "$venv/bin/python" "$root/scripts/bench_onnxruntime.py" "$ckpt" --moge "$moge" --tokens "$tokens" --runs "$runs" --threads "$threads" \
  --rounds "${ROUNDS:-3}" --precisions "${PRECISIONS:-f32,bf16}" --ort-variants "${ORT_VARIANTS:-fp32,int8-dynamic,int8-static}" \
  ${CACHE:+--cache "$CACHE"} ${JSON:+--json "$JSON"}
