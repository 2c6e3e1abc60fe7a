#!/usr/bin/env bash
# On a GPU machine: two wgrad binaries' `bench step` medians, alternated round by round in one
# call (the way PROFILING.md's A/B rows are measured: one process a round, so the spread between
# processes shows). Usage:
#   benches/reference/ab_steps.sh path/to/base path/to/new [shapes, default 4x128:8,8x512:3]
# A shape is BxT[:ROUNDS] (3 rounds by default); odd rounds run base first, even rounds new
# first. Env: PRESET (default distilgpt2), FLAGS (default --amp), STEPS (default 40), WARMUP
# (default 5), OUT (default /tmp).
# Prints `shape label round median min dispatches loss`; the JSON of each run, with `bin` and
# `round` added, goes to $OUT/ab.jsonl (overwritten), the binaries' stderr to $OUT/ab.err; last,
# each label's median of rounds.
set -euo pipefail
BASE=$1; NEW=$2
SHAPES=${3:-4x128:8,8x512:3}
OUT=${OUT:-/tmp}
: > "$OUT/ab.jsonl"
: > "$OUT/ab.err"
for s in ${SHAPES//,/ }; do
  shape=${s%%:*}; rounds=3; [ "$s" != "$shape" ] && rounds=${s#*:}
  b=${shape%x*}; t=${shape#*x}
  for r in $(seq "$rounds"); do
    order="base new"; [ $((r % 2)) = 0 ] && order="new base"
    for label in $order; do
      bin=$BASE; [ "$label" = new ] && bin=$NEW
      "$bin" bench step --preset "${PRESET:-distilgpt2}" --batch "$b" --seq "$t" ${FLAGS---amp} \
        --steps "${STEPS:-40}" --warmup "${WARMUP:-5}" --json 2>>"$OUT/ab.err" \
        | python3 -c "
import json, sys
d = json.load(sys.stdin); d['bin'] = '$label'; d['round'] = $r
print(json.dumps(d), file=open('$OUT/ab.jsonl', 'a'))
print('$shape', '$label', $r, round(d['median_ms'], 3), round(d['min_ms'], 3), d['dispatches_per_step'], d['loss_last'])"
    done
  done
done
python3 - "$OUT/ab.jsonl" <<'PY'
import collections, json, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    d = json.loads(line)
    runs[(d['model'], d['amp'], d['batch'], d['seq'], d['bin'])].append(d['median_ms'])
for (model, amp, b, t, label), ms in sorted(runs.items()):
    amp = " --amp" if amp else ""
    print(f"{model} {b}x{t}{amp} {label}: median of {len(ms)} rounds {statistics.median(ms):.3f} ms ({min(ms):.3f}-{max(ms):.3f})")
PY
