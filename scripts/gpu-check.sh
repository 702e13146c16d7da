#!/usr/bin/env bash
# The CUDA device measured on a GPU machine, in one command, against upstream PyTorch on the same GPU.
#
#   scripts/gpu-check.sh --prepare     here, after scripts/build-cuda.sh: fills .gpu-bundle/ (the CUDA
#                                      binary stripped and gzipped, the dlr-moge / dlr-utils3d / numpy
#                                      wheels, 1080p JPEGs); carry .gpu-bundle with the checkout
#   scripts/gpu-check.sh               on the GPU machine (python3 with CUDA torch, no network, no Rust);
#                                      with the device tool: run(command="bash scripts/gpu-check.sh",
#                                      carry=[".gpu-bundle"]); split it with --only vits-normal and
#                                      --only vitl-normal where one call's time limit is short
#   scripts/gpu-check.sh --dry-run     every step that can run on a CPU machine, small and on the CPU
#
# Options: --only vits-normal,vitl-normal   --images N (batch, default 320)   --runs N (default 20)
#          --skip-torch   --skip-compile   --moge PATH (a moge binary instead of the bundle's)
#          --budget S (default 540: steps that would start later are skipped, each is cut at what is left)
# Environment: PYTHON (default python3; --dry-run: venv/bin/python where present), MOGE_GPU_CHECK_WORK.
#
# For ViT-S and ViT-L with synthetic weights (tests/make_fullsize_reference.py's configs, generated
# here with tests/synth_weights.py at its fixed seed) at 1800 tokens on 1920x1080 it prints:
# parity of the CUDA forward (bf16 and f32) against the CPU f32 forward (PCC of points, depth and
# normal, mask agreement, pass at PCC >= 0.9999; on CUDA also a graph replay's); forward and
# model-call time (`moge bench`, op by op and by CUDA graph replay);
# `moge batch` images/s on 1080p JPEGs writing png; upstream MoGeModel on the same device: eager
# fp32, bf16 autocast, torch.compile(mode="reduce-overhead") under bf16 autocast. The JSON lines
# land in $OUT/results.jsonl where that is set (the device tool's), else in
# $MOGE_GPU_CHECK_WORK/results.jsonl, each step's stderr beside them in logs/. Exit 1 if a parity
# check fails (not in a dry run, whose CPU bf16 against CPU f32 is only reported).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
start=$(date +%s)

mode=gpu
variants=vits-normal,vitl-normal
images=320
runs=20
skip_torch=0
skip_compile=0
moge=
budget=540
while [ $# -gt 0 ]; do
    case "$1" in
        --prepare) mode=prepare; shift ;;
        --dry-run) mode=dry; shift ;;
        --only) variants=$2; shift 2 ;;
        --images) images=$2; shift 2 ;;
        --runs) runs=$2; shift 2 ;;
        --skip-torch) skip_torch=1; shift ;;
        --skip-compile) skip_compile=1; shift ;;
        --moge) moge=$2; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done

bundle=$root/.gpu-bundle
say() { printf '[gpu-check %4ss] %s\n' "$(( $(date +%s) - start ))" "$*"; }

if [ "$mode" = prepare ]; then
    bin=$root/target/cuda/release/moge
    [ -x "$bin" ] || { echo "gpu-check.sh: no $bin: run scripts/build-cuda.sh first" >&2; exit 2; }
    py=${PYTHON:-$root/venv/bin/python}
    mkdir -p "$bundle/wheels" "$bundle/jpeg"
    strip --strip-debug -o "$bundle/moge" "$bin"
    gzip -9 -f "$bundle/moge"
    # The reference model; numpy for the GPU machine's python 3.12 in case it has none.
    "$py" -m pip download --quiet --no-deps -d "$bundle/wheels" dlr-moge==2.0.0 dlr-utils3d==1.3
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$bundle/wheels" "numpy>=1.26,<3"
    "$py" scripts/gpu_check.py jpegs "$bundle/jpeg" 4 1920 1080 >/dev/null
    say "bundle ready: $(du -sh "$bundle" | cut -f1) in $bundle (carry it with the checkout)"
    ls -la "$bundle" "$bundle/wheels"
    exit 0
fi

