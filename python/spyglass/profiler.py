"""jax.profiler's API, on Spyglass's C++ core.

A program written against jax.profiler's profiling calls runs unchanged with

    import spyglass.profiler as profiler      # instead of: import jax.profiler as profiler

Names and semantics follow jax.profiler:

* ``trace(log_dir, create_perfetto_link=False, create_perfetto_trace=False,
  profiler_options=None)``: context manager, ``start_trace`` ... ``stop_trace``.
* ``start_trace`` raises ``RuntimeError("Profile has already been started. Only
  one profile may be run at a time.")`` when a trace runs; bad options raise
  ``spyglass.InvalidArgumentError`` (a ``ValueError``) before anything starts.
* ``stop_trace`` raises ``RuntimeError("No profile started")`` without one; it
  writes ``<log_dir>/plugins/profile/<run>/<host>.xplane.pb`` and
  ``<host>.trace.json.gz`` (and ``perfetto_trace.json.gz`` when asked).
* ``TraceAnnotation(name, **kwargs)`` / ``StepTraceAnnotation(name, **kwargs)``:
  context managers recording an event; keyword arguments become event
  arguments (bool -> 1/0, int, float, str; others ``str()``).
* ``annotate_function(func, name=None, **kwargs)``: decorator, bare or through
  ``functools.partial(annotate_function, name=..., **kwargs)``.
* ``ProfileOptions()``: JAX's attributes and defaults (``python_tracer_level=1``,
  ``host_tracer_level=2``, ``advanced_configuration={}`` ...).

With ``python_tracer_level=1`` (the default, as in JAX) every Python function
call is recorded as an event named ``$<file>:<line> <function>`` on its
thread, next to the annotations.
"""
from __future__ import annotations

import contextlib
import functools
import os
import platform
from typing import Any, Callable, Optional

from . import _spyglass
from ._spyglass import InvalidArgumentError, StepTraceAnnotation, TraceAnnotation
from .memory import record_allocation, record_free, track_numpy

__all__ = [
    "ProfileOptions",
    "StepTraceAnnotation",
    "TraceAnnotation",
    "annotate_function",
    "device_memory_profile",
    "register_subprocess",
    "save_device_memory_profile",
    "start_server",
    "start_trace",
    "stop_server",
    "stop_trace",
    "dump_flight_recorder",
    "flight_recorder_active",
    "trace",
    # Spyglass extras
    "InvalidArgumentError",
    "last_trace_files",
    "last_trace_stats",
    "set_metadata",
    "clear_metadata",
    "record_allocation",
    "record_free",
    "track_numpy",
]


class ProfileOptions(_spyglass.ProfileOptions):
  """Options of a trace, with jax.profiler.ProfileOptions's attributes.

  Defaults as in JAX: include_dataset_ops=True, host_tracer_level=2,
  python_tracer_level=1, enable_hlo_proto=True, start_timestamp_ns=0,
  duration_ms=0, repository_path="", raise_error_on_start_failure=False,
  session_id="", advanced_configuration={}.
  Spyglass adds buffer_bytes_per_thread and buffer_bytes_total, and the
  flight recorder's ring_buffer_seconds and ring_buffer_bytes.
  """

  def __init__(self):
    super().__init__()
    self.python_tracer_level = 1

  def __repr__(self):
    fields = ("include_dataset_ops", "host_tracer_level", "python_tracer_level",
              "enable_hlo_proto", "start_timestamp_ns", "duration_ms",
              "repository_path", "raise_error_on_start_failure", "session_id",
              "advanced_configuration")
    return "ProfileOptions(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in fields) + ")"


def start_trace(log_dir, create_perfetto_link: bool = False,
                create_perfetto_trace: bool = False,
                profiler_options: Optional[ProfileOptions] = None, *,
                perfetto_link_timeout_s: int = 300) -> None:
  """Starts a trace that stop_trace() writes under ``log_dir``.

  ``create_perfetto_link``: stop_trace also writes perfetto_trace.json.gz and
  serves it once on 127.0.0.1:9001 for ui.perfetto.dev, blocking until it was
  fetched, for at most ``perfetto_link_timeout_s`` seconds (a Spyglass extra;
  0 waits without a limit, as JAX). Ctrl-C ends the wait (KeyboardInterrupt);
  the files are written before it starts.
  ``create_perfetto_trace``: write perfetto_trace.json.gz only.
  """
  options = ProfileOptions() if profiler_options is None else profiler_options
  if not isinstance(options, _spyglass.ProfileOptions):
    raise TypeError(f"profiler_options must be a ProfileOptions, not {type(options).__name__}")
  python_version = platform.python_version()
  _spyglass.start_trace(str(log_dir), bool(create_perfetto_link), bool(create_perfetto_trace),
                        options, int(perfetto_link_timeout_s))
  # Recorded in the /host:metadata plane (the core clears it at every start).
  _spyglass.set_metadata("python_version", python_version)


# The stop path is not recorded by the Python tracer (its frames would be cut
# by the stop and written as incomplete events).
@_spyglass._untraced
def stop_trace() -> None:
  """Stops the running trace and writes its files (see start_trace)."""
  _spyglass.stop_trace()


def dump_flight_recorder(log_dir=None) -> None:
  """Writes the running flight recorder's last seconds as a run, and runs on.

  The flight recorder is a trace started with
  ``ProfileOptions.ring_buffer_seconds > 0``. ``log_dir`` defaults to the one
  start_trace was given; last_trace_files() names the files written.
  """
  _spyglass.dump_flight_recorder("" if log_dir is None else os.fspath(log_dir))


def flight_recorder_active() -> bool:
  """Whether a flight recorder runs in this process."""
  return _spyglass.flight_recorder_active()


