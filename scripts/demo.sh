#!/usr/bin/env bash
# The main job: build Spyglass and profile a real workload (training-like
# matrix steps on two threads), then say where the trace is and how to open it,
# and print its summary (steps, top annotations) in the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build -j "${JOBS:-2}" --target spyglass_demo spyglass_cli
./build/spyglass_demo "${1:-/tmp/spyglass-demo}" "${@:2}"
# Where the time went, read in the terminal (the newest run of the log dir).
echo
./build/spyglass summary "${1:-/tmp/spyglass-demo}" --top 6
