#!/usr/bin/env bash
# The Python package's tests: a virtualenv, `pip install .` into it, pytest.
# The venv sees the system's site-packages (jax, xprof, numpy installed by
# scripts/setup.sh or earlier runs are reused, not downloaded again), and the
# wheel build keeps its CMake build dir (build-wheel/, see pyproject.toml), so
# a second run only rebuilds what changed.
#
# Every Python: the full suite runs on the default python3 (3.11); then the
# package is built, installed and tested on the oldest and newest CPython we
# support (3.10, 3.13; from pyenv or PATH) in venvs of their own: the
# version-dependent files of the suite, less the real-peer tests (jax, xprof,
# memray: installed for python3 only), and on the newest the real programs.
# With ccache (scripts/setup.sh installs it for the tests) and CCACHE_BASEDIR
# at the repository, those builds reuse the C++ core compiled for the first
# one: only the extension's Python-dependent files compile again.
# On the newest one, the newest jax too (0.12 needs Python 3.12+): our
# ProfileData/ProfileSession names and outputs against jax's own classes,
# FDO/PGLE and device memory against jax's, and JAX's own profiler tests on
# spyglass.profiler where their files are found (test_jax_own_tests.py).
# Each pytest runs its tests on JOBS workers (pytest-xdist, default 2): most
# tests wait on the programs they run, so two at once use both cores.
#   SPYGLASS_PYTHONS="3.10 3.13"   the extra versions (empty: none)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
workers=${JOBS:-2}
export CCACHE_BASEDIR=$ROOT
build_args=()
if command -v ccache >/dev/null; then
  build_args+=(--config-settings=cmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache
               --config-settings=cmake.define.CMAKE_C_COMPILER_LAUNCHER=ccache)
fi

# install_and_test VENV PYTHON [pytest args...]
install_and_test() {
  local venv=$1 py=$2
  shift 2
  [ -x "$venv/bin/python" ] || "$py" -m venv --system-site-packages "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "scikit-build-core>=0.10" "nanobind>=2.0" pytest pytest-xdist numpy protobuf py-spy
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation "${build_args[@]}" .
  # Run from outside the source tree so that `import spyglass` is the installed package.
  # The tests marked serial (CPU shares to 3 points) run alone, after the others.
  (cd tests/python && "$ROOT/$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --durations=15 \
     -m "not serial" "$@")
  local rc=0
  (cd tests/python && "$ROOT/$venv/bin/python" -m pytest -q -p no:cacheprovider -m serial "$@") || rc=$?
  [ $rc -eq 0 ] || [ $rc -eq 5 ]  # 5: none of the selected tests is marked serial
}

VENV=${SPYGLASS_VENV:-.venv-test}
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
# absl-py and portpicker: what JAX's own profiler tests import (test_jax_own_tests.py).
"$VENV/bin/python" -m pip install -q --disable-pip-version-check jax xprof memray absl-py portpicker
install_and_test "$VENV" python3 "${@:-.}"  # pytest arguments, if given: the files or tests to run

pythons=${SPYGLASS_PYTHONS-3.10 3.13}
newest=${pythons##* }
for v in $pythons; do
  # pyenv's own install first (its shims answer for the global version only).
  py=$(ls -d "$HOME"/.pyenv/versions/"$v".*/bin/python 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$py" ] && command -v "python$v" >/dev/null && "python$v" -c '' 2>/dev/null; then py=$(command -v "python$v"); fi
  [ -n "$py" ] || { echo "python_test.sh: CPython $v not found (pyenv install $v, or set SPYGLASS_PYTHONS)" >&2; exit 1; }
  echo "== CPython $v ($py)"
  # Its own site-packages only: the system's are python3's.
  venv=.venv-test-py${v/./}
  [ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
  # The files whose code differs by version (frames, the tracer, the heap
  # hook, the sampler's Python stacks; the rest is the same C++ on every
  # version), and on the newest the real programs too: CI keeps its time.
  files=(test_python_heap.py test_python_tracer.py test_sampling.py test_api.py test_closed_streams.py
         test_numpy_memory.py test_profile_data.py test_tracer_under_heap_hook.py)
  [ "$v" = "$newest" ] && files+=(test_real_programs.py test_run_args.py test_env_start.py)
  install_and_test "$venv" "$py" -k "not jax and not xprof and not memray" --ignore=test_jax_compat.py \
    --ignore=test_xprof_and_processes.py "${files[@]}"
  if [ "$v" = "$newest" ]; then
    echo "== CPython $v with the newest jax: names, ProfileData, FDO/PGLE, device memory, JAX's own tests"
    "$venv/bin/python" -m pip install -q --disable-pip-version-check jax absl-py portpicker
    (cd tests/python && "$ROOT/$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" test_api.py test_profile_data.py \
      test_jax_fdo.py test_jax_device_memory.py test_jax_own_tests.py test_jax_plugin.py)
  fi
done
