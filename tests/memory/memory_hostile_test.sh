#!/usr/bin/env bash
# The heap hook under hostile and unusual programs (issue 8, items 13-17),
# checked in the written profiles with `go tool pprof` and `spyglass memtop`:
#   memory_hostile_test.sh <spyglass CLI> <libspyglass_heap.so> <heap_hostile> <libheap_hostile_lib.so>
set -euo pipefail
cli=$1 lib=$2 prog=$3 dllib=$4
src=$(dirname "$0")/heap_hostile.cc
T=$(mktemp -d /tmp/spyglass-hostile-XXXXXX)
trap 'rm -rf "$T"' EXIT
export SPYGLASS_HEAP_LIB=$lib GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T}
unset SPYGLASS_HEAP_SAMPLE_BYTES SPYGLASS_HEAP_FOLLOW_CHILDREN SPYGLASS_HEAP_PROFILE_DIR
fail() { echo "FAIL: $*"; exit 1; }
check() { # check <what> <haystack> <needle...>
  local what=$1 text=$2; shift 2
  for n in "$@"; do grep -qF -- "$n" <<<"$text" || { echo "$text"; fail "$what: '$n' missing"; }; done
  echo "ok: $what"
}
command -v go >/dev/null || fail "go is not installed (apt-get install golang-go): the tests need 'go tool pprof'"
# hooked <dir> <env...> -- <args>: heap_hostile alone under the hook (not the tools around it).
hooked() {
  local dir=$1; shift
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  env "${envs[@]}" LD_PRELOAD="$lib" SPYGLASS_HEAP_PROFILE_DIR="$dir" "$prog" "$@"
}
# flat <profile> <function>: the exact bytes a function holds (innermost frame).
flat() {
  go tool pprof -top -unit=B -nodefraction=0 -nodecount=100000 "$1" 2>/dev/null |
    awk -v f="$2" '{ name = $0; sub(/^ *[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +/, "", name); if (name == f) { v = $1; sub(/B$/, "", v); print v; found = 1 } }
                   END { if (!found) print 0 }'
}
line_of() { grep -n -F -- "$1" "$src" | head -1 | cut -d: -f1; }

# 13. A failed realloc/reallocarray keeps the old block as it was (size, stack).
out=$(hooked "$T/realloc" -- realloc)
check "realloc program" "$out" "realloc: done"
p=$(ls "$T"/realloc/memory.*.exit.prof)
[ "$(flat "$p" "keep_block()")" = 200 ] || { go tool pprof -top -unit=B "$p" 2>/dev/null | head -20; fail "failed realloc: keep_block() should hold 200 B"; }
[ "$(flat "$p" "keep_block_array()")" = 300 ] || fail "failed reallocarray: keep_block_array() should hold 300 B"
[ "$(flat "$p" "grow_block()")" = 5000 ] || fail "realloc 100 -> 5000: grow_block() should hold 5000 B"
[ "$(flat "$p" "shrink_block()")" = 1000 ] || fail "realloc 4000 -> 1000: shrink_block() should hold 1000 B"
mt=$("$cli" memtop -n 1000 "$p")
check "failed realloc keeps the malloc's stack" "$mt" "keep_block()  heap_hostile.cc:$(line_of 'std::malloc(200)')" \
  "keep_block_array()  heap_hostile.cc:$(line_of 'std::malloc(300)')"
total=$(go tool pprof -top -unit=B "$p" 2>/dev/null | sed -n 's/.* of \([0-9]*\)B total.*/\1/p')
[ "${total:-0}" -lt $((1 << 20)) ] || fail "failed realloc: $total B live (a phantom block)"
echo "ok: no phantom ($total B live)"

# 14. Sampling is unbiased: the estimate is within 5 sigma of the exact total;
# the exact run is exact; a thread's first allocation is not always a sample.
out=$(hooked "$T/exact" -- sample 8 5000)
exact=$(sed -n 's/.*exact_bytes=\([0-9]*\).*/\1/p' <<<"$out")
got=$(flat "$(ls "$T"/exact/memory.*.exit.prof)" "alloc_blocks(int)")
[ "$got" = "$exact" ] || fail "exact run: alloc_blocks holds $got B, the program allocated $exact B"
echo "ok: exact run ($exact B)"
out=$(hooked "$T/sampled" SPYGLASS_HEAP_SAMPLE_BYTES=4096 -- sample 8 5000)
sigma=$(sed -n 's/.*sigma_bytes=\([0-9]*\).*/\1/p' <<<"$out")
est=$(flat "$(ls "$T"/sampled/memory.*.exit.prof)" "alloc_blocks(int)")
dev=$((est > exact ? est - exact : exact - est))
[ "$sigma" -gt 0 ] && [ "$dev" -le $((5 * sigma)) ] ||
  fail "sampled estimate $est B vs exact $exact B: off by $dev B, more than 5 sigma ($sigma B)"
