#!/usr/bin/env bash
# CUPTI records built with NVIDIA's layouts -> our converter -> .xplane.pb ->
# XProf's own converter (kernel_stats, trace_viewer@).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$1" "$tmp/gpuhost.xplane.pb"
python3 "$here/gpu_xprof_check.py" "$tmp/gpuhost.xplane.pb"
