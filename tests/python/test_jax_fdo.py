"""stop_and_get_fdo_profile and PGLEProfiler: jax._src.profiler's, on Spyglass.

The JAX cases run in fresh interpreters (jax stays out of the test process)
and compare with what jax's own functions return for the same program.
"""
import json
import os
import warnings

import pytest

import spyglass.profiler as profiler
from conftest import run_python

JAX_ENV = {"JAX_PLATFORMS": "cpu"}


def have_jax():
  try:
    import jax  # pylint: disable=g-import-not-at-top,unused-import
    return True
  except ImportError:
    return False


needs_jax = pytest.mark.skipif(not have_jax(), reason="jax not installed")


def test_fdo_profile_without_a_trace_raises():
  with pytest.raises(RuntimeError, match="^No profile started$"):
    profiler.stop_and_get_fdo_profile()


def test_fdo_profile_of_a_trace_without_devices_is_empty_and_writes_nothing(tmp_path):
  log_dir = tmp_path / "logs"
  profiler.start_trace(log_dir)
  with profiler.TraceAnnotation("work"):
    sum(range(1000))
  assert profiler.stop_and_get_fdo_profile() == b""
  assert not log_dir.exists()  # jax's stop_and_get_fdo_profile exports nothing
  # The stopped trace is in memory, as a ProfileSession's.
  names = {e.name for p in profiler.ProfileData.from_serialized_xspace(
      profiler._spyglass._serialize_xspace(profiler._spyglass._last_trace_profile_data())).planes
           for line in p.lines for e in line.events}
  assert "work" in names
  profiler.start_trace(log_dir)  # nothing left running
  profiler.stop_trace()


def test_failing_fdo_conversion_leaves_no_session_running(tmp_path, monkeypatch):
  session = profiler.start_trace(tmp_path)

  def broken(*args, **kwargs):
    raise ZeroDivisionError("converter failed")

  monkeypatch.setattr(profiler, "_fdo_profile_of", broken)
  with pytest.raises(ZeroDivisionError):
    profiler.stop_and_get_fdo_profile()
  assert not session.is_running
  with pytest.raises(RuntimeError, match="No profile started"):
    profiler.stop_trace()
  profiler.start_trace(tmp_path)  # would raise "already started" had it been left running
  profiler.stop_trace()


def test_pgle_session_is_not_the_trace_stop_trace_stops():
  runner = profiler.PGLEProfiler(1, 90)
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    with profiler.PGLEProfiler.trace(runner):
      assert runner.is_running()
      with pytest.raises(RuntimeError, match="No profile started"):
        profiler.stop_trace()
      with pytest.raises(RuntimeError, match="Only one profile may be run at a time"):
        profiler.start_trace(None)
  assert not runner.is_running()
  profiler.start_trace(None)
  profiler.stop_trace()


def test_pgle_failing_body_stops_its_session():
  runner = profiler.PGLEProfiler(2, 90)
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    with pytest.raises(KeyError):
      with profiler.PGLEProfiler.trace(runner):
        raise KeyError("body")
  assert not runner.is_running() and runner.called_times == 1
  profiler.start_trace(None)
  profiler.stop_trace()


# The program of jax's testProfilerGetFDOProfile: start through the profiler,
# stop through stop_and_get_fdo_profile, with a relative log_dir.
FDO_PROGRAM = """
import json, os, sys
import jax, jax.numpy as jnp
IMPL = sys.argv[1]
if IMPL == "spyglass":
    import spyglass.profiler as profiler
    internal = profiler
else:
    import jax.profiler as profiler
    from jax._src import profiler as internal
os.chdir(sys.argv[2])
try:
    profiler.start_trace("test")
    out = jax.pmap(lambda x: jax.lax.psum(x + 1, "i"), axis_name="i")(jnp.ones(jax.local_device_count()))
    jax.block_until_ready(out)
finally:
    fdo = internal.stop_and_get_fdo_profile()
# A trace after it starts (nothing left running).
profiler.start_trace("after")
profiler.stop_trace()
print(json.dumps({"type": type(fdo).__name__, "fdo": fdo.hex(), "wrote_test": os.path.exists("test")}))
"""


