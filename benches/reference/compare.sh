#!/usr/bin/env bash
# On a GPU machine: wgrad bench step (f32, and --amp unless WGRAD_MODES=f32) and PyTorch
# (benches/reference/torch_gpt2.py: fp32, tf32, bf16 autocast, bf16 + torch.compile) at the
# same shapes, in one run; one table, a row per shape and wgrad mode, each PyTorch column
# `ms (wgrad / PyTorch)`. Usage:
#   benches/reference/compare.sh [path/to/wgrad] [shapes, default 4x128,8x512,16x1024]
# Env: STEPS, WARMUP (default 20, 5), WGRAD_MODES (default f32,amp), OUT (default /tmp),
# TUNE (default 1: first search the tiles of each shape and mode's products with
# `wgrad bench step --tune`, which writes the adapter's tile table; the timed runs read it).
# GPT-2 only. For the Llama anchor (SmolLM2-135M's shape), run the two by hand in one lease:
#   "$WGRAD" bench step --preset smollm2-135m --batch 8 --seq 1024 --amp --steps 20 --warmup 5 --json
#   python3 benches/reference/torch_llama.py --batch 8 --seq 1024 --steps 20 --warmup 5 --json
# (torch_llama.py is "PyTorch best": bf16 autocast, torch.compile, fused AdamW, SDPA; its
# `median_ms` against wgrad's; `python3 benches/reference/torch_gpt2.py --best` is the same
# configuration for GPT-2.)
set -euo pipefail
WGRAD=${1:-target/release/wgrad}
SHAPES=${2:-4x128,8x512,16x1024}
OUT=${OUT:-/tmp}
: > "$OUT/wgrad_steps.jsonl"
MODES=${WGRAD_MODES:-f32,amp}
if [ "${TUNE:-1}" = 1 ]; then
  for s in ${SHAPES//,/ }; do
    b=${s%x*}; t=${s#*x}
    for mode in ${MODES//,/ }; do
      flag=""; [ "$mode" = amp ] && flag="--amp"
      "$WGRAD" bench step --preset distilgpt2 --batch "$b" --seq "$t" --steps 1 --warmup 1 --tune $flag > /dev/null \
        || echo "tuning $s $mode failed" >&2
    done
  done
fi
for s in ${SHAPES//,/ }; do
  b=${s%x*}; t=${s#*x}
  for mode in ${MODES//,/ }; do
    flag=""; [ "$mode" = amp ] && flag="--amp"
    "$WGRAD" bench step --preset distilgpt2 --batch "$b" --seq "$t" --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" $flag --json \
      | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$OUT/wgrad_steps.jsonl" \
      || echo "{\"engine\": \"wgrad\", \"batch\": $b, \"seq\": $t, \"amp\": $([ "$mode" = amp ] && echo true || echo false), \"error\": \"failed\"}" >> "$OUT/wgrad_steps.jsonl"
  done
done
python3 benches/reference/torch_gpt2.py --shapes "$SHAPES" --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" > "$OUT/torch_steps.jsonl"
python3 - "$OUT/wgrad_steps.jsonl" "$OUT/torch_steps.jsonl" <<'PY'
import json, sys
w = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
modes = []
for p in t:
    if p.get("mode") not in modes:
        modes.append(p.get("mode"))
print(f"{'B x T':>9} {'wgrad':>5} {'wgrad ms':>9} " + " ".join(f"{m:>20}" for m in modes))
for r in w:
    key = (r.get("batch"), r.get("seq"))
    wm = r.get("median_ms")
    cells = []
    for m in modes:
        p = next((p for p in t if (p.get("batch"), p.get("seq")) == key and p.get("mode") == m), None)
        pm = p.get("median_ms") if p else None
        cells.append(f"{pm:.2f} ({wm / pm:.2f})" if wm and pm else "n/a")
    mode = "amp" if r.get("amp") else "f32"
    wms = f"{wm:.2f}" if wm else "failed"
    print(f"{key[0]:>4} x {key[1]:<4} {mode:>5} {wms:>9} " + " ".join(f"{c:>20}" for c in cells))
PY
