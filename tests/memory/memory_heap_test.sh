#!/usr/bin/env bash
# The heap hook on an unmodified program, read by the real pprof (go tool
# pprof) and by `spyglass memtop/memdiff`:
#   memory_heap_test.sh <spyglass CLI> <libspyglass_heap.so> <heap_workload>
set -euo pipefail
cli=$1 lib=$2 prog=$3
T=$(mktemp -d /tmp/spyglass-memtest-XXXXXX)
trap 'rm -rf "$T"; [ -n "${httppid:-}" ] && kill "$httppid" 2>/dev/null || true' EXIT
export SPYGLASS_HEAP_LIB=$lib GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T}
fail() { echo "FAIL: $*"; exit 1; }
check() { # check <what> <haystack> <needle...>
  local what=$1 text=$2; shift 2
  for n in "$@"; do grep -qF -- "$n" <<<"$text" || { echo "$text"; fail "$what: '$n' missing"; }; done
  echo "ok: $what"
}
command -v go >/dev/null || fail "go is not installed (apt-get install golang-go): the pprof tests need 'go tool pprof'"

# 1. spyglass run: a snapshot on SIGUSR2 (after step 1) and at exit.
out=$("$cli" run -o "$T/mem" -- "$prog" grow 5 2>&1)
check "spyglass run" "$out" "grow: done" "memory profiles in"
early=$(ls "$T"/mem/memory.*.1.prof) late=$(ls "$T"/mem/memory.*.exit.prof)
# ... and in sampled mode (malloc's fast path then skips the state check until a SIGUSR2 clears its flag).
out=$("$cli" run --sample-bytes 65536 -o "$T/usr2s" -- "$prog" grow 5 2>&1)
check "spyglass run --sample-bytes: the SIGUSR2 snapshot" "$out" "grow: done" ".1.prof"
ls "$T"/usr2s/memory.*.1.prof >/dev/null || fail "sampled mode: no SIGUSR2 snapshot"

# 2. go tool pprof reads them.
top=$(go tool pprof -top "$late" 2>&1)
check "pprof -top" "$top" "Type: space" "grow_cache(int)" "build_table()"
top=$(go tool pprof -top -sample_index=allocations "$late" 2>&1)
check "pprof -top allocations" "$top" "Type: allocations" "grow_cache(int)"
traces=$(go tool pprof -traces "$late" 2>&1)
check "pprof -traces" "$traces" "grow_cache(int)" "main"
# 3. -diff_base points at the code that grew: grow_cache, +400 KiB, first row.
diff=$(go tool pprof -top -diff_base="$early" "$late" 2>&1)
first=$(grep -A1 -E '^ +flat' <<<"$diff" | tail -1)
check "pprof -diff_base" "$first" "400kB" "grow_cache(int)"
# 4. -http serves them.
port=$((20000 + RANDOM % 20000))
go tool pprof -http=127.0.0.1:$port -no_browser "$late" >"$T/http.log" 2>&1 & httppid=$!
page=""
for _ in $(seq 1 100); do
  page=$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$port/ui/top').read().decode())" 2>/dev/null) && break
  sleep 0.2
done
check "pprof -http" "$page" "grow_cache"
kill $httppid 2>/dev/null || true; httppid=""

# 5. memtop / memdiff, without Go.
mt=$("$cli" memtop "$late")
# grow_cache: its 500 blocks of 1 KiB and the vector's last buffer (4 KiB),
# which push_back, inlined into grow_cache, allocated.
check "memtop" "$mt" "cpu:0  heap" "640.0 KiB" "build_table()  heap_workload.cc" "504.0 KiB" "grow_cache(int)  heap_workload.cc"
md=$("$cli" memdiff "$early" "$late")
row=$(grep -A2 '^Grew' <<<"$md" | tail -1)
check "memdiff" "$row" "+403.0 KiB" "+400" "grow_cache(int)"  # 400 blocks, the vector's buffer 1 -> 4 KiB

# 6. Truncated or corrupt files: a clear error, exit status 1.
head -c 300 "$late" >"$T/trunc.prof"
head -c 3000 /dev/urandom >"$T/random.prof"
: >"$T/empty.prof"
for f in trunc random empty; do
  if msg=$("$cli" memtop "$T/$f.prof" 2>&1); then fail "memtop accepted $f.prof"; fi
  check "memtop on $f.prof" "$msg" "not a valid pprof profile"
done
msg=$("$cli" memdiff "$early" "$T/trunc.prof" 2>&1) && fail "memdiff accepted a truncated file"
check "memdiff on a truncated file" "$msg" "truncated"

# 7. Threads, fork, signal-handler allocations, thread exit under the hook.
out=$("$cli" run -o "$T/stress" -- "$prog" stress 2>&1)
check "stress under the hook" "$out" "stress: child ok" "memory profiles in"

# 8. Plain LD_PRELOAD, and the sampled mode (profiles scaled back).
LD_PRELOAD=$lib SPYGLASS_HEAP_PROFILE_DIR=$T/pre "$prog" grow 2 >/dev/null
ls "$T"/pre/memory.*.exit.prof >/dev/null || fail "no snapshot with plain LD_PRELOAD"
echo "ok: LD_PRELOAD"
"$cli" run --sample-bytes 4096 -o "$T/sampled" -- "$prog" grow 20 >/dev/null 2>&1
st=$("$cli" memtop "$(ls "$T"/sampled/memory.*.exit.prof)")
check "sampled mode" "$st" "grow_cache(int)"

# 9. --trace: the trace has a live-bytes counter track.
"$cli" run --memory --trace "$T/trace" -o "$T/mem2" -- "$prog" grow 2 >/dev/null 2>&1
json=$(zcat "$(find "$T/trace" -name '*.trace.json.gz' | head -1)")
check "counter track in the trace" "$json" '"ph":"C"' '"name":"memory cpu:0"' '"live_bytes":'
# ... and one per top call site (the memory timeline's).
check "call-site counter tracks in the trace" "$json" '"name":"memory cpu:0 grow_cache(int) <- main' \
  '"name":"memory cpu:0 build_table() <- main'
echo "memory_heap_test: all passed"
