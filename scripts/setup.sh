#!/usr/bin/env bash
# Installs what building and testing Spyglass needs on Debian 12: compilers and
# libraries from Debian, the real peers (xprof) from PyPI. Idempotent.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
pkgs=(build-essential cmake ninja-build pkg-config git
      protobuf-compiler libprotobuf-dev libgrpc++-dev protobuf-compiler-grpc
      zlib1g-dev libisal-dev libdeflate-dev libgtest-dev libbenchmark-dev nlohmann-json3-dev libcli11-dev
      python3 python3-pip libdw-dev libunwind-dev golang-go)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
fi
# The real peers that tests run: XProf's converter and capture route, JAX's
# collect_profile and profiler server.
python3 -c 'import xprof, jax' 2>/dev/null || python3 -m pip install -q xprof jax