work=${MOGE_GPU_CHECK_WORK:-${TMPDIR:-/tmp}/moge-gpu-check}
rm -rf "$work"
mkdir -p "$work"
# Results and logs go straight to $OUT where the device tool gave one: a call that runs out of
# time still returns what it measured.
results=${OUT:-$work}/results.jsonl
logs=${OUT:-$work}/logs
mkdir -p "$logs"
: > "$results"
record() { python3 -c 'import json,sys; print(json.dumps(dict(a.split("=",1) for a in sys.argv[1:])))' "$@" | tee -a "$results"; }
skip() { say "skipped $1: $2"; record step=skip "what=$1" "why=$2" >/dev/null; }

if [ "$mode" = dry ]; then
    # Small and on the CPU: the same steps, sizes and devices swapped.
    dev=cpu; width=320; height=240; tokens=300; runs=1; warm=1; images=4
    # bf16 on the CPU (auto may be f32 here) so that the comparison sees two different arithmetics.
    precs="bf16 f32"
    py=${PYTHON:-$root/venv/bin/python}
    [ -x "$py" ] || py=python3
    moge=${moge:-$root/target/release/moge}
    variants=vits-normal
    skip_compile=1
else
    dev=cuda; width=1920; height=1080; tokens=1800; warm=3
    precs="auto f32"
    py=${PYTHON:-python3}
    if [ -z "$moge" ]; then
        [ -f "$bundle/moge.gz" ] || { echo "gpu-check.sh: no $bundle/moge.gz: run --prepare where the CUDA build is" >&2; exit 2; }
        gunzip -c "$bundle/moge.gz" > "$work/moge"
        chmod +x "$work/moge"
        moge=$work/moge
    fi
fi
[ -x "$moge" ] || { echo "gpu-check.sh: no moge binary at $moge" >&2; exit 2; }
say "moge: $moge ($("$moge" --version))"

# Python: torch from the machine, dlr-moge from the bundle where it is not installed.
have_torch=0
if "$py" -c 'import torch' 2>/dev/null; then
    have_torch=1
    if ! "$py" scripts/gpu_check.py probe >/dev/null 2>&1; then
        if ls "$bundle"/wheels/dlr_moge-*.whl >/dev/null 2>&1; then
            want=("$bundle"/wheels/dlr_moge-*.whl "$bundle"/wheels/dlr_utils3d-*.whl)
            "$py" -c 'import numpy' 2>/dev/null || want+=("$bundle"/wheels/numpy-*.whl)
            "$py" -m pip install --quiet --no-deps --no-index --target "$work/pylib" "${want[@]}"
            export PYTHONPATH=$work/pylib${PYTHONPATH:+:$PYTHONPATH}
        fi
    fi
    "$py" scripts/gpu_check.py probe || { have_torch=0; torch_why="dlr-moge cannot be imported by $py"; }
else
    torch_why="$py has no torch"
