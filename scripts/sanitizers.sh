#!/usr/bin/env bash
# Builds the library and its tests with ThreadSanitizer and with
# AddressSanitizer+UBSan, and runs the tests that exercise threads, sessions,
# fork and exit under each.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${JOBS:-2}
tests=(annotation_test session_test reliability_test export_test perfetto_link_test memory_core_test flight_recorder_test
  gpu_tracer_test)
for san in thread address; do
  dir=build-$san
  targets=("${tests[@]}" exit_program)
  # The report and the summary (and the report CLI's bad-file cases) have
  # no threads, but hostile times and files for ASan and UBSan.
  [ $san = address ] && tests+=(report_test analysis_test) && targets+=(report_test analysis_test spyglass_cli)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DSPYGLASS_SANITIZE=$san \
    -DSPYGLASS_BUILD_BENCHMARKS=OFF -DSPYGLASS_BUILD_EXAMPLES=OFF > /dev/null
  cmake --build "$dir" -j "$jobs" --target "${targets[@]}"
  export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1"
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=0"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs" -R "^($(IFS='|'; echo "${tests[*]}")|exit_program_test)$"
done
