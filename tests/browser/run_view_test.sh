#!/usr/bin/env bash
# A page served by `spyglass view` in Debian's chromium (view_check.mjs):
# the known run with 300k more events on "busy", drawn whole, then zoomed to
# 10 us where single "outer" events come from the server; with a memory
# profile and timeline beside it (--python 1), its summary, step chart and
# flame graphs read as those of `spyglass report`'s page of the same run.
#   run_view_test.sh SPYGLASS_CLI MAKE_KNOWN_RUN
set -euo pipefail
cli=$1 known=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/playwright-core" ] || { echo "FAIL: run scripts/setup.sh --browser (npm ci in tests/browser)"; exit 1; }
T=$(mktemp -d /tmp/spyglass-viewb-XXXXXX)
export XDG_CACHE_HOME="$T/cache"  # the index cache: this test's own
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$T"' EXIT
"$known" "$T/log" --busy 300000 --python 1 > /dev/null
"$cli" report "$T/log" -o "$T/report.html" > /dev/null
"$cli" view "$T/log" > "$T/url" 2> "$T/err" &
pid=$!
for _ in $(seq 1 600); do [ -s "$T/url" ] && break; sleep 0.1; done
url=$(head -1 "$T/url")
[ -n "$url" ] || { cat "$T/err"; echo "FAIL: no URL"; exit 1; }
# The URL comes at once; the timeline once /progress says ready.
for _ in $(seq 1 600); do
  curl -s "${url%%/\?*}/progress?token=${url#*token=}" | grep -q '"ready": *true' && break
  sleep 0.1
done
# outer #20000 starts at 90 ms (every 4.5 us); the view starts 0.5 us before its end... at its start.
node "$here/view_check.mjs" "$url" --track busy --track main --track "Stream #7" --zoom-ms 90,90.01 --expect-name outer \
  --same-panels-as "$T/report.html"
kill -INT "$pid"; wait "$pid"; pid=
echo "run_view_test: all passed"
