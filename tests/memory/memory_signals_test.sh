#!/usr/bin/env bash
# The heap hook leaves the program's signals its own: its dump-at-death
# handlers stand in for the default disposition, so CPython still installs its
# SIGINT handler and a Ctrl-C is a KeyboardInterrupt (finally and atexit run).
#   memory_signals_test.sh <spyglass CLI> <libspyglass_heap.so>
set -euo pipefail
cli=$1 hook=$2
T=$(mktemp -d /tmp/spyglass-signals-XXXXXX)
trap 'rm -rf "$T"' EXIT
unset SPYGLASS_TRACE_DIR SPYGLASS_HEAP_PROFILE_DIR SPYGLASS_HEAP PYTHONMALLOC || true
fail() { echo "FAIL: $*"; exit 1; }
py=$(python3 -c 'import sys; print(sys.executable)')
cat > "$T/ctrl_c.py" <<'PY'
import atexit, os, signal, sys
print("handler:", signal.getsignal(signal.SIGINT).__name__, flush=True)
print("term default:", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
atexit.register(lambda: print("atexit ran", flush=True))
try:
    try:
        os.kill(os.getpid(), signal.SIGINT)
        signal.pause() if hasattr(signal, "pause") else None
    finally:
        print("finally ran", flush=True)
except KeyboardInterrupt:
    print("KeyboardInterrupt", flush=True)
sys.stdout.write("buffered")
PY
check() {  # what: the output of one run
  local what=$1 out=$2
  for want in "handler: default_int_handler" "term default: True" "finally ran" "KeyboardInterrupt" "atexit ran" "buffered"; do
    grep -qF -- "$want" <<<"$out" || { echo "$out"; fail "$what: '$want' missing"; }
  done
  echo "ok: $what"
}
rc=0
out=$("$cli" run -o "$T/a" -- "$py" "$T/ctrl_c.py" 2>"$T/a.err") || rc=$?
[ "$rc" = 0 ] || { cat "$T/a.err"; fail "spyglass run -- python exited $rc"; }
check "spyglass run -- python" "$out"
out=$(LD_PRELOAD=$hook SPYGLASS_HEAP_PROFILE_DIR=$T/b "$py" "$T/ctrl_c.py" 2>"$T/b.err") || rc=$?
[ "$rc" = 0 ] || { cat "$T/b.err"; fail "LD_PRELOAD python exited $rc"; }
check "LD_PRELOAD" "$out"
# The stand-in still works where the program keeps the default: a program
# killed by SIGTERM dies of it, with its crash dump written.
set +e
LD_PRELOAD=$hook SPYGLASS_HEAP_PROFILE_DIR=$T/c "$py" -c 'import os, signal; os.kill(os.getpid(), signal.SIGTERM)' 2>"$T/c.err"
rc=$?
set -e
[ "$rc" = 143 ] || { cat "$T/c.err"; fail "SIGTERM: exit $rc, expected death by SIGTERM (143)"; }
ls "$T"/c/ | grep -q . || fail "SIGTERM: nothing written in $T/c"
echo "ok: SIGTERM keeps its dump ($(ls "$T/c" | tr '\n' ' '))"
