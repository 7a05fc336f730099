#!/usr/bin/env bash
# The Python package's tests: a virtualenv, `pip install .` into it, pytest.
# The venv sees the system's site-packages (jax, xprof, numpy installed by
# scripts/setup.sh or earlier runs are reused, not downloaded again), and the
# wheel build keeps its CMake build dir (build-wheel/, see pyproject.toml), so
# a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPYGLASS_VENV:-.venv-test}
[ -x "$VENV/bin/python" ] || python3 -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check \
  "scikit-build-core>=0.10" "nanobind>=2.0" pytest numpy jax xprof memray
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation .
# Run from outside the source tree so that `import spyglass` is the installed package.
cd tests/python
"../../$VENV/bin/python" -m pytest -q -p no:cacheprovider .
