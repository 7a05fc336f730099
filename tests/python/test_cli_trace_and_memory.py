"""`spyglass run --memory --trace` of a Python program: one core in the process.

The heap hook loads libspyglass for the SPYGLASS_* settings of programs that
are not Python; in a Python that has this package, the package's .pth starts
them with the core the extension carries, and a second core (libspyglass)
registered the same protobuf descriptors in the one libprotobuf: abort. The
hook leaves Python to its startup module, which loads libspyglass only when
the package started nothing (a Python without the package)."""
import glob
import os
import subprocess
import sys

import pytest

from pprof_decode import parse_profile
from test_cli import SPYGLASS, sh
from test_env_start import check_script_functions, clean_env, trace_events, write_script


def heap_profile(mem):
  [prof] = glob.glob(os.path.join(mem, "memory.*.exit.prof"))
  with open(prof, "rb") as f:
    return parse_profile(f.read())


def test_memory_and_trace_of_a_python_with_the_package(tmp_path):
  script = write_script(tmp_path)
  logs, mem = str(tmp_path / "logs"), str(tmp_path / "mem")
  r = sh(SPYGLASS, "run", "--memory", "--trace", logs, "-o", mem, "--", sys.executable, script, "exit", "5")
  assert r.returncode == 5, r.stderr  # the program's own status, not SIGABRT's 134
  assert "FATAL" not in r.stderr and "cannot be loaded" not in r.stderr, r.stderr
  assert "ARGS ['exit', '5']" in r.stdout
  assert r.stderr.count("spyglass: trace written to " + logs) == 1, r.stderr  # one core, one trace
  check_script_functions(trace_events(logs))  # the package's: its Python tracer recorded the script
  assert any(path == script for s in heap_profile(mem) for _, path, _ in s["frames"])


def test_memory_and_trace_of_a_python_without_the_package(tmp_path):
  # The interpreter the test venv was made from: this package is not installed there.
  base = getattr(sys, "_base_executable", None)
  if not base or subprocess.run([base, "-c", "import spyglass"], capture_output=True, env=clean_env()).returncode == 0:
    pytest.skip("no interpreter without the spyglass package")
  script = write_script(tmp_path)
  logs, mem = str(tmp_path / "logs"), str(tmp_path / "mem")
  r = sh(SPYGLASS, "run", "--memory", "--trace", logs, "-o", mem, "--", base, script)
  assert r.returncode == 0, r.stderr
  # libspyglass, loaded by the startup module, wrote it (no Python tracer there).
  assert r.stderr.count("spyglass: trace written to " + logs) == 1, r.stderr
  assert len(glob.glob(os.path.join(logs, "plugins", "profile", "*", "*.xplane.pb"))) == 1
  assert any(path == script for s in heap_profile(mem) for _, path, _ in s["frames"])