class trace(contextlib.ContextDecorator):  # pylint: disable=invalid-name
  """Context manager: start_trace(...) on entry, stop_trace() on exit (also on errors).

  As jax.profiler.trace; also usable as a decorator.
  """

  def __init__(self, log_dir, create_perfetto_link: bool = False, create_perfetto_trace: bool = False,
               profiler_options: Optional[ProfileOptions] = None, *, perfetto_link_timeout_s: int = 300):
    self._args = (log_dir, create_perfetto_link, create_perfetto_trace, profiler_options)
    self._timeout = perfetto_link_timeout_s

  def __enter__(self):
    start_trace(*self._args, perfetto_link_timeout_s=self._timeout)
    return None

  @_spyglass._untraced
  def __exit__(self, *exc):
    _spyglass.stop_trace()
    return False


def annotate_function(func: Callable, name: Optional[str] = None, **decorator_kwargs):
  """Records every call of ``func`` as an event.

  The event is named ``name``, else ``func.__qualname__``, else ``func.__name__``;
  ``decorator_kwargs`` become its arguments (the call's own arguments are
  passed to ``func`` untouched). Use ``functools.partial(annotate_function,
  name=..., key=value)`` to give them.
  """
  name = name or getattr(func, "__qualname__", None) or func.__name__
  if decorator_kwargs:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
      with TraceAnnotation(name, **decorator_kwargs):
        return func(*args, **kwargs)
  else:
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
      with TraceAnnotation(name):
        return func(*args, **kwargs)
  return wrapper


# --- Spyglass extras --------------------------------------------------------

def last_trace_files() -> dict:
  """Paths the last stop_trace wrote: run_dir, xplane_path, trace_json_path, perfetto_trace_path."""
  return _spyglass.last_trace_files()


def last_trace_stats() -> dict:
  """What the last trace recorded: events, dropped_events, incomplete_events, threads."""
  return _spyglass.last_trace_stats()


def set_metadata(key: str, value: str) -> None:
  """Adds a key/value to the running trace's /host:metadata plane."""
  _spyglass.set_metadata(str(key), str(value))


def clear_metadata() -> None:
  _spyglass.clear_metadata()


# --- Server and memory profiles ----------------------------------------------
# Thin wrappers of the C++ server (include/spyglass/server.h) and memory
# profiles (include/spyglass/memory.h); where this build of the core lacks
# them, the names raise NotImplementedError instead of pretending to work.

_HAVE_SERVER = hasattr(_spyglass, "start_server")
_HAVE_MEMORY = hasattr(_spyglass, "device_memory_profile")
_server_port = None


def _forget_server_in_child():
  # A forked child does not own its parent's server.
  global _server_port
  _server_port = None


os.register_at_fork(after_in_child=_forget_server_in_child)


def _missing(what: str, header: str):
  raise NotImplementedError(
      f"spyglass.profiler.{what} is not available: this build of the C++ core does not provide it "
      f"({header})")


def start_server(port: int, requires_backend: bool = True):
  """Starts the profiler server (gRPC tensorflow.ProfilerService) on 127.0.0.1:``port``.

  ``python -m spyglass.collect_profile <port> <ms>`` (or jax.collect_profile,
  or XProf's CAPTURE PROFILE) then captures this process. Raises
  ``ValueError("Only one profiler server can be active at a time.")`` if one
  runs. Returns the port it listens on (a free one for port 0).
  """
  global _server_port
  del requires_backend  # no backend to initialise
  if not _HAVE_SERVER:
    _missing("start_server", "include/spyglass/server.h")
  if _server_port is not None:
    raise ValueError("Only one profiler server can be active at a time.")
  try:
    _server_port = _spyglass.start_server(int(port))
  except RuntimeError as e:
    if getattr(e, "code", "") == "AlreadyExists":  # as JAX: a ValueError
      raise ValueError("Only one profiler server can be active at a time.") from None
    raise
  return _server_port


def stop_server() -> None:
  """Stops the profiler server; ``ValueError("No active profiler server.")`` if none runs."""
  global _server_port
  if not _HAVE_SERVER:
    _missing("stop_server", "include/spyglass/server.h")
  try:
    _spyglass.stop_server()
  except RuntimeError as e:
    if getattr(e, "code", "") == "FailedPrecondition":  # as JAX: a ValueError
      raise ValueError("No active profiler server.") from None
    raise
  finally:
    _server_port = None


def register_subprocess(pid: int, port: int) -> Callable[[], None]:
  """Registers child ``pid``'s profiler server (127.0.0.1:``port``): traces of
  this process then include the child's planes as ``"<plane> [<pid>]"``.
  Returns a callable that unregisters it (also done when it is garbage-collected).
  """
  if not _HAVE_SERVER:
    _missing("register_subprocess", "include/spyglass/server.h")
  return _spyglass.register_subprocess(int(pid), int(port))


def device_memory_profile(backend: Optional[str] = None) -> bytes:
  """A snapshot of the tracked live allocations as gzipped pprof bytes.

  Allocations recorded from Python (``record_allocation``, numpy arrays after
  ``track_numpy()``) carry their Python stacks, as in JAX's profiles.
  """
  if not _HAVE_MEMORY:
    _missing("device_memory_profile", "include/spyglass/memory.h")
  return _spyglass.device_memory_profile(backend or "")


def save_device_memory_profile(filename, backend: Optional[str] = None) -> None:
  """Writes device_memory_profile(backend) to ``filename`` (replaced).

  Written as every Spyglass output is: never through a symbolic link, under
  a temporary name renamed into place when complete.
  """
  if not _HAVE_MEMORY:
    _missing("save_device_memory_profile", "include/spyglass/memory.h")
  _spyglass.save_device_memory_profile(os.fspath(filename), backend or "")
