#!/usr/bin/env bash
# Acceptance: XProf's own converter reads a trace that Spyglass wrote (the demo:
# steps, nested annotations, two threads) into trace-viewer and step data.
set -euo pipefail
demo=$1
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$demo" "$out" --steps 4 > "$out/demo.log"
xplane=$(ls "$out"/plugins/profile/*/*.xplane.pb)
python3 "$here/xprof_check.py" "$xplane" \
  --expect-event matmul --expect-event relu --expect-event load_batch --expect-event train_step \
  --expect-step "train 0" --expect-step "train 3" --strict-steps
