#!/usr/bin/env bash
# Exact numbers on a known program (tests/memory/peak_exact.c), read by the
# real pprof (go tool pprof) and checked against heaptrack's report of the
# same binary:
#   memory_peak_test.sh <libspyglass_heap.so> <peak_exact>
# Peak profile = peak()'s 10 x 100,000 B + leak()'s 3 blocks (6,666 B);
# exit profile = leak()'s 3 blocks only; timeline: high-water mark 1,006,666 B.
# Then `peak_exact plateau` (frees waiting in the hook at the peak and at exit).
set -euo pipefail
lib=$1 prog=$2
T=$(mktemp -d /tmp/spyglass-peaktest-XXXXXX)
trap 'rm -rf "$T"' EXIT
export GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T}
fail() { echo "FAIL: $*"; exit 1; }
command -v go >/dev/null || fail "go is not installed (scripts/setup.sh): this test needs 'go tool pprof'"
command -v heaptrack >/dev/null || fail "heaptrack is not installed (scripts/setup.sh): this test compares with it"

out=$(LD_PRELOAD=$lib SPYGLASS_HEAP_PROFILE_DIR=$T/mem "$prog")
[ "$out" = "peak_exact: done" ] || fail "program output: $out"
comm=$(basename "$prog" | cut -c1-15)
peak=$(ls "$T"/mem/memory.*."$comm".peak.prof) || fail "no peak profile named memory.<pid>.$comm.peak.prof"
exitp=$(ls "$T"/mem/memory.*."$comm".exit.prof) || fail "no exit profile"
tl=$(ls "$T"/mem/memory.*."$comm".timeline.tsv) || fail "no timeline"

# flat <profile> <sample index> <function>: the flat value of a function, in bytes/counts.
flat() { go tool pprof -top -unit=B -sample_index="$2" "$1" 2>/dev/null |
  awk -v f="$3" '$NF == f { v = $1; sub(/B$/, "", v); print v; found = 1 } END { if (!found) print 0 }'; }
total() { go tool pprof -top -unit=B -sample_index="$2" "$1" 2>/dev/null |
  sed -n 's/.*100% of \([0-9]*\)B* total.*/\1/p'; }
expect() { [ "$2" = "$3" ] || fail "$1: got '$2', expected '$3'"; echo "ok: $1 = $3"; }

expect "peak: peak() bytes" "$(flat "$peak" space peak)" 1000000
expect "peak: peak() allocations" "$(flat "$peak" allocations peak)" 10
expect "peak: leak() bytes" "$(flat "$peak" space leak)" 6666
expect "peak: leak() allocations" "$(flat "$peak" allocations leak)" 3
expect "peak: transient() bytes (freed before the peak)" "$(flat "$peak" space transient)" 0
expect "peak: after() bytes (after the peak)" "$(flat "$peak" space after)" 0
expect "peak: total bytes" "$(total "$peak" space)" 1006666
go tool pprof -comments "$peak" 2>/dev/null | grep -qx "spyglass: peak cpu:0 1006666 bytes" ||
  fail "the peak profile's comment does not give the peak: $(go tool pprof -comments "$peak" 2>&1)"
echo "ok: peak comment"
expect "exit: total bytes" "$(total "$exitp" space)" 6666
expect "exit: leak() allocations" "$(flat "$exitp" allocations leak)" 3
expect "exit: peak() bytes" "$(flat "$exitp" space peak)" 0
go tool pprof -comments "$exitp" 2>/dev/null | grep -qx "spyglass: peak cpu:0 1006666 bytes" ||
  fail "the exit profile's comments do not give the peak"
go tool pprof -comments "$exitp" 2>/dev/null | grep -q reentrant_skipped &&
  fail "the exit profile counts the profiler's own calls as reentrant: $(go tool pprof -comments "$exitp" 2>&1)"
echo "ok: no reentrant_skipped"

