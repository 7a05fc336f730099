#!/usr/bin/env bash
# `spyglass report` pages in Debian's chromium (report_check.mjs: network
# blocked, steps, timeline, flame graph), for a run with known numbers and
# memory profiles of an unmodified program beside it, for one .xplane.pb
# with --memory, and for a run that JAX wrote.
#   run_report_test.sh SPYGLASS_CLI LIBSPYGLASS_HEAP MAKE_KNOWN_RUN HEAP_WORKLOAD CPU_WORKLOAD
set -euo pipefail
cli=$1 heap=$2 known=$3 workload=$4 cpu_workload=$5
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/playwright-core" ] || { echo "FAIL: run scripts/setup.sh --browser (npm ci in tests/browser)"; exit 1; }
T=$(mktemp -d /tmp/spyglass-report-XXXXXX)
trap 'rm -rf "$T"' EXIT
export SPYGLASS_HEAP_LIB=$heap

# 1. A log dir: the known run (5 steps of 10..50 ms; 300k more events on
#    "busy", so the whole view must be decimated; counters of known values;
#    a launch on loader per kernel) and memory.*.prof beside it. Its
#    interactions: the busiest thread first, the details of a click, a
#    search, a flow's two ends, step 3 as a range against spyglass summary.
"$known" "$T/log" --busy 300000 >/dev/null
"$cli" run -o "$T/log" -- "$workload" grow 5 >/dev/null 2>&1
"$cli" report "$T/log" -o "$T/report.html"
"$cli" summary "$T/log" --step 3 --json -n 0 >"$T/step3.json"
node "$here/report_check.mjs" "$T/report.html" --steps 5 --step-ms 10,20,30,40,50 \
  --order busy,main,loader,"Stream #7" --search gemm=5 --search forward=5 --search nothing_named_so=0 \
  --click "main/1@3=forward|4 ms|2 ms" --click "main/0@9=train|10 ms|2 ms" --enclosing "main/2@1=forward,train" \
  --flow "Stream #7/0@2=loader/cudaLaunchKernel@0.9" --range-vs-summary "$T/step3.json" \
  --thread-controls loader --step-jump 2 --summary-jump gemm_kernel=5 --summary-jump matmul=5 \
  --track main --track loader --track busy --track "Stream #7" --flame "build_table()" \
  --counter-at "memory cpu@90=memory cpu: 4.5 MiB" --counter-at "memory cpu@140=memory cpu: 5.5 MiB" \
  --counter-at "sm__cycles_active.avg@106=sm__cycles_active.avg: 52.5" \
  --tip-at "main/1@2=batch=64, phase=warmup" --tip-at "main/1@70=batch=64, phase=train" \
  --tip-at "main/0@5=step_num=1" --tip-at "Stream #7/0@2.5=tf_op=train"

# 1b. The same run in a page 4000 bytes under its full size: its finest
#     detail merged where it takes the most bytes; it says so, and its
#     search counts stay exact.
"$cli" report "$T/log/plugins/profile/run1/known.xplane.pb" -o "$T/full.html" >/dev/null
budget=$(( $(stat -c %s "$T/full.html") - 4000 ))
"$cli" report "$T/log/plugins/profile/run1/known.xplane.pb" --max-bytes "$budget" -o "$T/small.html"
size=$(stat -c %s "$T/small.html")
[ "$size" -le "$budget" ] || { echo "FAIL: small.html is $size bytes, over its budget of $budget"; exit 1; }
node "$here/report_check.mjs" "$T/small.html" --coarsened --search leaf=100000 --search outer=100000 --search gemm=5

# 2. One .xplane.pb, its memory profile named with --memory (the early one:
#    build_table's 640 KiB against grow_cache's 100 KiB).
early=$(ls "$T"/log/memory.*.1.prof)
"$cli" report "$T/log/plugins/profile/run1/known.xplane.pb" --memory "$early" -o "$T/one.html"
node "$here/report_check.mjs" "$T/one.html" --steps 5 --step-ms 10,20,30,40,50 --flame "build_table()"

# 2b. A trace of the unmodified program with --memory: counters only (live
#     bytes per device and per top call site), no span.
"$cli" run --trace "$T/memtrace" --memory -o "$T/memtrace" -- "$workload" grow 5 >/dev/null 2>&1
"$cli" report "$T/memtrace" -o "$T/memtrace.html"
node "$here/report_check.mjs" "$T/memtrace.html" --counter "memory cpu:0" --flame "build_table()" --shared-scale bytes

# 2c. The known run with a Python program's memory profile and a memory
#     timeline of known values beside it: the flame graph's views, and what
#     ranges of the memory chart held.
"$known" "$T/py" --python 1 >/dev/null
"$cli" report "$T/py" -o "$T/py.html"
node "$here/report_check.mjs" "$T/py.html" --steps 5 --python-flame \
  --memory-range "5:25=load|0 B|1 MiB|+1 MiB|1 MiB" --memory-range "5:25=parse|0 B|2 MiB|+2 MiB|2 MiB" \
  --memory-range "15:35=load|1 MiB|0 B|-1 MiB|1 MiB"

# 3. A run JAX wrote (jax.profiler, 3 steps), with no memory profile.
python3 - "$T/jaxlog" <<'PY'
import sys
import jax, jax.numpy as jnp
with jax.profiler.trace(sys.argv[1]):
    x = jnp.ones((64, 64))
    for i in range(3):
        with jax.profiler.StepTraceAnnotation("train", step_num=i):
            x = (x @ x).block_until_ready()
PY
"$cli" report "$T/jaxlog" -o "$T/jax.html"
node "$here/report_check.mjs" "$T/jax.html" --steps 3 --no-flame
# 4. The CPU sampler's profile of the known CPU workload (two threads): its
#    CPU flame graph, and the thread selector's totals; the flame graph of
#    the samples in a range dragged on the timeline.
"$cli" run --sample 999 -o "$T/cpu" -- "$cpu_workload" 1 >/dev/null 2>&1
"$cli" report "$T/cpu" -o "$T/cpu.html"
node "$here/report_check.mjs" "$T/cpu.html" --cpu-flame burn_a,burn_b,burn_c,main --cpu-range 100:400 --cpu-range 5:30
echo "run_report_test: all passed"
