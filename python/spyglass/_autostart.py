"""Profiling started from outside the program.

The environment (read when the package is imported; the ``spyglass-autostart.pth``
file that ``pip install`` puts in site-packages imports it at interpreter start
when one of these is set, so unmodified scripts are profiled too):

  SPYGLASS_TRACE_DIR=DIR            trace from start to exit, written under DIR
  SPYGLASS_SERVER_PORT=[ADDR:]PORT  profiler server (127.0.0.1 unless ADDR)
  SPYGLASS_FLIGHT_RECORDER=SECONDS  flight recorder, the last SECONDS kept
  SPYGLASS_OPTIONS=key=value,...    ProfileOptions fields and advanced keys

and ``python -m spyglass run``'s flags, which name the same settings. The
values are parsed by the C++ core (the same parser as libspyglass's): a bad
one is a one-line message on stderr and the program runs on unprofiled.
The Python tracer is on (python_tracer_level=1) unless SPYGLASS_OPTIONS says
python_tracer_level=0.
"""
import atexit
import os
import platform
import sys

from . import _spyglass

ENV_NAMES = ("SPYGLASS_TRACE_DIR", "SPYGLASS_SERVER_PORT", "SPYGLASS_FLIGHT_RECORDER", "SPYGLASS_OPTIONS")

# What was started here (None: nothing), for `python -m spyglass run`.
started = None
_pid = None


def start(settings=None):
  """Starts what ``settings`` (a dict of ENV_NAMES, None: the environment) asks for.

  Returns the dict of what started; raises spyglass.InvalidArgumentError for
  bad values (nothing started).
  """
  global started, _pid
  result = _spyglass._start_from_settings(settings)
  if not (result["trace"] or result["server_port"] or result["flight_recorder"]):
    return result
  started, _pid = result, os.getpid()
  if result["trace"]:
    _spyglass.set_metadata("python_version", platform.python_version())
  if result["server_port"]:
    from . import profiler  # pylint: disable=g-import-not-at-top
    profiler._server_port = result["server_port"]  # pylint: disable=protected-access
  atexit.register(_stop)
  return result


@_spyglass._untraced
def _stop():
  global started
  if started is None or os.getpid() != _pid:  # a forked child owns nothing of it
    return
  started = None
  sys.stdout.flush()
  _spyglass._stop_started()


def start_from_environment():
  """At import: the SPYGLASS_* environment, if any of it is set."""
  if not any(os.environ.get(n) for n in ENV_NAMES[:3]):
    return
  try:
    start(None)
  except ValueError as e:
    print(f"spyglass: {e}; running without profiling", file=sys.stderr, flush=True)
