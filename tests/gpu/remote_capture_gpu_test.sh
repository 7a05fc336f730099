#!/usr/bin/env bash
# Remote capture of GPU planes (issue 11): a live program whose GPU tracer
# runs on a stand-in driver and libcupti (fake_libcuda.cc, fake_libcupti.cc:
# one kernel launch, a 4 KiB copy, a memset) is captured by `spyglass collect`
# by `python -m spyglass.collect_profile` where that package is installed,
# and by JAX's `python -m jax.collect_profile`; each returned run must hold
# /device:GPU:0 as XProf's converter reads it (the kernel in kernel_stats, the
# copy and memset, the launch linked to its kernel).
#
#   remote_capture_gpu_test.sh <annotating_server> <spyglass cli> <fake cuda dir>
# Exit 77: XProf's converter (pip xprof) is not installed.
set -euo pipefail
server="$1" cli="$2" fake="$3"
here="$(cd "$(dirname "$0")" && pwd)"
python3 -c 'import xprof' 2>/dev/null || { echo "SKIP: xprof not installed"; exit 77; }
tmp="$(mktemp -d)"
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

# One capture of a fresh server each time (the stand-in reports its records once per session).
capture() {
  local how="$1" log="$tmp/$1"
  # Emptied here, not by the server's redirection: that can come after the
  # first look below, which then read the previous server's port.
  : > "$tmp/server.out"
  LD_LIBRARY_PATH="$fake${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" SPYGLASS_CUPTI_PATH="$fake" \
    "$server" 0 --name gpu_capture_step --seconds 100 >"$tmp/server.out" 2>"$tmp/server.err" &
  pid=$!
  local port=""
  for _ in $(seq 1 200); do
    port="$(sed -n 's/^PORT //p' "$tmp/server.out")"
    [ -n "$port" ] && break
    sleep 0.05
  done
  [ -n "$port" ] || { echo "FAIL: the server did not start"; cat "$tmp/server.err"; exit 1; }
  case "$how" in
    spyglass) timeout 90 "$cli" collect "$port" 500 --log_dir "$log" --no_perfetto_link ;;
    python) timeout 90 python3 -m spyglass.collect_profile --log_dir "$log" --no_perfetto_link "$port" 500 ;;
    jax) timeout 90 python3 -m jax.collect_profile "$port" 500 --log_dir "$log" --no_perfetto_link ||
           { echo "== jax.collect_profile failed; the server said:"; cat "$tmp/server.err"; exit 1; } ;;
  esac
  kill "$pid"; wait "$pid" 2>/dev/null || true; pid=""
  if grep -q "GPU tracer off" "$tmp/server.err"; then echo "FAIL: $(cat "$tmp/server.err")"; exit 1; fi
  local xplane
  xplane="$(find "$log" -name '*.xplane.pb' | head -1)"
  [ -n "$xplane" ] || { echo "FAIL: $how collect wrote no .xplane.pb"; exit 1; }
  echo "== $how collect: $xplane"
  python3 "$here/gpu_xprof_check.py" "$xplane" --kernel "fake_gpu_kernel(float*, int)" --kernel-us 100 \
    --grid 64,1,1 --block 256,1,1 --copy-bytes 4096 --annotation "" --pm-counter ""
}

capture spyglass
# Spyglass's own Python path (the same C++ client), where the package is installed.
if python3 -c 'import spyglass._spyglass' 2>/dev/null; then
  capture python
else
  echo "(the spyglass Python package is not installed for python3: python -m spyglass.collect_profile not run)"
fi
if python3 -c 'import jax' 2>/dev/null; then
  capture jax
else
  echo "(jax not installed: jax.collect_profile not run)"
fi
echo "ok"
