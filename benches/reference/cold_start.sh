#!/usr/bin/env bash
# On a GPU machine: step 0 of `wgrad bench step` with the driver's shader cache empty, as on a
# fresh machine. Each run gets a new, empty NVIDIA shader cache directory
# (__GL_SHADER_DISK_CACHE_PATH; its size after the run is printed, to show the driver used
# it), so no run reads what an earlier one compiled. Usage:
#   benches/reference/cold_start.sh "label=path/to/wgrad[:ENV=V ...]" ...
# e.g. cold_start.sh "new=target/release/wgrad" "serial=target/release/wgrad:WGRAD_COMPILE_THREADS=0"
# Env: SHAPES (default 4x128:amp,8x512:amp,8x512:f32), ROUNDS (default 2), OUT (default /tmp),
# PRESET (default distilgpt2).
# Prints one line per run; the JSON of each run goes to $OUT/cold_start.jsonl.
set -euo pipefail
SHAPES=${SHAPES:-4x128:amp,8x512:amp,8x512:f32}
OUT=${OUT:-/tmp}
: > "$OUT/cold_start.jsonl"
printf '%-8s %-10s %-5s %10s %10s %10s %10s %12s\n' run shape mode step0_ms pipelines compile_ms waited_ms driver_cache
for round in $(seq "${ROUNDS:-2}"); do
  for spec in "$@"; do
    label=${spec%%=*}; rest=${spec#*=}
    bin=${rest%%:*}; envs=""; [ "$rest" != "$bin" ] && envs=${rest#*:}
    for s in ${SHAPES//,/ }; do
      shape=${s%%:*}; mode=${s#*:}
      b=${shape%x*}; t=${shape#*x}
      flag=""; [ "$mode" = amp ] && flag="--amp"
      cache=$(mktemp -d)
      json=$(env $envs __GL_SHADER_DISK_CACHE_PATH="$cache" "$bin" bench step --preset "${PRESET:-distilgpt2}" \
        --batch "$b" --seq "$t" --steps 3 --warmup 1 $flag --json 2>/dev/null) || json='{}'
      size=$(du -sk "$cache" | cut -f1)
      rm -rf "$cache"
      echo "$json" | python3 -c "
import json, sys
r = json.load(sys.stdin)
r.update(run='$label', round=$round, shape='$shape', mode='$mode', driver_cache_kib=$size)
open('$OUT/cold_start.jsonl', 'a').write(json.dumps(r) + '\n')
g = lambda k: r.get(k)
f = lambda v: 'n/a' if v is None else (f'{v:.1f}' if isinstance(v, float) else str(v))
print(f\"{r['run']:<8} {r['shape']:<10} {r['mode']:<5} {f(g('step0_ms')):>10} {f(g('step0_pipelines_compiled')):>10} {f(g('step0_compile_ms')):>10} {f(g('step0_compile_wait_ms')):>10} {str(r['driver_cache_kib']) + ' KiB':>12}\")
"
    done
  done
done
