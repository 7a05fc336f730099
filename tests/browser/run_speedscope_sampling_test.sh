#!/usr/bin/env bash
# speedscope's own web app, in Debian's chromium, reads the pprof CPU profile
# (cpu.<pid>.<comm>.prof) that `spyglass run --sample` writes for the known
# workload, and its Sandwich table (by total time) lists the workload's
# functions. Usage: run_speedscope_sampling_test.sh SPYGLASS CPU_WORKLOAD
set -euo pipefail
spyglass=$1 workload=$2
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$here/node_modules/speedscope" ] || { echo "FAIL: run scripts/setup.sh (npm ci in tests/browser)"; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$spyglass" run --sample 999 -o "$dir" -- "$workload" 1 >/dev/null
prof=$(ls "$dir"/plugins/profile/*/cpu.*.prof)
SORT_BY_TOTAL=1 node "$here/speedscope_check.mjs" "$prof" burn_a burn_b burn_c main
