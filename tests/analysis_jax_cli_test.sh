#!/usr/bin/env bash
# Every command reads JAX's files: real jax.profiler writes two runs of a
# known loop; `spyglass summary` (text and --json) and `spyglass diff` (with
# and without the gate) read them, and a run of Spyglass's own against JAX's.
# Usage: analysis_jax_cli_test.sh <spyglass CLI>
set -euo pipefail
cli=$1
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 -c 'import jax.profiler' 2>/dev/null || fail "jax is not installed (scripts/setup.sh installs it)"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

record() {  # log_dir, sleep per step (s)
  JAX_PLATFORMS=cpu timeout 300 python3 - "$1" "$2" <<'PY'
import sys, time
import jax.profiler as profiler
with profiler.trace(sys.argv[1]):
    for step in range(5):
        with profiler.StepTraceAnnotation("train", step_num=step):
            with profiler.TraceAnnotation("work"):
                time.sleep(float(sys.argv[2]))
PY
}
record "$dir/base" 0.003
record "$dir/slow" 0.030

out=$("$cli" summary "$dir/base") || fail "summary exited $?"
grep -q "jax " <<<"$out" || fail "summary does not name the writer: $out"
grep -Eq "^  train +5 " <<<"$out" || fail "summary has no 5 train steps: $out"
awk 'length($0) > 100 { exit 1 }' <<<"$out" || fail "summary is wider than 100 columns"

"$cli" summary --json --top 3 "$dir/base" >"$dir/s.json" || fail "summary --json exited $?"
python3 - "$dir/s.json" <<'PY' || fail "summary --json content"
import json, sys
s = json.load(open(sys.argv[1]))
d = s["steps"]["duration"]
assert s["steps"]["name"] == "train" and d["count"] == 5, s["steps"]
assert d["min_ns"] >= 3e6 and d["p50_ns"] <= d["p90_ns"] <= d["p99_ns"] <= d["max_ns"], d
work = [r for r in s["top_total"] if r["name"] == "work"]
assert work and work[0]["count"] == 5 and work[0]["total_ns"] >= 15e6, s["top_total"]
assert len(s["top_total"]) <= 3
PY

# Unchanged (the same run twice) passes the gate; 10x slower steps fail it.
"$cli" diff --fail-above 5 "$dir/base" "$dir/base" >/dev/null || fail "diff of a run with itself failed the gate"
set +e
out=$("$cli" diff --fail-above 50 --annotation work "$dir/base" "$dir/slow" 2>&1)
rc=$?
set -e
[[ $rc == 1 ]] || fail "diff of 10x slower steps exited $rc, not 1: $out"
grep -q "step time regressed" <<<"$out" || fail "no step regression reported: $out"
grep -q "annotation 'work' regressed" <<<"$out" || fail "no 'work' regression reported: $out"
"$cli" diff --json "$dir/base" "$dir/slow" >"$dir/d.json" || fail "diff --json exited $?"
python3 - "$dir/d.json" <<'PY' || fail "diff --json content"
import json, sys
d = json.load(open(sys.argv[1]))
work = next(r for r in d["annotations"] if r["name"] == "work")
assert work["delta_pct"] > 300, work
assert d["per_step"] and d["passed"], d["failures"]
PY
echo "OK: summary and diff read JAX's files"
