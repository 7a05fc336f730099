#!/usr/bin/env bash
# The heap hook loads only what tracking needs:
#   memory_lean_hook_test.sh <spyglass CLI> <libspyglass_heap.so> <hook_tiny> <hook_shared_tracker> <memory_bench>
# 1. a C program under the hook has no gRPC/protobuf/absl/OpenSSL/re2 (nor
#    libspyglass itself) loaded;
# 2. its profile holds no frame of those libraries, nor the start-up allocation
#    of libstdc++, a dependency of the hook only (go tool pprof -traces, memtop);
# 3. SPYGLASS_TRACE_DIR loads libspyglass and writes a trace with the
#    live-bytes counter track; when libspyglass cannot be found, one clear line;
# 4. a program linked with libspyglass sees, through save_device_memory_profile,
#    the blocks the hook recorded (one tracker per process);
# 5. sampled mode: frees of blocks never sampled (some pass the small, cached
#    filter of sampled pointers) are not counted as unknown or double frees.
set -euo pipefail
cli=$1 hook=$2 tiny=$3 shared=$4 bench=$5
T=$(mktemp -d /tmp/spyglass-leanhook-XXXXXX)
trap 'rm -rf "$T"' EXIT
export GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T}
unset SPYGLASS_TRACE_DIR SPYGLASS_HEAP_PROFILE_DIR SPYGLASS_HEAP SPYGLASS_HEAP_SAMPLE_BYTES || true
fail() { echo "FAIL: $*"; exit 1; }
check() { # check <what> <haystack> <needle...>
  local what=$1 text=$2; shift 2
  for n in "$@"; do grep -qF -- "$n" <<<"$text" || { echo "$text"; fail "$what: '$n' missing"; }; done
  echo "ok: $what"
}
# The profiler's heavy dependencies, as library names and as symbol names;
# in the profile of a C program, libstdc++ (the hook's own dependency: its
# exception pool is allocated while it initializes) must not show either.
heavy_libs='lib(grpc|gpr|protobuf|absl|ssl|crypto|re2|cares|upb|address_sorting)|libspyglass\.so'
heavy_syms='grpc|protobuf|absl|ssl_|re2::|libspyglass\.so|libstdc\+\+'
refuse() { # refuse <what> <haystack> <extended regex>
  local hits
  hits=$(grep -E -- "$3" <<<"$2" || true)
  [ -z "$hits" ] || { echo "$hits" | head -20; fail "$1: the lines above must not be there"; }
  echo "ok: $1"
}

# 1. Loaded libraries, under plain LD_PRELOAD and under `spyglass run`.
libs=$(LD_PRELOAD=$hook SPYGLASS_HEAP_PROFILE_DIR=$T/pre "$tiny" | sort -u)
refuse "no gRPC/protobuf/absl/OpenSSL/libspyglass under LD_PRELOAD" "$libs" "$heavy_libs"
check "the hook and its tracker are loaded" "$libs" "libspyglass_heap.so" "libspyglass_memory.so"
out=$("$cli" run -o "$T/run" -- "$tiny" 2>&1)
check "spyglass run" "$out" "libspyglass_heap.so" "memory profiles in"
refuse "no gRPC/protobuf/absl/OpenSSL/libspyglass under spyglass run" "$out" "$heavy_libs"

# 2. The profile names the program's blocks and nothing of those libraries.
for prof in "$T"/pre/memory.*.exit.prof "$T"/run/memory.*.exit.prof; do
  [ -f "$prof" ] || fail "no exit profile ($prof)"
  top=$("$cli" memtop -n 1000 "$prof")
  check "memtop $(basename "$(dirname "$prof")")" "$top" "293.0 KiB" "keep_block"
  refuse "memtop: no frame of the profiler's dependencies" "$top" "$heavy_syms"
  if command -v go >/dev/null; then
    traces=$(go tool pprof -traces "$prof" 2>&1)
    check "pprof -traces" "$traces" "keep_block" "main"
    refuse "pprof -traces: no frame of the profiler's dependencies" "$traces" "$heavy_syms"
  fi
done

# 3. SPYGLASS_TRACE_DIR: libspyglass is loaded then, and the trace has the counter track.
libs=$(SPYGLASS_TRACE_DIR=$T/trace LD_PRELOAD=$hook "$tiny" 2>"$T/trace.err" | sort -u) \
  || { cat "$T/trace.err"; fail "hook_tiny with SPYGLASS_TRACE_DIR failed"; }
check "SPYGLASS_TRACE_DIR loads libspyglass" "$libs" "libspyglass.so"
trace=$(find "$T/trace" -name '*.trace.json.gz' | head -1)
[ -n "$trace" ] || { cat "$T/trace.err"; fail "SPYGLASS_TRACE_DIR wrote no *.trace.json.gz"; }
json=$(zcat "$trace")
check "counter track in the SPYGLASS_TRACE_DIR trace" "$json" '"ph":"C"' '"name":"memory cpu:0"' '"live_bytes":'
# The hook alone in a directory (its tracker still found through its RUNPATH):
# the program runs, its profile is written, and one line says why there is no trace.
mkdir "$T/alone"
cp "$hook" "$T/alone/"
SPYGLASS_TRACE_DIR=$T/trace2 SPYGLASS_HEAP_PROFILE_DIR=$T/alone-prof LD_PRELOAD=$T/alone/$(basename "$hook") \
  "$tiny" >/dev/null 2>"$T/alone.err" || { cat "$T/alone.err"; fail "the program failed without libspyglass"; }
err=$(cat "$T/alone.err")
check "a clear error without libspyglass" "$err" \
  "spyglass: SPYGLASS_TRACE_DIR/SERVER_PORT/FLIGHT_RECORDER is set but " "libspyglass.so.0 cannot be loaded (" \
  "); not profiling"
[ "$(wc -l <"$T/alone.err")" -eq 1 ] || fail "want one line on stderr, got: $err"
ls "$T"/alone-prof/memory.*.exit.prof >/dev/null || fail "no exit profile without libspyglass"
echo "ok: the exit profile is written without libspyglass"

# 4. One tracker: the program's own save_device_memory_profile sees the hook's blocks.
out=$(LD_PRELOAD=$hook "$shared" "$T/shared.prof")
top=$("$cli" memtop "$T/shared.prof")
check "save_device_memory_profile under the hook" "$top" "976.6 KiB" "hold_block"
# Without the hook, malloc is not tracked: the blocks come from the hook.
"$shared" "$T/plain.prof" >/dev/null
top=$("$cli" memtop "$T/plain.prof")
grep -qF hold_block <<<"$top" && { echo "$top"; fail "hold_block tracked without the hook"; }
echo "ok: without the hook, no heap blocks"

# 5. Sampled mode, many frees (4 KiB sampling: thousands of live samples in the filter).
SPYGLASS_HEAP_SAMPLE_BYTES=4096 SPYGLASS_HEAP_PROFILE_DIR=$T/sampled LD_PRELOAD=$hook "$bench" 500000 >/dev/null
prof=$(ls "$T"/sampled/memory.*.exit.prof)
if command -v go >/dev/null; then
  raw=$(go tool pprof -raw "$prof" 2>&1)
  check "sampled profile" "$raw" "spyglass: heap sampled every 4096 bytes"
  refuse "sampled mode: no unknown or double frees" "$raw" "unknown_frees|double_frees"
else
  echo "skipped: sampled-mode free counts (go tool pprof is not installed)"
fi
echo "memory_lean_hook_test: all passed"
