#!/usr/bin/env bash
# `spyglass report` of a big run: the time and peak memory of writing the
# page, its size, and how fast Debian's chromium shows it (bench/report_bench.mjs)
# next to the floor, a naive page and speedscope (on a run of PEER_EVENTS:
# at 1M events it does not show the profile within minutes on a 2-vCPU VM).
#   bench/report_bench.sh [BUILD_DIR] [EVENTS] [RUNS] [PEER_EVENTS]   (defaults: build 1000000 3 100000; 0: no peer)
# Needs: cmake --build BUILD_DIR --target spyglass_cli big_session_bench;
# scripts/setup.sh --browser (chromium, tests/browser/node_modules).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build} events=${2:-1000000} runs=${3:-3} peer_events=${4:-100000}
T=$(mktemp -d /tmp/spyglass-report-bench-XXXXXX)
trap 'rm -rf "$T"' EXIT
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
# The naive page: the same page drawing every event (the level choice removed).
sed 's|for (let i = 1; i < levels.length; i++) if (levels\[i\]\[0\] <= nsPerPx) k = i;|;|' "$T/report.html" >"$T/naive.html"
cmp -s "$T/report.html" "$T/naive.html" && { echo "report_bench: the naive variant could not be made (report.js changed?)"; exit 1; }
# The floor: the same bytes, the code left out.
python3 - "$T/report.html" "$T/floor.html" <<'PY'
import re, sys
page = open(sys.argv[1]).read()
open(sys.argv[2], 'w').write(re.sub(r'<script>.*?</script>', '<script></script>', page, flags=re.S))
PY
peer=""
if [ "$peer_events" != 0 ]; then
  mkdir "$T/peer"
  "$build/bench/big_session_bench" --events "$peer_events" --dir "$T/peer" >/dev/null
  mv "$T/peer/big.trace.json.gz" "$T/peer/big_${peer_events}_events.trace.json.gz"
  peer=$T/peer/big_${peer_events}_events.trace.json.gz
fi
node "$root/bench/report_bench.mjs" "$runs" "$T/report.html" "$T/naive.html" "$T/floor.html" $peer