echo "ok: sampled estimate $est B, exact $exact B, sigma $sigma B"
# Sampled mode records blocks of every allocation function and forgets them
# at free(): with a 1-byte interval every block
# is a sample weighing its size, so apis() holds exactly the kept 7 x 3000 B +
# 1 MiB (20 more rounds were freed), with contents, zeroing and alignment kept.
out=$(hooked "$T/apis" SPYGLASS_HEAP_SAMPLE_BYTES=1 -- apis)
check "every allocation function in sampled mode" "$out" "apis: done"
got=$(flat "$(ls "$T"/apis/memory.*.exit.prof)" "apis(void**)")
[ "$got" = $((7 * 3000 + (1 << 20))) ] || fail "sampled apis(): holds $got B, kept $((7 * 3000 + (1 << 20))) B"
echo "ok: sampled mode, every allocation function ($got B)"
out=$("$cli" run --sample-bytes 524288 -o "$T/small" -- "$prog" small 100 2>&1)
check "100 threads under spyglass run --sample-bytes" "$out" "small: done"
est=$(flat "$(ls "$T"/small/memory.*.exit.prof)" "one_small_block(int)")
# Exact: 1600 B; each block is sampled with p = 3e-5 and then weighs 512 KiB:
# 4 samples of 100 (2 MiB) have a probability under 1e-10.
[ "$est" -lt $((2 << 20)) ] || fail "100 threads x 16 B reported as $est B (every first allocation sampled)"
echo "ok: 100 threads x 16 B sampled: $est B"

# 15. Bad sampling intervals: the CLI refuses them (exit 2); the hook says so
# once and tracks exactly (no negative or inflated sizes).
for v in -5 18446744073709551615 1073741825 abc 12x ""; do
  if msg=$("$cli" run --sample-bytes "$v" -o "$T/bad" -- "$prog" small 1 2>&1); then fail "--sample-bytes '$v' accepted"; fi
  rc=$("$cli" run --sample-bytes "$v" -o "$T/bad" -- true >/dev/null 2>&1; echo $?) || true
  [ "$rc" = 2 ] || fail "--sample-bytes '$v': exit $rc, not 2"
  check "--sample-bytes '$v' refused" "$msg" "--sample-bytes must be an integer from 0 to 1073741824"
done
[ ! -e "$T/bad" ] || [ -z "$(ls "$T/bad")" ] || fail "a refused run still ran the program"
for v in -5 18446744073709551615; do
  d="$T/badenv$RANDOM"
  err=$(hooked "$d" SPYGLASS_HEAP_SAMPLE_BYTES="$v" -- small 10 2>&1 >/dev/null)
  [ "$(grep -c 'SPYGLASS_HEAP_SAMPLE_BYTES' <<<"$err")" = 1 ] || { echo "$err"; fail "hook: no single warning for '$v'"; }
  got=$(flat "$(ls "$d"/memory.*.exit.prof)" "one_small_block(int)")
  [ "$got" = 160 ] || fail "hook with SPYGLASS_HEAP_SAMPLE_BYTES='$v': one_small_block holds $got B, not 160 (exact)"
  go tool pprof -raw "$(ls "$d"/memory.*.exit.prof)" 2>/dev/null | grep -qE '^ +-[0-9]' && fail "negative sizes with '$v'"
  echo "ok: hook with SPYGLASS_HEAP_SAMPLE_BYTES='$v': one warning, exact profile"
done

# 16. Forked children (no exec) write no exit profile by default (each one
# cost a symbolization: 300 forks took 16-50 s); with follow-children, one each.
out=$(hooked "$T/fork" -- fork 300)
check "300 forks" "$out" "fork: 300 children ok"
n=$(ls "$T"/fork/memory.*.exit.prof | wc -l)
[ "$n" = 1 ] || fail "300 forks: $n profiles, expected only the parent's"
echo "ok: 300 forks, one profile"
out=$(hooked "$T/follow" SPYGLASS_HEAP_FOLLOW_CHILDREN=1 -- fork 3)
n=$(ls "$T"/follow/memory.*.exit.prof | wc -l)
[ "$n" = 4 ] || fail "SPYGLASS_HEAP_FOLLOW_CHILDREN=1, 3 forks: $n profiles, expected 4"
echo "ok: follow children, 3 forks, 4 profiles"
out=$(hooked "$T/daemon" -- daemon)
child=$(sed -n 's/^daemon: \([0-9]*\)$/\1/p' <<<"$out")
for _ in $(seq 1 200); do compgen -G "$T/daemon/memory.$child.*.exit.prof" >/dev/null && break; sleep 0.05; done
compgen -G "$T/daemon/memory.$child.*.exit.prof" >/dev/null || { ls -l "$T/daemon"; fail "a daemonized child (parent gone) wrote no exit profile"; }
echo "ok: a daemon's child writes its exit profile"
err=$(hooked "$T/tracefork" SPYGLASS_TRACE_DIR="$T/trace" -- fork 3 2>&1 >/dev/null | grep -v "the program annotated nothing")
# Only the parent's own line (where its trace went, and the hint that it holds
# no annotation): the children say nothing.
[ "$(grep -c . <<<"$err")" = 1 ] && grep -q "^spyglass: trace written to $T/trace/" <<<"$err" \
  || { echo "$err"; fail "forked children under SPYGLASS_TRACE_DIR complain at exit"; }
echo "ok: forked children leave the parent's trace alone"

# 17. An allocation from a library unloaded before exit keeps its function's name.
out=$(hooked "$T/dl" -- dlopen "$dllib")
check "dlopen program (the library is really unloaded)" "$out" "dlopen: done (unloaded)"
p=$(ls "$T"/dl/memory.*.exit.prof)
[ "$(flat "$p" "lib_make_buffer")" = 12345 ] || { go tool pprof -top -unit=B "$p" 2>/dev/null | head -20; fail "unloaded library: lib_make_buffer should hold 12345 B"; }
check "unloaded library in memtop" "$("$cli" memtop "$p")" "lib_make_buffer  heap_hostile_lib.cc"
echo "memory_hostile_test: all passed"
