#!/usr/bin/env bash
# Async producer/consumer flows (make_known_run --async 3: "prefetch" on
# "producer" consumed by "consume" on "consumer", and a consumer of another
# type that pairs with none) drawn as arrows from the producer to its
# consumer, in `spyglass report`'s page and in `spyglass view`'s
# (flow_check.mjs: the arrows' ends, clicked, select those events).
#   run_flow_test.sh SPYGLASS_CLI MAKE_KNOWN_RUN
set -euo pipefail
cli=$1 known=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/playwright-core" ] || { echo "FAIL: run scripts/setup.sh --browser (npm ci in tests/browser)"; exit 1; }
T=$(mktemp -d /tmp/spyglass-flowb-XXXXXX)
export XDG_CACHE_HOME="$T/cache"  # the index cache: this test's own
pid=
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$T"' EXIT
"$known" "$T/log" --async 3 > /dev/null
pairs=(--pair "producer/prefetch@2=consumer/consume@6" --pair "producer/prefetch@12=consumer/consume@16"
       --pair "producer/prefetch@22=consumer/consume@26")
"$cli" report "$T/log" -o "$T/report.html" > /dev/null
node "$here/flow_check.mjs" "$T/report.html" "${pairs[@]}" --window 0,40
"$cli" view "$T/log" > "$T/url" 2> "$T/err" &
pid=$!
for _ in $(seq 1 600); do [ -s "$T/url" ] && break; sleep 0.1; done
url=$(head -1 "$T/url")
[ -n "$url" ] || { cat "$T/err"; echo "FAIL: no URL"; exit 1; }
node "$here/flow_check.mjs" "$url" "${pairs[@]}" --window 0,40
kill -INT "$pid"; wait "$pid"; pid=
echo "run_flow_test: all passed"
