#!/usr/bin/env bash
# The GPU tracer on a real NVIDIA GPU (issue 11). Two steps:
#
#   bash scripts/gpu_check.sh prepare   here, on the build machine (no GPU
#       needed): CUDA 13.0 pip wheels (nvcc, nvvm, cudart, crt, cupti) into
#       build/cuda_sdk-13.0, the library and gpu_check_reader built, the CUDA
#       program tests/gpu/gpu_check_program.cu compiled with that nvcc
#       (sm_90 + PTX, cudart linked statically), all of it with its shared
#       libraries (libcupti and the libnvperf pair PM sampling loads) packed
#       into build/gpu_check/stage.tar.gz, and XProf's wheel beside it.
#   bash scripts/gpu_check.sh           on the GPU machine, with build/gpu_check
#       carried there (nothing else is needed; nothing is downloaded):
#       run tool: carry ["build/gpu_check"], command "bash scripts/gpu_check.sh".
#
# CUDA 13.0, not the newest: the lent H200 machines were seen with driver 580
# (CUDA 13.0), and CUPTI newer than the driver would run under minor-version
# compatibility, which profiling tools do not promise to support.
#
# It asserts kernels, copies and memsets on /device:GPU:0 inside their
# TraceAnnotations, the copy byte counts, the launch <-> kernel link, the
# kernel after its launch on the shared clock, and the GPU allocation in the
# pprof at its call site (gpu_check_reader); XProf's converter (the carried
# wheel, installed into a temporary folder) checks kernel_stats,
# framework_op_stats, overview_page and trace_viewer@ on the same file; a
# second traced run with gpu_pm_sample_counters reports the PM counter samples
# (or the warning saying why there are none); the JAX leg
# (tests/gpu/gpu_jax_check.py, on the device's own jax with its CUDA plugin,
# and the spyglass wheel for its Python 3.12 that the stage carries) checks
# one CUPTI subscriber in a JAX process, XLA's: its kernels on /device:GPU:0
# inside our TraceAnnotations, each kernel once, when spyglass.profiler drives
# XLA's session, when a session from the environment steps aside, and in
# jax.profiler's trace with `import spyglass.jax`; the driver version is printed,
# and one older than CUDA 13's stops the check early. Then it prints the host
# cost per kernel launch with no tracer, with CUPTI activity tracing alone
# (the floor) and with Spyglass. Runs in well under 5 minutes.
# `bash scripts/gpu_check.sh jax` runs the JAX leg alone.
#
# The jax CUDA wheels do not travel: jax-cuda13-pjrt alone is larger than the
# 64 MiB a call may carry, and the lent machines' image holds jax, jaxlib,
# jax-cuda13-plugin and jax-cuda13-pjrt (0.11.2, seen 2026-11; KINDS.md).
# SPYGLASS_GPU_JAX_WHEELS=DIR at prepare adds the wheels in DIR to the stage
# (for an image without them), refused when the stage would pass the limit.
set -euo pipefail
cd "$(dirname "$0")/.."
carried=build/gpu_check

