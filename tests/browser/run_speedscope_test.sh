#!/usr/bin/env bash
# speedscope's own web app, in Debian's chromium, reads the trace JSON that
# the demo writes (trace.json.gz, and perfetto_trace.json.gz: a second name of
# the same file, beside the native perfetto_trace.pb), and lists its
# annotations. Usage: run_speedscope_test.sh DEMO_BINARY
set -euo pipefail
demo=$1
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/speedscope" ] || { echo "FAIL: run scripts/setup.sh (npm ci in tests/browser)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$demo" "$dir" --steps 3 >/dev/null
run=$(ls -d "$dir"/plugins/profile/*/)
[ "$run"perfetto_trace.json.gz -ef "$(ls "$run"*.trace.json.gz)" ] ||
  { echo "FAIL: perfetto_trace.json.gz is not the trace JSON's second name"; exit 1; }
[ -s "$run"perfetto_trace.pb ] || { echo "FAIL: no perfetto_trace.pb"; exit 1; }
for f in "$run"*.trace.json.gz "$run"perfetto_trace.json.gz; do
  node "$here/speedscope_check.mjs" "$f" matmul relu loss train load_batch
done
