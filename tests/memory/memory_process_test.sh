#!/usr/bin/env bash
# `spyglass run` and processes: which ones get profiles (the program through
# its execs by default, children with --follow-children, a launcher script's
# program rather than the launcher), the snapshots of a process that runs out
# of memory (ulimit -v) or dies of a fatal signal, one near a cgroup memory
# limit, and the closing summary; exact numbers read back by `go tool pprof`.
#   memory_process_test.sh <spyglass CLI> <libspyglass_heap.so> <process_tree> <launcher.sh> <oom_new>
set -euo pipefail
cli=$1 lib=$2 prog=$3 launcher=$4 oom_new=$5
T=$(mktemp -d /tmp/spyglass-proc-XXXXXX)
cg=""
cleanup() {
  rm -rf "$T"
  [ -n "$cg" ] && rmdir "$cg" 2>/dev/null || true
}
trap cleanup EXIT
export SPYGLASS_HEAP_LIB=$lib GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T}
unset SPYGLASS_HEAP_SAMPLE_BYTES SPYGLASS_HEAP_FOLLOW_CHILDREN SPYGLASS_HEAP_PROFILE_DIR SPYGLASS_HEAP_PID LD_PRELOAD
fail() { echo "FAIL: $*"; exit 1; }
check() { # check <what> <haystack> <needle...>
  local what=$1 text=$2; shift 2
  for n in "$@"; do grep -qF -- "$n" <<<"$text" || { echo "$text"; fail "$what: '$n' missing"; }; done
  echo "ok: $what"
}
command -v go >/dev/null || fail "go is not installed (apt-get install golang-go): the tests need 'go tool pprof'"
# top <profile> [pprof flags]: go tool pprof -top, every node, in bytes.
top() { local p=$1; shift; go tool pprof -top -unit=B -nodefraction=0 -nodecount=100000 "$@" "$p" 2>/dev/null; }
# flat <profile> <function> [pprof flags]: what the function holds itself (bytes, or a count).
flat() {
  local p=$1 f=$2; shift 2
  top "$p" "$@" | awk -v f="$f" '{ name = $0; sub(/^ *[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +[^ ]+ +/, "", name);
                                   if (name == f) { v = $1; sub(/B$/, "", v); print v; found = 1 } }
                                 END { if (!found) print 0 }'
}
files() { (cd "$1" && ls | sort | tr '\n' ' '); }
# at_exit <pid>...: the names of what those processes write at exit (sorted as ls does).
at_exit() { for p in "$@"; do for t in exit.prof peak.prof timeline.tsv; do echo "memory.$p.$pt.$t"; done; done | sort | tr '\n' ' '; }
# row <what> <summary> <pid> <program text>: the summary has a row for that process.
row() { grep -qE "^  $3 +$4" <<<"$2" || { echo "$2"; fail "$1: no row '$3 $4'"; }; }
pt=$(basename "$prog" | cut -c1-15)  # the program's comm

# 1. fork + exec, by default: only the program has a profile; it holds its 3 x 100000 B.
out=$("$cli" run -o "$T/fe" -- "$prog" forkexec 2>&1)
main=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\1/p' <<<"$out")
child=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\2/p' <<<"$out")
[ -n "$main" ] && [ -n "$child" ] || { echo "$out"; fail "forkexec did not run"; }
[ "$(files "$T/fe")" = "$(at_exit "$main")" ] || fail "forkexec: expected only the program's profile, got: $(files "$T/fe")"
p=$T/fe/memory.$main.$pt.exit.prof
[ "$(flat "$p" parent_block)" = 300000 ] || { top "$p"; fail "forkexec: parent_block should hold 300000 B"; }
[ "$(flat "$p" parent_block -sample_index=allocations)" = 3 ] || fail "forkexec: parent_block: 3 allocations"
[ "$(flat "$p" child_block)" = 0 ] || fail "forkexec: the child's blocks are not the program's"
[ "$(flat "$T/fe/memory.$main.$pt.peak.prof" parent_block)" = 300000 ] || fail "forkexec: peak: parent_block should hold 300000 B"
check "summary, fork + exec" "$out" "(1 process)" "exit status 0" "memory.$main.$pt.exit.prof"
row "summary, fork + exec" "$out" "$main" "$pt \(main\) +297.0 KiB +297.0 KiB +exit status 0"

# ... and over time (memtop --over-time): the program's device chart and its call site.
chart=$("$cli" memtop --over-time --width 40 "$p")
check "memtop --over-time" "$chart" "Live bytes over time in $T/fe/memory.$main.$pt.timeline.tsv" "cpu:0: peak 297.0 KiB" \
  "max  293.0 KiB  parent_block <- main"
