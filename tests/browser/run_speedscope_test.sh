#!/usr/bin/env bash
# speedscope's own web app, in Debian's chromium, reads the trace JSON that
# the demo writes (trace.json.gz; its Perfetto file is the native .pb), and lists its
# annotations. Usage: run_speedscope_test.sh DEMO_BINARY
set -euo pipefail
demo=$1
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/speedscope" ] || { echo "FAIL: run scripts/setup.sh (npm ci in tests/browser)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$demo" "$dir" --steps 3 >/dev/null
run=$(ls -d "$dir"/plugins/profile/*/)
for f in "$run"*.trace.json.gz; do
  node "$here/speedscope_check.mjs" "$f" matmul relu loss train load_batch
done
