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
  # The core named this process the first to start (its children stay quiet,
  # src/session/env_start.cc); os.environ, which subprocess copies, too.
  os.environ.setdefault("SPYGLASS_ENV_FIRST_PID", str(_pid))
  if result["trace"]:
    _spyglass.set_metadata("python_version", platform.python_version())
  if result["server_port"]:
    from . import profiler  # pylint: disable=g-import-not-at-top
    profiler._server_port = result["server_port"]  # pylint: disable=protected-access
  atexit.register(_stop)
  return result


def say(line):
  """One line of ours on fd 2, whatever the program did to sys.stderr (closed,
  replaced, detached); a failing write is dropped, never raised into the program."""
  try:
    os.write(2, f"spyglass: {line}\n".encode("utf-8", "replace"))
  except OSError:
    pass


def _flush_program_stdout():
  """The program's pending output before our lines on the same terminal. Its
  stream may be closed (json.tool closes sys.stdout), replaced or broken: never raise."""
  try:
    out = sys.stdout
    if out is not None and not out.closed:
      out.flush()
  except Exception:  # pylint: disable=broad-except
    pass


@_spyglass._untraced
def _stop():
  global started
  if started is None or os.getpid() != _pid:  # a forked child owns nothing of it
    return
  started = None
  _flush_program_stdout()
  # The trace is written (and its line printed to fd 2 by the core) whatever
  # the program's streams are; an error here must not end the other atexit work.
  try:
    _spyglass._stop_started()
  except Exception as e:  # pylint: disable=broad-except
    say(f"cannot stop profiling: {e}")


def start_from_environment():
  """At import: the SPYGLASS_* environment, if any of it is set."""
  if not any(os.environ.get(n) for n in ENV_NAMES[:3]):
    return
  try:
    start(None)
  except ValueError as e:
    say(f"{e}; running without profiling")
