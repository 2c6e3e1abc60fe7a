#!/usr/bin/env bash
# On a GPU machine with nvcc: GPT-2 124M training steps in llm.c (karpathy/llm.c, MIT; fetched
# into .gt/llmc and carried, never vendored), wgrad (`bench step --preset gpt2 --amp`) and
# PyTorch best (benches/reference/torch_gpt2.py --best), random weights and random tokens, at the
# same shapes; one table: shape | wgrad ms | llm.c ms | PyTorch best ms | wgrad/llm.c | wgrad/PyTorch
# (each the median step after the warm-up). Usage, from the repository root:
#   benches/reference/llmc_compare.sh [--json] [llm.c dir, default .gt/llmc]
#       [path/to/wgrad, default target/release/wgrad] [shapes, default 8x1024,8x512]
# --json prints one JSON object a shape instead of the table.
# Env: STEPS, WARMUP (default 30, 5), OUT (default /tmp; the build, the data and every raw log go
# there), TUNE (default 1: search wgrad's tiles first, as compare.sh does), LLMC_CC (the compute
# capability, e.g. 90; default from nvidia-smi, else PyTorch), LLMC_BIN (a train_gpt2cu built
# before, e.g. $OUT/llmc_build/train_gpt2cu: no build), LLMC_ARGS (more train_gpt2cu flags,
# default `-r 0`: no GELU recompute in the backward, as wgrad and PyTorch keep it; set it empty
# for llm.c's defaults).
#
# llm.c is copied to $OUT/llmc_build and built there with
#   make train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=$LLMC_CC
# once llmc/cuda_utils.cuh's out-of-memory fallback to managed memory is removed (CUDA 13's
# cudaMemAdvise takes a cudaMemLocation, so the fallback no longer compiles; and this comparison
# keeps no managed memory: out of memory is an error). Its run, per shape:
#   -e d12             random GPT-2 124M (llm.c's own init, seed 42), bf16 with f32 master weights
#   -b B -t T          the shape; -x WARMUP+STEPS steps, the first WARMUP dropped
#   -i, -j             random tokens in llm.c's .bin format (llmc_compare.py tokens)
#   -v, -s N+1         past the last step, so validation runs at step 0 and after the last step
#                      only, sampling after the last only, both untimed (-v 0 would divide by
#                      zero in `step % val_loss_every`)
#   -m 1 -g 1          one validation batch; no sampled tokens (the last step samples whatever
#                      -s is, and without gpt2_tokenizer.bin its start token is never set)
#   -l 1e-4 -c 0.1 -k constant   AdamW as bench step and torch_gpt2.py set it
#   no -o, no -n       no log files, no checkpoints
# llm.c's step time is its own (`step N/M | ... | X ms |`: CUDA events around data loading,
# forward, backward, the gradient norm read back and AdamW), the others' as they report it.
# Precisions differ as each engine's own: llm.c bf16, wgrad --amp f16 with loss scaling, PyTorch
# best bf16 autocast; all three keep f32 master weights.
set -euo pipefail
JSON=""
if [ "${1:-}" = --json ]; then JSON=--json; shift; fi
HERE=$(cd "$(dirname "$0")" && pwd)
LLMC_SRC=${1:-.gt/llmc}
WGRAD=${2:-target/release/wgrad}
SHAPES=${3:-8x1024,8x512}
STEPS=${STEPS:-30}
WARMUP=${WARMUP:-5}
OUT=${OUT:-/tmp}
LLMC_ARGS=${LLMC_ARGS--r 0}
TOOLS="$HERE/llmc_compare.py"
N=$((WARMUP + STEPS))
mkdir -p "$OUT"

die() { echo "llmc_compare.sh: $*" >&2; exit 1; }
note() { echo "llmc_compare.sh: $*" >&2; }

# --- llm.c's build ---------------------------------------------------------------------------
if [ -n "${LLMC_BIN:-}" ]; then
  [ -x "$LLMC_BIN" ] || die "LLMC_BIN=$LLMC_BIN is not an executable"
  LLMC=$(cd "$(dirname "$LLMC_BIN")" && pwd)/$(basename "$LLMC_BIN")