[ "$(grep -c '^ *[0-9.]* *[KMG]*i*B* *|[ #]*$' <<<"$chart")" -ge 8 ] || { echo "$chart"; fail "memtop --over-time: no 8-row chart"; }
set +e
msg=$("$cli" memtop --over-time "$T/fe/nonsense" 2>&1); rc=$?
[ "$rc" = 2 ] && grep -qF "reads a memory.<pid>.<program>.timeline.tsv" <<<"$msg" || { echo "$msg"; fail "memtop --over-time on a bad name: rc $rc"; }
printf 'not a timeline\n' >"$T/bad.timeline.tsv"
msg=$("$cli" memtop --over-time "$T/bad.timeline.tsv" 2>&1); rc=$?
set -e
[ "$rc" = 1 ] && grep -qF "not a spyglass memory timeline" <<<"$msg" || { echo "$msg"; fail "memtop --over-time on a bad file: rc $rc"; }
echo "ok: memtop --over-time refuses bad input"
out=$("$cli" run --timeline -o "$T/tl" -- "$prog" forkexec 2>&1)
check "run --timeline" "$out" "Over time: spyglass memtop --over-time" "Live bytes over time in" "cpu:0: peak 297.0 KiB" \
  "parent_block <- main"

# 2. --follow-children: the child too (its 2 x 50000 B), listed after the program.
out=$("$cli" run --follow-children -o "$T/fc" -- "$prog" forkexec 2>&1)
main=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\1/p' <<<"$out")
child=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\2/p' <<<"$out")
[ "$(files "$T/fc")" = "$(at_exit "$main" "$child")" ] || fail "--follow-children: expected the program's and the child's profiles, got: $(files "$T/fc")"
c=$T/fc/memory.$child.$pt.exit.prof
[ "$(flat "$c" child_block)" = 100000 ] || { top "$c"; fail "--follow-children: child_block should hold 100000 B"; }
[ "$(flat "$c" child_block -sample_index=allocations)" = 2 ] || fail "--follow-children: child_block: 2 allocations"
[ "$(flat "$c" parent_block)" = 0 ] || fail "--follow-children: an exec'd child does not hold its parent's blocks"
[ "$(flat "$T/fc/memory.$main.$pt.exit.prof" parent_block)" = 300000 ] || fail "--follow-children: parent_block"
check "summary, --follow-children" "$out" "(2 processes)" "exited"
row "summary, --follow-children" "$out" "$main" "$pt \(main\)"
row "summary, --follow-children" "$out" "$child" "$pt +101.7 KiB +101.7 KiB +exited"
first=$(grep -E '^  [0-9]+ ' <<<"$out" | head -1)
check "the program is listed first" "$first" "$main" "(main)"

