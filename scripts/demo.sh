#!/usr/bin/env bash
# The main job: build Spyglass and profile a real workload (training-like
# matrix steps on two threads), then say where the trace is and how to open it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j "${JOBS:-2}" --target spyglass_demo spyglass_cli
./build/spyglass_demo "${1:-/tmp/spyglass-demo}" "${@:2}"
