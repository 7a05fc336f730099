#!/usr/bin/env bash
# `spyglass report` of a big run: the time and peak memory of writing the
# page, its size, and how fast Debian's chromium shows it (bench/report_bench.mjs)
# next to the floor, a naive page and speedscope (on a run of PEER_EVENTS:
# at 1M events it does not show the profile within minutes on a 2-vCPU VM).
#   bench/report_bench.sh [BUILD_DIR] [EVENTS] [RUNS] [PEER_EVENTS] [COUNTER_SAMPLES] [RANDOM_EVENTS]
#   (defaults: build 1000000 3 100000 0 0; PEER_EVENTS 0: no peer; EVENTS 0: no big_session_bench run)
# RANDOM_EVENTS > 0: then the same pages for a run of that many events of
# irregular gaps, durations and names (make_known_run --random: data that
# compresses little), whose page the size bound (--max-bytes, 20 MB) coarsens.
# COUNTER_SAMPLES > 0: then the same pages for a run with a counter track of
# that many samples (tests/report/make_known_run --counters).
# Needs: cmake --build BUILD_DIR --target spyglass_cli big_session_bench make_known_run;
# scripts/setup.sh --browser (chromium, tests/browser/node_modules).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build} events=${2:-1000000} runs=${3:-3} peer_events=${4:-100000} counter_samples=${5:-0}
random_events=${6:-0}
T=$(mktemp -d /tmp/spyglass-report-bench-XXXXXX)
trap 'rm -rf "$T"' EXIT
# The baselines of a page: naive, the same page drawing every event and
# sample (the level choice removed); the floor, the same bytes with the
# code left out.
baselines() {
  sed 's|for (let i = 1; i < levels.length; i++) if (levels\[i\]\[0\] <= nsPerPx) k = i;|;|' "$1" >"$2"
  cmp -s "$1" "$2" && { echo "report_bench: the naive variant could not be made (report.js changed?)"; exit 1; }
  python3 - "$1" "$3" <<'PY'
import re, sys
page = open(sys.argv[1]).read()
open(sys.argv[2], 'w').write(re.sub(r'<script>.*?</script>', '<script></script>', page, flags=re.S))
PY
}
if [ "$events" != 0 ]; then
"$build/bench/big_session_bench" --events "$events" --dir "$T" >/dev/null
echo "run: $events events, big.xplane.pb $(stat -c %s "$T/big.xplane.pb") bytes"
best=""
for i in $(seq "$runs"); do
  /usr/bin/time -f "%e %U %S %M" -o "$T/time" "$build/spyglass" report "$T/big.xplane.pb" -o "$T/report.html" \
    >/dev/null 2>"$T/stderr"
  read -r s user sys kb <"$T/time"
  echo "spyglass report: ${s} s wall, ${user} s user + ${sys} s sys, peak RSS $((kb / 1024)) MiB"
  /usr/bin/time -f "%e %U %S %M" -o "$T/time" "$build/spyglass" summary "$T/big.xplane.pb" >/dev/null 2>&1
  read -r s user sys kb <"$T/time"
  echo "  (spyglass summary of the same file: ${s} s wall, ${user} s user + ${sys} s sys, peak RSS $((kb / 1024)) MiB)"
done
echo "report.html: $(stat -c %s "$T/report.html") bytes"
baselines "$T/report.html" "$T/naive.html" "$T/floor.html"
peer=""
if [ "$peer_events" != 0 ]; then
  mkdir "$T/peer"
  "$build/bench/big_session_bench" --events "$peer_events" --dir "$T/peer" >/dev/null
  mv "$T/peer/big.trace.json.gz" "$T/peer/big_${peer_events}_events.trace.json.gz"
  peer=$T/peer/big_${peer_events}_events.trace.json.gz
fi
node "$root/bench/report_bench.mjs" "$runs" "$T/report.html" "$T/naive.html" "$T/floor.html" $peer
fi
if [ "$counter_samples" != 0 ]; then
  "$build/tests/report/make_known_run" "$T/counters" --counters "$counter_samples" >/dev/null
  "$build/spyglass" report "$T/counters" -o "$T/counters.html" >/dev/null 2>&1
  echo "counters run: $counter_samples samples of one counter; counters.html: $(stat -c %s "$T/counters.html") bytes"
  baselines "$T/counters.html" "$T/counters_naive.html" "$T/counters_floor.html"
  node "$root/bench/report_bench.mjs" "$runs" "$T/counters.html" "$T/counters_naive.html" "$T/counters_floor.html"
fi
if [ "$random_events" != 0 ]; then
  "$build/tests/report/make_known_run" "$T/random" --random "$random_events" >/dev/null
  /usr/bin/time -f "%e %U %S %M" -o "$T/time" "$build/spyglass" report "$T/random" -o "$T/random.html" >"$T/out" 2>"$T/stderr"
  read -r s user sys kb <"$T/time"
  echo "random run: $random_events irregular events; spyglass report: ${s} s wall, ${user} s user + ${sys} s sys, peak RSS $((kb / 1024)) MiB"
  sed 's/^/  /' "$T/out"
  echo "random.html: $(stat -c %s "$T/random.html") bytes"
  baselines "$T/random.html" "$T/random_naive.html" "$T/random_floor.html"
  node "$root/bench/report_bench.mjs" "$runs" "$T/random.html" "$T/random_naive.html" "$T/random_floor.html"
fi
