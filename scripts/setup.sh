#!/usr/bin/env bash
# Installs what building and testing Spyglass needs on Debian 12: compilers and
# libraries from Debian, the real peers (xprof) from PyPI. Idempotent.
#   bash scripts/setup.sh            what building and the demo need
#   bash scripts/setup.sh --browser  also the peers only the tests run
#                                    (Debian's chromium and heaptrack, pinned npm packages)
set -euo pipefail
cd "$(dirname "$0")/.."
browser=false
[ "${1:-}" = "--browser" ] && browser=true
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config git
      protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc
      zlib1g-dev libisal-dev libdeflate-dev libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      python3 python3-pip libdw-dev libunwind-dev golang-go)
# Peers only the tests run (the flag's name is historical): chromium, Node.js,
# heaptrack (memory_peak_test and BENCHMARKS.md "Memory" compare with it),
# jemalloc (its sampled heap profiling is the sampled mode's peer in
# BENCHMARKS.md), and ccache, which lets scripts/python_test.sh build the
# package for each CPython without compiling the C++ core again.
# The `real` tier's programs nobody here wrote (tests/real): Debian's sqlite3,
# and valgrind's massif as the peer of their peaks.
$browser && pkgs+=(chromium nodejs heaptrack libjemalloc2 ccache sqlite3 valgrind)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
# The real peers that tests run: XProf's converter and capture route, JAX's
# collect_profile and profiler server.
python3 -c 'import xprof, jax' 2>/dev/null || python3 -m pip install -q xprof jax
# The Perfetto project's own classes: tests/perfetto decodes our native trace with them.
python3 -c 'import perfetto.protos.perfetto.trace.perfetto_trace_pb2' 2>/dev/null || python3 -m pip install -q perfetto
# memray: the peer of the Python memory profiles (tests/python/test_python_heap.py).
python3 -c 'import memray' 2>/dev/null || python3 -m pip install -q memray
if $browser; then
  # npm comes with the machine's Node.js; Debian's own nodejs needs its npm package.
  command -v npm >/dev/null || { $SUDO apt-get update -q; DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q npm; }
  # speedscope's web app and playwright-core (drives Debian's chromium),
  # pinned by tests/browser/package-lock.json.
  [ -d tests/browser/node_modules/speedscope ] && [ -d tests/browser/node_modules/playwright-core ] ||
    (cd tests/browser && npm ci --no-audit --no-fund --loglevel=error)
fi
if $browser; then
  # NVIDIA's CUPTI headers and libcupti for the GPU record tests (tests/gpu; no
  # GPU needed): pip wheels into the build tree, never committed.
  [ -f build/cuda_pip/nvidia/cu13/include/crt/host_defines.h ] && [ -f build/cuda_pip/nvidia/cu13/lib/libcupti.so.13 ] ||
    python3 -m pip install -q --no-deps --target build/cuda_pip \
      nvidia-cuda-cupti==13.5.25 nvidia-cuda-runtime==13.5.37 nvidia-cuda-crt==13.5.37
fi
