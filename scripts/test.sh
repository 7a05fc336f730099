#!/usr/bin/env bash
# The whole test suite: set-up, build, unit/integration tests (with the real
# XProf converter, an install + downstream build), then the reliability tests
# again under ThreadSanitizer and AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --browser
jobs=${JOBS:-2}
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
# Fuzzers: 30 s each here (6 of them; SPYGLASS_FUZZ_SECONDS, default 60 when run alone).
SPYGLASS_FUZZ_SECONDS=${SPYGLASS_FUZZ_SECONDS:-30} ctest --test-dir build --output-on-failure -j "$jobs"
bash scripts/python_test.sh   # the Python package: venv, pip install ., pytest tests/python
bash scripts/sanitizers.sh
echo "All tests passed."
