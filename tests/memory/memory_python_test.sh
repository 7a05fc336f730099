#!/usr/bin/env bash
# `spyglass run -- python3 script.py` records Python frames (the CLI's path:
# the startup module beside the hook in the build tree):
#   memory_python_test.sh <spyglass CLI> <tests/python/heap_sites.py>
# For the default python3 and each CPython 3.10/3.13 under ~/.pyenv: the exit
# profile, read by `go tool pprof -traces -lines`, names the script's
# functions and lines, with libffi's native frames (ctypes -> malloc) above the
# Python ones. A bad --python-allocator is a clear error.
set -euo pipefail
cli=$1 script=$(realpath "$2")
T=$(mktemp -d /tmp/spyglass-pyheap-XXXXXX)
trap 'rm -rf "$T"' EXIT
export GOTOOLCHAIN=local GOFLAGS= HOME=${HOME:-$T} PPROF_TMPDIR=$T
unset SPYGLASS_TRACE_DIR SPYGLASS_HEAP_PROFILE_DIR SPYGLASS_HEAP SPYGLASS_HEAP_SAMPLE_BYTES PYTHONMALLOC || true
fail() { echo "FAIL: $*"; exit 1; }
line_of() { grep -n "# SITE $1\$" "$script" | cut -d: -f1; }

# The interpreter itself, not a launcher script (pyenv's shim forks a few shells first).
pythons=("$(python3 -c 'import sys; print(sys.executable)')")
for v in 3.10 3.13; do
  for p in "$HOME"/.pyenv/versions/$v.*/bin/python3; do [ -x "$p" ] && pythons+=("$p"); done
done
n=0
for py in "${pythons[@]}"; do
  out=$T/run$n
  n=$((n + 1))
  "$cli" run -o "$out" -- "$py" "$script" 2>"$out.err" || { cat "$out.err"; fail "$py under spyglass run"; }
  prof=$(ls "$out"/memory.*.exit.prof)
  [ "$(wc -l <<<"$prof")" = 1 ] || fail "$py: one profile expected, got: $prof"
  traces=$(go tool pprof -traces -lines "$prof" 2>/dev/null)
  for want in "make_bytearrays $script:$(line_of bytearray)" "make_native $script:$(line_of native)" \
              "make_each_domain $script:$(line_of obj)" "ffi_call"; do
    grep -qF -- "$want" <<<"$traces" || { head -100 <<<"$traces"; fail "$py: '$want' not in the traces"; }
  done
  # The ctypes malloc's stack: libffi's frames, then make_native, main, <module>.
  # The ctypes malloc's stack, innermost first: libffi, then make_native, then main.
  order=$(awk -v s="$script" '/^-----/{f=0; m=0} /ffi_call/{f=NR} index($0, "make_native " s) && f {m=NR}
                              index($0, "main " s) && m {print "ordered"; exit}' <<<"$traces")
  [ "$order" = ordered ] || { grep -B5 -A25 ffi_call <<<"$traces" > "$T/block" || true; head -60 "$T/block"; fail "$py: frames out of order"; }
  # --python-mode light: malloc's blocks with the Python frames alone (no libffi frame above them).
  "$cli" run --python-mode light -o "$out.light" -- "$py" "$script" 2>"$out.light.err" ||
    { cat "$out.light.err"; fail "$py under spyglass run --python-mode light"; }
  traces=$(go tool pprof -traces -lines "$(ls "$out.light"/memory.*.exit.prof)" 2>/dev/null)
  grep -qF -- "make_native $script:$(line_of native)" <<<"$traces" || { head -60 <<<"$traces"; fail "$py light: no make_native"; }
  if grep -qF ffi_call <<<"$traces"; then fail "$py light: native frames in the stacks"; fi
  echo "ok: $py"
done

if "$cli" run --python-allocator jemalloc -o "$T/bad" -- true 2>"$T/bad.err"; then fail "bad --python-allocator accepted"; fi
grep -q "python-allocator" "$T/bad.err" || { cat "$T/bad.err"; fail "no clear error for --python-allocator"; }
echo "ok: bad --python-allocator refused"
if "$cli" run --python-mode fast -o "$T/bad" -- true 2>"$T/bad.err"; then fail "bad --python-mode accepted"; fi
grep -q "python-mode" "$T/bad.err" || { cat "$T/bad.err"; fail "no clear error for --python-mode"; }
echo "ok: bad --python-mode refused"
