#!/usr/bin/env bash
# The whole test suite: set-up, build, unit/integration tests (with the real
# XProf converter, an install + downstream build), then the reliability tests
# again under ThreadSanitizer and AddressSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage says when it starts, so that the CI log shows where the time goes.
# `times`: CPU used so far (its second line: user and system time of the stages).
stage() { echo "== [$(date -u +%T), ${SECONDS}s] $*"; times; }
stage setup
bash scripts/setup.sh --browser
jobs=${JOBS:-2}
stage build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build -j "$jobs"
# Fuzzers: 15 s each here (6 of them; SPYGLASS_FUZZ_SECONDS, default 60 when run alone).
stage ctest
SPYGLASS_FUZZ_SECONDS=${SPYGLASS_FUZZ_SECONDS:-15} ctest --test-dir build --output-on-failure -j "$jobs"
# What users build: the start-from-outside tests and the real programs again on
# a Release build (only the targets they run), so that no behaviour depends on
# the build type.
stage release
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build-release -j "$jobs" --target spyglass_cli spyglass_heap env_program env_program_start_first
ctest --test-dir build-release --output-on-failure -R '^(env_|real_native_test$)'
stage python
bash scripts/python_test.sh   # the Python package: venv, pip install ., pytest tests/python
stage sanitizers
bash scripts/sanitizers.sh
stage done
echo "All tests passed."