@needs_jax
def test_fdo_profile_equals_jax_on_cpu(tmp_path):
  results = {}
  for impl in ("spyglass", "jax"):
    d = tmp_path / impl
    d.mkdir()
    p = run_python(FDO_PROGRAM, impl, str(d), env=JAX_ENV, timeout=300)
    results[impl] = json.loads(p.stdout.strip().splitlines()[-1])
  assert results["spyglass"] == results["jax"]
  assert results["spyglass"]["type"] == "bytes"


PGLE_PROGRAM = """
import json, sys, warnings
import jax, jax.numpy as jnp
if sys.argv[1] == "spyglass":
    import spyglass.profiler as profiler
else:
    from jax._src import profiler
f = jax.jit(lambda x: jnp.sin(x) @ x.T)
x = jnp.ones((64, 64))
runner = profiler.PGLEProfiler(2, 90)
caught = []
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    for _ in range(3):  # the third run is not profiled: retries reached
        with profiler.PGLEProfiler.trace(runner):
            f(x).block_until_ready()
        caught.append(runner.consume_fdo_profile())
    categories = sorted({c.category.__name__ for c in w})
print(json.dumps({
    "called_times": runner.called_times,
    "profiles": [p.hex() for p in runner.fdo_profiles],
    "consumed": [None if c is None else c.hex() for c in caught],
    "is_fdo_consumed": runner.is_fdo_consumed(),
    "warnings": categories,
    "running": runner.is_running(),
}))
"""


@needs_jax
def test_pgle_profiler_equals_jax_on_cpu():
  results = {}
  for impl in ("spyglass", "jax"):
    p = run_python(PGLE_PROGRAM, impl, env=JAX_ENV, timeout=300)
    results[impl] = json.loads(p.stdout.strip().splitlines()[-1])
  assert results["spyglass"] == results["jax"]
  # On CPU: two empty profiles, each warned about, aggregated to b"" once retries are reached.
  assert results["spyglass"]["called_times"] == 2
  assert results["spyglass"]["consumed"] == [None, "", ""]
  assert results["spyglass"]["warnings"] == ["RuntimeWarning"]


@needs_jax
def test_fdo_profile_goes_through_jaxlibs_converter(tmp_path):
  # In a JAX program the XSpace of our trace is what jaxlib's converter reads:
  # the same bytes give the same answer as jaxlib called on them directly.
  code = """
import jax, jax.numpy as jnp
import spyglass.profiler as profiler
from jax._src.lib import _profiler
calls = []
real = _profiler.get_fdo_profile
import jaxlib._profiler as jp
profiler.start_trace(None)
jax.jit(lambda x: x * 2)(jnp.ones(8)).block_until_ready()
session = profiler._state.session
data = profiler._stop_in_memory(session)
xspace = profiler._spyglass._serialize_xspace(data)
assert profiler._fdo_profile_of(data) == real(xspace)
assert profiler._fdo_profile_of(data, as_textproto=True) == real(xspace, True)
assert profiler._jaxlib_profiler() is jp
print("ok")
"""
  assert run_python(code, env=JAX_ENV, timeout=300).stdout.strip().endswith("ok")


def test_failing_start_step_leaves_no_session_running(tmp_path, monkeypatch):
  # A step after the core's start fails: the start raises and nothing runs.
  def broken():
    raise ZeroDivisionError("after the start")

  monkeypatch.setattr(profiler.platform, "python_version", broken)
  with pytest.raises(ZeroDivisionError):
    profiler.start_trace(tmp_path)
  monkeypatch.undo()
  with pytest.raises(RuntimeError, match="No profile started"):
    profiler.stop_trace()
  profiler.start_trace(None)
  profiler.stop_trace()


def test_failing_stop_step_still_stops_the_session(tmp_path, monkeypatch):
  session = profiler.start_trace(tmp_path)

  def broken():
    raise ZeroDivisionError("before the stop")

  monkeypatch.setattr(profiler, "_sample_jax_memory", broken)
  with pytest.raises(ZeroDivisionError):
    session.stop()
  monkeypatch.undo()
  assert not session.is_running
  profiler.start_trace(None)  # the core's session was stopped too
  profiler.stop_trace()