if [ "${1:-}" = "prepare" ]; then
  cuda=13.0
  sdk=build/cuda_sdk-$cuda/nvidia/cu13
  [ -x "$sdk/bin/nvcc" ] && [ -x "$sdk/nvvm/bin/cicc" ] && [ -f "$sdk/lib/libcupti.so.13" ] &&
    [ -f "$sdk/include/crt/host_defines.h" ] ||
    python3 -m pip install -q --no-deps --target "build/cuda_sdk-$cuda" nvidia-cuda-nvcc==13.0.88 \
      nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-cuda-cupti==13.0.85
  [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo  # (Ninja expected)
  # libspyglass.so by its file name: with Ninja the target name "spyglass"
  # also names the CLI's output file.
  cmake --build build -j2 --target libspyglass.so spyglass_memory gpu_check_reader
  stage=build/gpu_check_stage
  rm -rf "$stage" "$carried" && mkdir -p "$stage/lib" "$carried"
  "$sdk/bin/nvcc" -std=c++20 -O2 -g -Xcompiler -fno-omit-frame-pointer \
    -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90 \
    -Iinclude -I"$sdk/include" -c tests/gpu/gpu_check_program.cu -o "$stage/gpu_check_program.o" 2>/dev/null
  g++ -o "$stage/gpu_check_program" "$stage/gpu_check_program.o" -Lbuild -lspyglass -lspyglass_memory \
    "$sdk/lib/libcudart_static.a" "$sdk/lib/libcupti.so.13" -ldl -lpthread -lrt -Wl,-rpath,'$ORIGIN/lib'
  rm "$stage/gpu_check_program.o"
  cp build/tests/gpu/gpu_check_reader "$stage/"
  cp "$sdk/lib/libcupti.so.13" "$sdk/lib/libnvperf_host.so" "$sdk/lib/libnvperf_target.so" "$stage/lib/"
  # The shared libraries of our binaries (not glibc's own), debug info stripped.
  for so in $(ldd build/libspyglass.so "$stage/gpu_check_reader" | awk '$3 ~ /^\// {print $3}' | sort -u); do
    case "$(basename "$so")" in libc.so*|libm.so*|libpthread*|libdl.so*|librt.so*|ld-linux*|libutil*) continue;; esac
    cp -L "$so" "$stage/lib/"
  done
  cp -L build/libspyglass.so.0 "$stage/lib/"
  strip --strip-debug "$stage/lib/"libspyglass*.so* "$stage/gpu_check_reader"
  # Packed: unpacked it is over the 64 MiB that travels to the GPU machine.
  tar -C "$stage" -czf "$carried/stage.tar.gz" .
  rm -rf "$stage"
  # XProf's converter for the device's own Python (3.12; its other needs are
  # in that machine's image).
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 -d "$carried" xprof==2.24.2
  # The JAX leg: the spyglass package for the device's Python (3.12), built
  # here in a venv of its own (its CMake build dir is build-wheel/cp312-*).
  py312=$(ls -d "$HOME"/.pyenv/versions/3.12.*/bin/python 2>/dev/null | sort -V | tail -1 || true)
  [ -n "$py312" ] || py312=$(command -v python3.12 || true)
  if [ -n "$py312" ]; then
    venv=build/gpu_check_py312
    [ -x "$venv/bin/python" ] || "$py312" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.0"
    launcher=()
    command -v ccache >/dev/null && launcher=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
                                              --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
    "$venv/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation "${launcher[@]}" \
      -w "$carried" .
  else
    echo "gpu_check.sh prepare: no CPython 3.12 here (pyenv install 3.12): the JAX leg will be skipped" >&2
  fi
  if [ -n "${SPYGLASS_GPU_JAX_WHEELS:-}" ]; then
    cp "$SPYGLASS_GPU_JAX_WHEELS"/*.whl "$carried/"
  fi
  du -sh "$carried"
  # What a call may carry: the whole working tree travels too.
  kib=$(du -sk "$carried" | cut -f1)
  if [ "$kib" -gt $((56 * 1024)) ]; then
    echo "gpu_check.sh prepare: $carried is $((kib / 1024)) MiB; with the tree it passes the 64 MiB a call carries" >&2
    exit 4
  fi
  exit 0
fi

# The JAX leg: JAX's trace and ours on the GPU, one CUPTI subscriber (XLA's).
# Returns 0 (passed, or skipped: no wheel, no GPU backend in jax) or 1.
jax_leg() {
  local whl rc=0
  echo "== JAX on the GPU: one CUPTI subscriber (XLA's device tracer), our annotations around XLA's kernels"
  whl="$(ls "$carried"/spyglass-*-cp312-*.whl 2>/dev/null | head -1 || true)"
  if [ -z "$whl" ]; then
    echo "(no spyglass cp312 wheel in $carried: JAX leg skipped; 'prepare' builds it)"
    return 0
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/sg" "$whl" || return 1
  # Carried jax wheels (SPYGLASS_GPU_JAX_WHEELS at prepare) only where the image lacks jax.
  if ! python3 -c 'import jax' 2>/dev/null && ls "$carried"/jax*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/sg" "$carried"/jax*.whl || return 1
  fi
  PYTHONPATH="$tmp/sg${PYTHONPATH:+:$PYTHONPATH}" timeout 600 python3 tests/gpu/gpu_jax_check.py "$tmp/jax" || rc=$?
  case $rc in
    0) return 0 ;;
    77) echo "(jax has no GPU backend here: JAX leg skipped)"; return 0 ;;
    *) echo "the JAX leg FAILED (exit $rc)"; return 1 ;;
  esac
}

if [ "${1:-}" = "jax" ]; then
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  jax_leg
  exit $?
fi

[ -f "$carried/stage.tar.gz" ] || { echo "no $carried: run 'bash scripts/gpu_check.sh prepare' first" >&2; exit 2; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp" /tmp/gpu_check_overhead' EXIT
stage="$tmp/stage"
mkdir -p "$stage" && tar -C "$stage" -xzf "$carried/stage.tar.gz"
export LD_LIBRARY_PATH="$stage/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
command -v nvidia-smi >/dev/null && nvidia-smi -L || true
# The program and libcupti are CUDA 13.0: a driver older than CUDA 13's
# (580) cannot run them; say so rather than fail inside CUDA.
driver="$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
echo "driver ${driver:-unknown}"
if [ -n "$driver" ] && [ "${driver%%.*}" -lt 580 ] 2>/dev/null; then
  echo "driver $driver is older than CUDA 13 needs (580): rebuild the stage with CUDA 12 wheels" >&2
  exit 3
fi
grep -s RmProfilingAdminOnly /proc/driver/nvidia/params || true

echo "== trace"
out="$(timeout 120 "$stage/gpu_check_program" trace "$tmp/log" "$tmp/gpu.pprof.gz")"
echo "$out"
xplane="$(echo "$out" | sed -n 's/^xplane //p')"
timeout 120 "$stage/gpu_check_reader" "$xplane" "$tmp/gpu.pprof.gz"
whl="$(ls "$carried"/xprof-*.whl 2>/dev/null | head -1 || true)"
if ! python3 -c 'import xprof' 2>/dev/null && [ -n "$whl" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$tmp/site" "$whl" &&
    export PYTHONPATH="$tmp/site${PYTHONPATH:+:$PYTHONPATH}" || true
fi
if python3 -c 'import xprof' 2>/dev/null; then
  timeout 300 python3 tests/gpu/gpu_xprof_check.py "$xplane" --kernel scale_kernel --no-exact \
    --copy-bytes 1048576 --copy-bytes 65536 --annotation step::compute --pm-counter ""
else
  echo "(xprof not installed here: XProf's converter was checked on synthetic records by gpu_records_xprof)"
fi

# PM sampling in a second run, reported rather than required (counters
# may be restricted to admins): the counter samples, or the warning saying why.
echo "== trace with PM sampling (gpu_pm_sample_counters=sm__cycles_active.avg)"
if out_pm="$(GPU_CHECK_PM=1 timeout 120 "$stage/gpu_check_program" trace "$tmp/log_pm" "$tmp/gpu_pm.pprof.gz")"; then
  timeout 120 "$stage/gpu_check_reader" "$(echo "$out_pm" | sed -n 's/^xplane //p')" "$tmp/gpu_pm.pprof.gz" |
    grep -E "PM sampling|pm_sample|GPU CHECK" || true
else
  echo "the run with PM sampling FAILED (exit $?)"
fi

jax_failed=0
jax_leg || jax_failed=1

echo "== host cost per kernel launch (20000 empty kernels, best of 3)"
best() {
  local mode=$1 b=""
  for _ in 1 2 3; do
    v="$(timeout 60 "$stage/gpu_check_program" overhead 20000 "$mode" | sed -n 's/^ns_per_launch //p')"
    if [ -z "$b" ] || awk "BEGIN{exit !($v < $b)}"; then b=$v; fi
  done
  echo "$b"
}
none="$(best none)"; cupti="$(best cupti)"; spy="$(best spyglass)"
awk -v n="$none" -v c="$cupti" -v s="$spy" 'BEGIN {
  printf "no tracer            %8.1f ns/launch\n", n
  printf "CUPTI activity alone %8.1f ns/launch (+%.1f: the floor)\n", c, c - n
  printf "Spyglass             %8.1f ns/launch (+%.1f)\n", s, s - n
  if (c - n > 0) printf "Spyglass added cost / floor added cost: %.2fx (goal <= 1.2x)\n", (s - n) / (c - n)
}'
[ "$jax_failed" = 0 ] || { echo "GPU CHECK DONE (the JAX leg FAILED)"; exit 1; }
echo "GPU CHECK DONE"
