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
ctest --test-dir build --output-on-failure -j "$jobs"
bash scripts/python_test.sh   # the Python package: venv, pip install ., pytest tests/python
bash scripts/sanitizers.sh
echo "All tests passed."