fi
if [ "$dev" = cuda ]; then
    # The CUDA libraries of the machine's torch wheels (cuBLAS, cuRAND, NVRTC, cuDNN).
    libs=$("$py" -c 'import glob, os, site; print(":".join(sorted(d for s in site.getsitepackages() + [site.getusersitepackages()] for d in glob.glob(os.path.join(s, "nvidia", "*", "lib")))))' 2>/dev/null || true)
    export LD_LIBRARY_PATH=${libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
fi
say "$("$moge" info 2>/dev/null | grep '^device' || echo 'device: (moge info failed)')"

# Checkpoints: the full-size configs with synthetic weights (torch writes the .pt); without torch
# (CI), the tiny fixture checkpoint stands in so the rest of the steps still run.
declare -A ckpt
if [ "$have_torch" = 1 ]; then
    say "synthetic checkpoints: $variants"
    "$py" scripts/gpu_check.py checkpoints "$work/ckpt" ${variants//,/ } | tee -a "$results"
    for v in ${variants//,/ }; do ckpt[$v]=$work/ckpt/$v.pt; done
else
    skip "upstream checkpoints and timings" "$torch_why"
    variants=tiny_normal
    ckpt[tiny_normal]=$root/tests/fixtures/tiny_normal.pt
fi

# Inputs: the bundle's 1080p JPEGs, repeated; in a dry run, small JPEGs (or the fixture PNGs).
mkdir -p "$work/photos"
if [ "$mode" = dry ]; then
    if "$py" -c 'import PIL, numpy' 2>/dev/null; then
        "$py" scripts/gpu_check.py jpegs "$work/src" 3 "$width" "$height" >/dev/null
    else
        mkdir -p "$work/src" && cp tests/fixtures/images/rgb_64x48.png tests/fixtures/images/rgb_40x72.png "$work/src/"
    fi
    src=$work/src
else
    src=$bundle/jpeg
fi
srcs=("$src"/*)
for i in $(seq 0 $(( images - 1 ))); do
    f=${srcs[$(( i % ${#srcs[@]} ))]}
    cp "$f" "$work/photos/$(printf '%05d' "$i").${f##*.}"
done
first=${srcs[0]}
if [ "$mode" != dry ]; then
    # The check's photo at exactly 1920x1080.
    first=$work/photos/00000.jpg
fi

# Every step is bounded (--budget, then the step's own cap) and a failing step is recorded and
# passed over, so one call on a lent machine returns everything that worked, most important first:
# parity, then moge's timings, then batch, then upstream eager, then torch.compile (the slowest).
step() { # step NAME CAP_S CMD...: runs CMD under a timeout, its stderr kept; 0 even when it fails
    local name=$1 cap=$2; shift 2
    local left=$(( budget - ($(date +%s) - start) ))
    if [ "$left" -lt 10 ]; then
        skip "$name" "out of time (--budget $budget s)"
        return 1
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    local log=$logs/$(echo "$name" | tr -c 'A-Za-z0-9_.-' _).log
    local t0=$(date +%s) rc=0
    timeout --kill-after=5 "$cap" "$@" 2> "$log" || rc=$?
    if [ "$rc" != 0 ]; then
        local why
        why=$(grep -v '^\s*$' "$log" | tail -n 3 | tr '\n' ' ' | cut -c1-400)
        [ "$rc" = 124 ] && why="timed out after $cap s. $why"
        say "FAILED $name (exit $rc): $why" >&2
        record step=fail "what=$name" "rc=$rc" "why=$why" "seconds=$(( $(date +%s) - t0 ))" >/dev/null
        return 1
    fi
    return 0
}

# 1. Parity: the device (default precision, and f32) against the CPU's f32 forward.
for v in ${variants//,/ }; do
    ck=${ckpt[$v]}
    common=(--weights "$ck" --num-tokens "$tokens")
    say "$v: parity on $(basename "$first")"
    step "$v cpu f32 reference" 180 "$moge" predict "$first" "${common[@]}" --device cpu --precision f32 --format npz --npz-compression none -o "$work/ref-$v" >/dev/null || continue
    ref=$work/ref-$v/$(basename "${first%.*}").npz
    for prec in $precs; do
        step "$v $dev $prec predict" 120 "$moge" predict "$first" "${common[@]}" --device "$dev" --precision "$prec" --format npz --npz-compression none -o "$work/got-$v-$prec" >/dev/null || continue
        label="$v $dev $prec vs cpu f32"
        "$py" scripts/gpu_check.py compare "$ref" "$work/got-$v-$prec/$(basename "${first%.*}").npz" --label "$label" | tee -a "$results" || true
        # On CUDA the first forward of a grid is the op-by-op run a graph is captured after; the
        # photo twice in one batch checks the replay as well.
        [ "$dev" = cuda ] || continue
        mkdir -p "$work/pair"
        ln -sf "$first" "$work/pair/a.jpg"
        ln -sf "$first" "$work/pair/b.jpg"
        step "$v $dev $prec batch of two" 120 "$moge" batch "$work/pair" "${common[@]}" --device "$dev" --precision "$prec" --format npz --npz-compression none -o "$work/pair-$v-$prec" --quiet || continue
        for f in a b; do
            "$py" scripts/gpu_check.py compare "$ref" "$work/pair-$v-$prec/$f.npz" --label "$v $dev $prec batch $f vs cpu f32" | tee -a "$results" || true
        done
    done
done

# 2. Forward and model call: `moge bench`, with the time of each part of the network.
for v in ${variants//,/ }; do
    common=(--weights "${ckpt[$v]}" --num-tokens "$tokens")
    # The model call op by op (MOGE_CUDA_GRAPHS=0), then by graph replay (CUDA only).
    modes="eager"
    [ "$dev" = cuda ] && modes="eager graph"
    for prec in $precs; do for how in $modes; do
        say "$v: bench $dev $prec $how"
        graphs=1
        [ "$how" = eager ] && graphs=0
        step "$v bench $dev $prec $how" 150 env MOGE_CUDA_GRAPHS=$graphs "$moge" bench "$first" "${common[@]}" --device "$dev" --precision "$prec" --runs "$runs" --warmup "$warm" --json > "$work/bench-$v-$prec-$how.json" || continue
        python3 - "$work/bench-$v-$prec-$how.json" "$v" "$how $prec" <<'PY' | tee -a "$results"
import json, sys
b = json.load(open(sys.argv[1]))
net = ("encoder", "neck", "points_head", "normal_head", "mask_head", "scale_head")
fwd = sum(b["stages"][k]["median_s"] for k in net if k in b["stages"])
c = b["conditions"]
print(json.dumps({"step": "moge-bench", "variant": sys.argv[2], "label": sys.argv[3], "device": c["device"], "gpu": c.get("gpu"),
                  "precision": c["precision"], "grid": c["grid"], "forward_ms": round(1e3 * fwd, 2),
                  "model_call_ms": round(1e3 * b["model_call_s"]["median"], 2), "per_image_ms": round(1e3 * b["per_image_s"]["median"], 2),
                  "model_call_min_ms": round(1e3 * b["model_call_s"]["min"], 2), "cuda_graphs": c.get("cuda_graphs"),
                  "parts_ms": {k: round(1e3 * v["median_s"], 2) for k, v in b["stages"].items()}}))
PY
    done; done
done

# 3. moge batch: images/s writing png. Two runs (a fifth of the photos, then all) so the steady
# rate excludes the fixed start-up (weights, kernel loading).
n_small=$(( images / 5 > 0 ? images / 5 : 1 ))
mkdir -p "$work/few"
ls "$work/photos" | head -n "$n_small" | while read -r f; do ln -sf "$work/photos/$f" "$work/few/$f"; done
for v in ${variants//,/ }; do
    common=(--weights "${ckpt[$v]}" --num-tokens "$tokens")
    say "$v: batch $dev png"
    ok=1
    for set in few photos; do
        rm -rf "$work/out-batch"
        t0=$(date +%s.%N)
        step "$v batch $set" 200 "$moge" batch "$work/$set" -o "$work/out-batch" "${common[@]}" --device "$dev" --format png --quiet || { ok=0; break; }
        t1=$(date +%s.%N)
        n=$(ls "$work/$set" | wc -l)
        secs=$(python3 -c "print(round($t1 - $t0, 3))")
        [ "$set" = few ] && { few_n=$n; few_s=$secs; }
        wrote=$(ls "$work/out-batch" | grep -c '\.depth\.png$' || true)
        if [ "$wrote" != "$n" ]; then
            record step=fail "what=$v batch $set" "why=batch wrote $wrote of $n depth maps" >/dev/null
            ok=0; break
        fi
    done
    [ "$ok" = 1 ] || continue
    record step=moge-batch "variant=$v" "label=$dev whole run" "images=$n" "seconds=$secs" "images_per_s=$(python3 -c "print(round($n / $secs, 1))")" >/dev/null
    record step=moge-batch "variant=$v" "label=$dev steady" "images=$(( n - few_n ))" "seconds=$(python3 -c "print(round($secs - $few_s, 3))")" \
        "images_per_s=$(python3 -c "d = $secs - $few_s; print(round(($n - $few_n) / d, 1) if d > 0 else 'n/a')")" >/dev/null
    tail -2 "$results"
done

# 4, 5. Upstream on the same device: eager fp32 and bf16 autocast, then torch.compile.
if [ "$have_torch" = 1 ] && [ "$skip_torch" = 0 ]; then
    for modes in "eager-fp32 bf16-autocast" compile-bf16; do
        if [ "$modes" = compile-bf16 ] && [ "$skip_compile" = 1 ]; then
            skip "torch.compile" "--skip-compile (a dry run skips it: minutes of compiling on a CPU)"
            continue
        fi
        for v in ${variants//,/ }; do
            say "$v: upstream PyTorch $modes"
            step "$v torch $modes" 240 "$py" scripts/gpu_check.py torch "${ckpt[$v]}" --device "$dev" --width "$width" --height "$height" --tokens "$tokens" --runs "$runs" --warmup "$warm" --modes $modes | tee -a "$results" || true
        done
    done
fi

say "done in $(( $(date +%s) - start )) s; results in $results"
if [ "$mode" = dry ]; then
    # A dry run checks the steps; the CPU's bf16 against its f32 is reported, not gated.
    python3 scripts/gpu_check.py summary "$results" || true
else
    python3 scripts/gpu_check.py summary "$results"
fi