# 3. A launcher script (helpers, then exec): the program it launches is profiled, not the launcher.
out=$("$cli" run -o "$T/la" -- "$launcher" "$prog" forkexec 2>&1)
main=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\1/p' <<<"$out")
[ "$(files "$T/la")" = "$(at_exit "$main")" ] || fail "launcher: expected only the launched program's profile, got: $(files "$T/la")"
[ "$(flat "$T/la/memory.$main.$pt.exit.prof" parent_block)" = 300000 ] || fail "launcher: parent_block should hold 300000 B"
check "summary, launcher" "$out" "(1 process)"
row "summary, launcher" "$out" "$main" "$pt \(main\)"
# ... and with --follow-children, its helpers (basename, ls, 2 x cat) and the program's child too.
out=$("$cli" run --follow-children -o "$T/lf" -- "$launcher" "$prog" forkexec 2>&1)
main=$(sed -n 's/^forkexec: \([0-9]*\) child \([0-9]*\) status 0$/\1/p' <<<"$out")
n=$(ls "$T"/lf/*.exit.prof | wc -l)
[ "$n" = 6 ] || fail "launcher, --follow-children: 6 exit profiles expected, got: $(files "$T/lf")"
for prog_name in basename ls cat "$pt"; do ls "$T"/lf/memory.*."$prog_name".exit.prof >/dev/null || fail "no profile of $prog_name"; done
[ "$(ls "$T"/lf/memory.*.cat.exit.prof | wc -l)" = 2 ] || fail "launcher, --follow-children: 2 cat profiles expected"
check "summary, launcher with --follow-children" "$out" "(6 processes)"
row "summary, launcher with --follow-children" "$out" "$main" "$pt \(main\)"
for prog_name in basename ls cat; do row "summary, launcher with --follow-children" "$out" "[0-9]+" "$prog_name "; done

# 3a. Files planted in the directory during the run are not taken as profiles, nor printed:
# a name with a terminal escape, a dump that is no dump.
mkdir -p "$T/pl"
out=$("$cli" run -o "$T/pl" -- sh -c "printf x >'$T/pl/memory.1.'\$(printf '\\033')'[31m.exit.prof'; printf 'not a dump' >'$T/pl/memory.2.x.oom.raw'; exec \"$prog\" child" 2>&1)
grep -q $'\033' <<<"$out" && { echo "$out" | cat -v; fail "a planted name's escape reached the summary"; }
check "planted files" "$out" "not a valid spyglass memory dump" "(2 processes)"
[ -e "$T/pl/memory.2.x.oom.raw" ] || fail "a dump that could not be read was removed"

# 3b. Workers (forks, no exec) ended by SIGTERM, as a pool's terminate() does: nothing of
# theirs by default; with --follow-children, a snapshot at the signal each, holding child_block.
out=$("$cli" run -o "$T/wk" -- "$prog" workers 2>&1)
check "workers" "$out" "workers: 3 killed by SIGTERM" "(1 process)"
main=$(ls "$T/wk" | sed -n 's/^memory\.\([0-9]*\)\..*exit\.prof$/\1/p')
[ "$(files "$T/wk")" = "$(at_exit "$main")" ] || fail "workers: expected only the program's files, got: $(files "$T/wk")"
out=$("$cli" run --follow-children -o "$T/wf" -- "$prog" workers 2>&1)
check "workers, --follow-children" "$out" "workers: 3 killed by SIGTERM" "(4 processes)" "killed by SIGTERM (snapshot at the signal)"
n=0
for p in "$T"/wf/memory.*."$pt".signal.prof; do
  [ "$(flat "$p" child_block)" = 50000 ] || { top "$p"; fail "workers: $p: child_block should hold 50000 B"; }
  n=$((n + 1))
done
[ "$n" = 3 ] || fail "workers, --follow-children: 3 signal profiles expected, got: $(files "$T/wf")"

# 4. Out of memory under ulimit -v: the dump became memory.<pid>.<comm>.oom.prof; it
# holds what grab_block kept (N x 1 MiB) and names grab_block as the failed allocation.
set +e
out=$("$cli" run -o "$T/oom" -- sh -c "ulimit -v 1500000 && exec \"$prog\" oom" 2>&1)
rc=$?
set -e
[ "$rc" = 134 ] || { echo "$out"; fail "oom: expected exit status 134 (SIGABRT after the failure), got $rc"; }
mib=$(sed -n 's/^oom: malloc failed after \([0-9]*\) MiB$/\1/p' <<<"$out")
[ -n "$mib" ] && [ "$mib" -gt 10 ] || { echo "$out"; fail "oom: the program did not run out of memory"; }
p=$(ls "$T"/oom/memory.*."$pt".oom.prof)
[ "$(files "$T/oom")" = "$(basename "$p") " ] || fail "oom: expected only the OOM profile (the dump converted), got: $(files "$T/oom")"
[ "$(flat "$p" grab_block)" = $((mib * 1048576)) ] || { top "$p"; fail "oom: grab_block should hold $mib MiB"; }
failed=$(top "$p" -sample_index=allocations -tagfocus=kind=failed)
check "oom: the failed allocation's stack" "$failed" "grab_block" "main"
[ "$(flat "$p" grab_block -sample_index=allocations -tagfocus=kind=failed)" = 1 ] || fail "oom: one failed allocation in grab_block"
check "oom: the comment" "$(go tool pprof -comments "$p" 2>&1)" "out of memory: an allocation of 1048576 bytes failed in grab_block"
check "summary, oom" "$out" "(main)" "killed by SIGABRT; out of memory: an allocation of 1.0 MiB failed in grab_block" \
  "$(basename "$p")"
check "memtop, oom" "$("$cli" memtop "$p")" "cpu:0  failed" "grab_block"

# 4b. The same through operator new (std::bad_alloc left uncaught: std::terminate, SIGABRT).
set +e
out=$("$cli" run -o "$T/new" -- sh -c "ulimit -v 1500000 && exec \"$oom_new\"" 2>&1)
rc=$?
set -e
[ "$rc" = 134 ] || { echo "$out"; fail "oom_new: expected exit status 134, got $rc"; }
p=$(ls "$T"/new/memory.*.oom_new.oom.prof)
[ "$(top "$p" -sample_index=allocations -tagfocus=kind=failed | grep -c 'grab_array()')" -ge 1 ] \
  || { top "$p" -sample_index=allocations -tagfocus=kind=failed; fail "oom_new: the failed allocation is not grab_array()'s"; }
held=$(flat "$p" "grab_array()")
[ "$held" -gt $((10 << 20)) ] && [ $((held % 1048576)) = 0 ] || fail "oom_new: grab_array() holds $held B, expected whole MiB"
check "summary, operator new" "$out" "killed by SIGABRT; out of memory: an allocation of 1.0 MiB failed in grab_array()"

# 4c. A Python MemoryError (CPython's allocator returns NULL): python3 may be a launcher
# itself (pyenv's shim, a bash script that runs helpers and execs python): the
# profiles are Python's.
if command -v python3 >/dev/null; then
  set +e
  printf 'def make_huge():\n    return bytearray(10**13)\n\nmake_huge()\n' >"$T/huge.py"
  out=$("$cli" run -o "$T/py" -- python3 "$T/huge.py" 2>&1)
  rc=$?
  set -e
  [ "$rc" = 1 ] || { echo "$out"; fail "python MemoryError: expected exit status 1, got $rc"; }
  check "python MemoryError" "$out" "MemoryError" "(1 process)" \
    "exit status 1; out of memory: an allocation of 9.1 TiB failed in make_huge ($T/huge.py:2)"
  p=$(ls "$T"/py/memory.*.oom.prof)
  case "$(basename "$p")" in memory.*.python*.oom.prof) ;; *) fail "python MemoryError: $(basename "$p") is not python's";; esac
  ls "$T"/py/memory.*.python*.exit.prof >/dev/null || fail "python MemoryError: no exit profile of python"
  check "python MemoryError: the failed allocation's Python stack" \
    "$(top "$p" -sample_index=allocations -tagfocus=kind=failed)" "make_huge" "bytearray___init___impl"
  [ "$(ls "$T/py" | grep -vc python)" = 0 ] || fail "python MemoryError: profiles of the launcher's helpers: $(files "$T/py")"
fi

# 4d. Sampled mode: a failing allocation is rarely a sample (here 1 MiB calls
# sampled one per GiB: 0.1 %), yet the OOM snapshot is written and names the
# allocating function, whichever way the program allocates. The limit is set
# before the program starts (ulimit -v), unless $limit says otherwise. The kept blocks
# are estimates (scaled samples): only the failed allocation is checked.
oom_sampled() { # oom_sampled <what> <function> <size as the summary prints it> <command...>
  local what=$1 fn=$2 size=$3; shift 3
  set +e
  out=$("$cli" run --sample-bytes 1073741824 -o "$T/s-$what" -- sh -c "${limit-ulimit -v 1500000 && }exec $*" 2>&1)
  rc=$?
  set -e
  p=$(ls "$T/s-$what"/memory.*.oom.prof 2>/dev/null) || { echo "$out"; fail "sampled $what: no OOM snapshot: $(files "$T/s-$what")"; }
  failed=$(top "$p" -sample_index=allocations -tagfocus=kind=failed)
  check "sampled $what: the failed allocation's stack" "$failed" "$fn"
  # Native programs: the allocating function is the innermost frame (Python's is below CPython's).
  [ "$what" = python ] || [ "$(flat "$p" "$fn" -sample_index=allocations -tagfocus=kind=failed)" = 1 ] \
    || { echo "$failed"; fail "sampled $what: one failed allocation in $fn"; }
  check "sampled $what: the summary" "$out" "out of memory: an allocation of $size failed in $fn"
}
oom_sampled malloc grab_block "1.0 MiB" "\"$prog\" oom"
[ "$rc" = 134 ] || fail "sampled malloc: expected exit status 134, got $rc"
oom_sampled calloc calloc_block "1.0 MiB" "\"$prog\" oomcalloc"
check "sampled calloc: errno after the failure" "$out" "calloc failed after" "errno ENOMEM"
oom_sampled new "grab_array()" "1.0 MiB" "\"$oom_new\""
# Small blocks (below 64 KiB: the unchecked path's size, heap_hook.cc), under
# a limit set before the program started, and under one the program sets
# itself while running (the hooked setrlimit turns the check back on).
oom_sampled small small_block "4.0 KiB" "\"$prog\" oomsmall"
[ "$rc" = 134 ] || fail "sampled small: expected exit status 134, got $rc"
limit= oom_sampled setrlimit small_block "4.0 KiB" "\"$prog\" oomsetrlimit"
[ "$rc" = 134 ] || fail "sampled setrlimit: expected exit status 134, got $rc"
if command -v python3 >/dev/null; then
  oom_sampled python make_huge "9.1 TiB" "python3 '$T/huge.py'"
  [ "$rc" = 1 ] || fail "sampled python: expected exit status 1, got $rc"
fi

# 4e. errno stays the program's: a failing setrlimit's EINVAL (the hook reads
# the limits after it), and mallocs through sample points (the limits read
# again every 100 ms), here with /proc unmounted so that reading
# overcommit_memory fails. Needs a private mount namespace (root).
if unshare -m --propagation private true 2>/dev/null; then
  out=$(unshare -m --propagation private sh -c "umount -l /proc && SPYGLASS_HEAP_SAMPLE_BYTES=64 LD_PRELOAD='$lib' '$prog' errno" 2>&1)
  check "errno after setrlimit and mallocs" "$out" "errno: setrlimit -1 EINVAL" "mallocs 0"
else
  echo "skip: errno without /proc (no private mount namespace)"
fi

# 5. A fatal signal (SIGSEGV): memory.<pid>.<comm>.signal.prof holds crash_block's 4 x 25000 B.
set +e
out=$("$cli" run -o "$T/segv" -- "$prog" crash 2>&1)
rc=$?
set -e
[ "$rc" = 139 ] || { echo "$out"; fail "crash: expected exit status 139 (SIGSEGV), got $rc"; }
pid=$(sed -n 's/^crash: \([0-9]*\)$/\1/p' <<<"$out")
p=$T/segv/memory.$pid.$pt.signal.prof
[ "$(files "$T/segv")" = "$(basename "$p") " ] || fail "crash: expected only $(basename "$p"), got: $(files "$T/segv")"
[ "$(flat "$p" crash_block)" = 100000 ] || { top "$p"; fail "crash: crash_block should hold 100000 B"; }
[ "$(flat "$p" crash_block -sample_index=allocations)" = 4 ] || fail "crash: crash_block: 4 allocations"
check "crash: the comment" "$(go tool pprof -comments "$p" 2>&1)" "fatal signal 11 (SIGSEGV)"
check "summary, crash" "$out" "killed by SIGSEGV (snapshot at the signal)"
row "summary, crash" "$out" "$pid" "$pt \(main\)"

# 6. Near a cgroup memory limit (v1 or v2, where this machine lets a cgroup be made):
# a snapshot at 90% of it, before the kernel's OOM killer ends the program
# (SIGKILL, no handler runs); grab_block holds most of the limit in it.
if [ -w /sys/fs/cgroup/memory ] && [ -d /sys/fs/cgroup/memory ]; then
  cg=/sys/fs/cgroup/memory/spyglass-test-$$ limit=memory.limit_in_bytes
elif [ -w /sys/fs/cgroup ] && grep -qw memory /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; then
  cg=/sys/fs/cgroup/spyglass-test-$$ limit=memory.max
fi
if [ -n "$cg" ] && mkdir "$cg" 2>/dev/null && echo $((256 << 20)) >"$cg/$limit" 2>/dev/null; then
  set +e
  out=$("$cli" run -o "$T/cg" -- sh -c "echo \$\$ >$cg/cgroup.procs && exec \"$prog\" cgroup 400 200" 2>&1)
  rc=$?
  set -e
  [ "$rc" = 137 ] || { echo "$out"; fail "cgroup: expected the OOM killer's SIGKILL (137), got $rc"; }
  p=$(ls "$T"/cg/memory.*."$pt".cgroup.prof) || { ls "$T/cg"; fail "no snapshot near the cgroup limit"; }
  held=$(flat "$p" grab_block)
  [ "$held" -ge $((200 << 20)) ] && [ "$held" -le $((256 << 20)) ] || fail "cgroup: grab_block holds $held B, expected 200-256 MiB"
  check "summary, cgroup" "$out" "killed by SIGKILL; passed 90% of its cgroup memory limit" "$(basename "$p")"
  # Watched through the kernel's notification, not by polling; the profile says how, and at what usage.
  case $limit in
    memory.limit_in_bytes) how="cgroup v1 eventfd: usage thresholds" ;;
    *) how="cgroup v2 POLLPRI: memory.events" ;;
  esac
  check "summary, cgroup: how it was watched" "$out" "(watched by $how"
  check "cgroup: the profile's comment" "$(go tool pprof -comments "$p" 2>&1)" \
    "spyglass: cgroup memory limit: usage " "of $((256 << 20)) bytes ($cg), watched by $how"
else
  echo "skip: no cgroup can be made here (cgroup v1 memory or v2 with the memory controller, writable)"
  cg=""
fi
echo "PASS"