else
  [ -f "$LLMC_SRC/train_gpt2.cu" ] && [ -f "$LLMC_SRC/llmc/cuda_utils.cuh" ] \
    || die "no llm.c at $LLMC_SRC (fetch karpathy/llm.c and export its tree there, e.g. into .gt/llmc)"
  if ! command -v nvcc > /dev/null; then
    [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc is not on PATH nor at /usr/local/cuda/bin/nvcc"
    PATH="/usr/local/cuda/bin:$PATH"  # llm.c's Makefile finds nvcc with `which`
  fi
  CC_GPU=${LLMC_CC:-}
  if [ -z "$CC_GPU" ] && command -v nvidia-smi > /dev/null; then
    CC_GPU=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -n 1 | tr -d ' .')
  fi
  if [ -z "$CC_GPU" ]; then
    CC_GPU=$(python3 -c 'import torch; print("%d%d" % torch.cuda.get_device_capability())' 2> /dev/null || true)
  fi
  [ -n "$CC_GPU" ] \
    || die "no compute capability from nvidia-smi or PyTorch; set LLMC_CC, e.g. LLMC_CC=90 for H100"
  # The Makefile links -lnvidia-ml; where the driver has only libnvidia-ml.so.1, the toolkit's
  # stub links it (its soname is the driver's, which the binary loads when it runs).
  CUDA_ROOT=$(dirname "$(dirname "$(command -v nvcc)")")
  STUBS=""
  for d in "$CUDA_ROOT/lib64/stubs" "$CUDA_ROOT/targets/x86_64-linux/lib/stubs"; do
    [ -f "$d/libnvidia-ml.so" ] && STUBS="-L$d" && break
  done
  BUILD="$OUT/llmc_build"
  rm -rf "$BUILD"
  mkdir -p "$BUILD"
  cp -r "$LLMC_SRC/." "$BUILD/"
  python3 "$TOOLS" unmanage "$BUILD/llmc/cuda_utils.cuh" \
    || die "llm.c's managed-memory fallback (llmc/cuda_utils.cuh, cudaMallocConditionallyManaged)" \
      "is not as llmc_compare.py's FALLBACK expects: a newer llm.c? read the function and mend FALLBACK"
  note "building llm.c's train_gpt2cu for sm_$CC_GPU with $(nvcc --version | tail -n 1) (log: $BUILD.log)"
  make -C "$BUILD" train_gpt2cu NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 \
    GPU_COMPUTE_CAPABILITY="$CC_GPU" NVCC_LDLIBS="$STUBS" > "$BUILD.log" 2>&1 \
    || { tail -n 40 "$BUILD.log" >&2; die "llm.c's build failed (the whole log: $BUILD.log)"; }
  LLMC="$BUILD/train_gpt2cu"
fi

# --- random tokens, enough for the largest shape's steps without wrapping -----------------------
MAX_BT=0
for s in ${SHAPES//,/ }; do
  b=${s%x*}; t=${s#*x}
  if [ $((b * t)) -gt "$MAX_BT" ]; then MAX_BT=$((b * t)); fi
done
DATA="$OUT/llmc_data"
mkdir -p "$DATA"
python3 "$TOOLS" tokens "$DATA/train.bin" $(((N + 2) * MAX_BT + 1))
python3 "$TOOLS" tokens "$DATA/val.bin" $((MAX_BT + 1))

# --- llm.c ---------------------------------------------------------------------------------------
: > "$OUT/llmc_steps.jsonl"
for s in ${SHAPES//,/ }; do
  b=${s%x*}; t=${s#*x}
  log="$OUT/llmc_$s.log"
  note "llm.c $s (log: $log)"
  # shellcheck disable=SC2086  # LLMC_ARGS is a list of flags
  (cd "$(dirname "$LLMC")" && "$LLMC" -e d12 -b "$b" -t "$t" -x "$N" -v $((N + 1)) -s $((N + 1)) \
    -m 1 -g 1 -l 1e-4 -c 0.1 -k constant -i "$DATA/train.bin" -j "$DATA/val.bin" $LLMC_ARGS) \
    > "$log" 2>&1 || note "llm.c $s failed (exit $?); its log: $log"
  python3 "$TOOLS" steps "$log" "$b" "$t" "$WARMUP" >> "$OUT/llmc_steps.jsonl"
done

# --- wgrad ---------------------------------------------------------------------------------------
: > "$OUT/wgrad_steps.jsonl"
for s in ${SHAPES//,/ }; do
  b=${s%x*}; t=${s#*x}
  if [ "${TUNE:-1}" = 1 ]; then
    "$WGRAD" bench step --preset gpt2 --batch "$b" --seq "$t" --amp --steps 1 --warmup 1 --tune \
      > "$OUT/wgrad_tune_$s.log" 2>&1 || note "wgrad tuning $s failed; its log: $OUT/wgrad_tune_$s.log"
  fi
  note "wgrad $s"
  if "$WGRAD" bench step --preset gpt2 --batch "$b" --seq "$t" --amp --steps "$STEPS" --warmup "$WARMUP" --json \
    > "$OUT/wgrad_$s.json" 2> "$OUT/wgrad_$s.log"; then
    python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$OUT/wgrad_$s.json" \
      >> "$OUT/wgrad_steps.jsonl"
  else
    note "wgrad $s failed; its log: $OUT/wgrad_$s.log"
  fi
done

# --- PyTorch best --------------------------------------------------------------------------------
# One process a shape: in one process torch.compile recompiles a later shape with dynamic
# shapes, which ran 8 x 512 at 28.9 ms after 8 x 1024 against 13.7 for llm.c (H100, 2026-11-28).
: > "$OUT/torch_steps.jsonl"
for s in ${SHAPES//,/ }; do
  note "PyTorch best $s (log: $OUT/torch_$s.log)"
  python3 "$HERE/torch_gpt2.py" --config "$HERE/../../models/gpt2/config.json" --shapes "$s" --best \
    --steps "$STEPS" --warmup "$WARMUP" >> "$OUT/torch_steps.jsonl" 2> "$OUT/torch_$s.log" \
    || note "PyTorch $s failed; its log: $OUT/torch_$s.log"
done

python3 "$TOOLS" table "$OUT/wgrad_steps.jsonl" "$OUT/llmc_steps.jsonl" "$OUT/torch_steps.jsonl" "$SHAPES" $JSON
