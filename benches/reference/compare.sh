#!/usr/bin/env bash
# On a GPU machine: wgrad bench step and PyTorch (benches/reference/torch_gpt2.py) at the same
# shapes, one table with the ratio wgrad / PyTorch per row. Usage:
#   benches/reference/compare.sh [path/to/wgrad] [shapes, default 4x128,8x512,16x1024]
set -euo pipefail
WGRAD=${1:-target/release/wgrad}
SHAPES=${2:-4x128,8x512,16x1024}
OUT=${OUT:-/tmp}
: > "$OUT/wgrad_steps.jsonl"
for s in ${SHAPES//,/ }; do
  b=${s%x*}; t=${s#*x}
  "$WGRAD" bench step --preset distilgpt2 --batch "$b" --seq "$t" --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" --json \
    | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)))' >> "$OUT/wgrad_steps.jsonl" \
    || echo "{\"engine\": \"wgrad\", \"batch\": $b, \"seq\": $t, \"error\": \"failed\"}" >> "$OUT/wgrad_steps.jsonl"
done
python3 benches/reference/torch_gpt2.py --shapes "$SHAPES" --steps "${STEPS:-20}" --warmup "${WARMUP:-5}" > "$OUT/torch_steps.jsonl"
python3 - "$OUT/wgrad_steps.jsonl" "$OUT/torch_steps.jsonl" <<'PY'
import json, sys
w = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
t = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
print(f"{'B x T':>9} {'wgrad f32 ms':>13} {'torch mode':>13} {'torch ms':>9} {'wgrad/torch':>11}")
for r in w:
    key = (r.get("batch"), r.get("seq"))
    for p in t:
        if (p.get("batch"), p.get("seq")) != key:
            continue
        wm, pm = r.get("median_ms"), p.get("median_ms")
        ratio = f"{wm / pm:.2f}" if wm and pm else "n/a"
        print(f"{key[0]:>4} x {key[1]:<4} {wm if wm else float('nan'):>13.2f} {p['mode']:>13} {pm if pm else float('nan'):>9.2f} {ratio:>11}")
PY