# The timeline: the device line carries the peak; the highest max column is
# the peak, the last live value what leaked.
grep -qP '^# device\tcpu:0\t1006666$' "$tl" || { cat "$tl"; fail "timeline: no device line with the peak"; }
max=$(awk -F'\t' '!/^#/ && $1 != "t_ns" { if ($3 > m) m = $3 } END { print m }' "$tl")
last=$(awk -F'\t' '!/^#/ && $1 != "t_ns" { v = $2 } END { print v }' "$tl")
expect "timeline: highest max" "$max" 1006666
expect "timeline: last live" "$last" 6666

# heaptrack on the same binary: its per-stack peak and leaked bytes (the
# flame-graph output has exact numbers). Only the program's stacks (through
# main): heaptrack also counts the 72,704 B exception pool of the libstdc++
# that its own preloaded library brings into this C program.
heaptrack -o "$T/ht" "$prog" >/dev/null 2>&1 || fail "heaptrack failed"
htfile=$(ls "$T"/ht*) || fail "heaptrack wrote no data file"
ht() { # ht <cost type> <function>: bytes of stacks through main whose innermost frame is the function
  heaptrack_print -f "$htfile" -F "$T/fg.$1" --flamegraph-cost-type "$1" >/dev/null 2>&1 || fail "heaptrack_print failed"
  awk -v f="$2 (" '/main \(/ { n = split($0, parts, ";"); if (index(parts[n - 1], f) == 1) s += $NF } END { print s + 0 }' "$T/fg.$1"; }
for fn in peak leak transient after; do
  expect "heaptrack agrees: $fn() at the peak" "$(ht peak $fn)" "$(flat "$peak" space $fn)"
  expect "heaptrack agrees: $fn() leaked" "$(ht leaked $fn)" "$(flat "$exitp" space $fn)"
done
# Frees still waiting in the hook (small blocks) when the live bytes are
# back at the high-water mark, and at exit: the peak and the exit profile
# count them exactly (`peak_exact plateau`).
out=$(LD_PRELOAD=$lib SPYGLASS_HEAP_PROFILE_DIR=$T/plateau "$prog" plateau)
[ "$out" = "peak_exact: plateau done" ] || fail "program output: $out"
peak=$(ls "$T"/plateau/memory.*."$comm".peak.prof) || fail "plateau: no peak profile"
exitp=$(ls "$T"/plateau/memory.*."$comm".exit.prof) || fail "plateau: no exit profile"
tl=$(ls "$T"/plateau/memory.*."$comm".timeline.tsv) || fail "plateau: no timeline"
expect "plateau: peak plateau() bytes" "$(flat "$peak" space plateau)" 100000
expect "plateau: peak plateau() allocations" "$(flat "$peak" allocations plateau)" 200
expect "plateau: exit plateau() bytes" "$(flat "$exitp" space plateau)" 50000
expect "plateau: exit plateau() allocations" "$(flat "$exitp" allocations plateau)" 100
go tool pprof -comments "$peak" 2>/dev/null | grep -qx "spyglass: peak cpu:0 100000 bytes" ||
  fail "plateau: the peak comment is not 100000 bytes: $(go tool pprof -comments "$peak" 2>&1)"
grep -qP '^# device\tcpu:0\t100000$' "$tl" || { cat "$tl"; fail "plateau: timeline device line"; }
max=$(awk -F'\t' '!/^#/ && $1 != "t_ns" { if ($3 > m) m = $3 } END { print m }' "$tl")
expect "plateau: timeline highest max" "$max" 100000
rm -f "$T"/ht*
heaptrack -o "$T/ht" "$prog" plateau >/dev/null 2>&1 || fail "heaptrack failed (plateau)"
htfile=$(ls "$T"/ht*) || fail "heaptrack wrote no data file (plateau)"
expect "heaptrack agrees: plateau() at the peak" "$(ht peak plateau)" 100000
expect "heaptrack agrees: plateau() leaked" "$(ht leaked plateau)" 50000
echo "memory_peak_test: all passed"
