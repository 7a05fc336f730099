"""jax.profiler's API, on Spyglass's C++ core.

A program written against jax.profiler's profiling calls runs unchanged with

    import spyglass.profiler as profiler      # instead of: import jax.profiler as profiler

Names and semantics follow jax.profiler:

* ``trace(log_dir=None, create_perfetto_link=False, create_perfetto_trace=False,
  profiler_options=None)``: context manager yielding the ``ProfileSession``;
  ``log_dir=None`` keeps the trace in memory only.
* ``ProfileSession(log_dir=None, ...)``: ``start()``, ``stop()`` (returns the
  ``ProfileData``), ``is_running``, ``profile_data``, ``export_profile_data``;
  ``start_trace`` returns one, ``stop_trace`` returns its ``ProfileData``.
* ``ProfileData`` / ``ProfilePlane`` / ``ProfileLine`` / ``ProfileEvent``: a
  profile read from code (``ProfileData.from_file(path)``, ...), over the C++
  model; ``export_profile_data(data_or_session, log_dir, ...)`` writes one as
  a run of ``log_dir``.
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
import threading
from typing import Any, Callable, Optional, Union

from . import _spyglass
from ._spyglass import (InvalidArgumentError, ProfileData, ProfileEvent, ProfileLine, ProfilePlane,
                        StepTraceAnnotation, TraceAnnotation)
from .memory import record_allocation, record_free, track_numpy
from . import _jax_session  # a JAX process: XLA's session joins ours (docs/jax-plugin.md)

__all__ = [
    "ProfileData",
    "ProfileEvent",
    "ProfileLine",
    "ProfileOptions",
    "ProfilePlane",
    "ProfileSession",
    "StepTraceAnnotation",
    "TraceAnnotation",
    "annotate_function",
    "device_memory_profile",
    "export_profile_data",
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


class _State:
  """The running ProfileSession of this process (the C++ core allows one)."""

  def __init__(self):
    self.lock = threading.Lock()
    self.session: Optional["ProfileSession"] = None


_state = _State()


class ProfileSession:
  """A profiling session (jax.profiler.ProfileSession).

  ``start()`` ... ``stop()``, or a context manager. After ``stop()`` the
  trace is in memory as ``profile_data`` (a ProfileData sharing the C++
  model, nothing copied); with a ``log_dir`` it is also written there, as
  ``stop_trace`` writes it; ``export_profile_data`` writes it (again)
  elsewhere.
  """

  def __init__(self, log_dir=None, create_perfetto_link: bool = False,
               create_perfetto_trace: bool = False,
               profiler_options: Optional[ProfileOptions] = None, *,
               perfetto_link_timeout_s: int = 300):
    self.log_dir: Optional[str] = os.fspath(log_dir) if log_dir is not None else None
    self.create_perfetto_link: bool = create_perfetto_link
    self.create_perfetto_trace: bool = create_perfetto_trace or create_perfetto_link
    self.profiler_options: Optional[ProfileOptions] = profiler_options
    self.perfetto_link_timeout_s = perfetto_link_timeout_s
    self._profile_data: Optional[ProfileData] = None
    self._is_running = False

  def start(self) -> "ProfileSession":
    """Starts the session; RuntimeError if one runs (see start_trace)."""
    options = ProfileOptions() if self.profiler_options is None else self.profiler_options
    if not isinstance(options, _spyglass.ProfileOptions):
      raise TypeError(f"profiler_options must be a ProfileOptions, not {type(options).__name__}")
    # In a JAX process XLA's device tracer traces the device, not ours (CUPTI takes one).
    options = _jax_session.options_for_this_process(options)
    with _state.lock:
      if self._is_running:
        raise RuntimeError("Profile has already been started. Only one profile may be run at a time.")
      _spyglass.start_trace(self.log_dir or "", bool(self.create_perfetto_link),
                            bool(self.create_perfetto_trace), options,
                            int(self.perfetto_link_timeout_s))
      # Recorded in the /host:metadata plane (the core clears it at every start).
      _spyglass.set_metadata("python_version", platform.python_version())
      self._is_running = True
      self._profile_data = None
      _state.session = self
    return self

  @_spyglass._untraced
  def stop(self) -> Optional[ProfileData]:
    """Stops the session; returns its ProfileData (also ``profile_data``).

    With a ``log_dir``, the files are written first (and the Perfetto link
    served when asked); a failure to write raises after the data is kept.
    """
    with _state.lock:
      if not self._is_running:
        raise RuntimeError("No profile started")
      self._is_running = False
      _state.session = None
    # Outside the lock: the Perfetto link may wait for the browser. A start
    # meanwhile fails in the core ("already started") until the trace stopped.
    try:
      _spyglass.stop_trace()
    finally:
      self._profile_data = _spyglass._last_trace_profile_data()
    return self._profile_data

  def export_profile_data(self, log_dir, create_perfetto_link: bool = False,
                          create_perfetto_trace: bool = False,
                          session_id: Optional[str] = None) -> None:
    """Writes the stopped session's data as a run of ``log_dir`` (see export_profile_data)."""
    export_profile_data(self, log_dir, create_perfetto_link=create_perfetto_link,
                        create_perfetto_trace=create_perfetto_trace, session_id=session_id)

  @property
  def is_running(self) -> bool:
    return self._is_running

  @property
  def profile_data(self) -> Optional[ProfileData]:
    """The ProfileData of the stopped session (None before stop)."""
    return self._profile_data

  def __enter__(self) -> "ProfileSession":
    return self.start()

  @_spyglass._untraced
  def __exit__(self, exc_type, exc_val, exc_tb) -> None:
    if self.is_running:  # stop() may have been called inside the block
      self.stop()


def _forget_session_in_child():
  # A forked child has no session (the C++ core drops the parent's).
  global _state
  _state = _State()


os.register_at_fork(after_in_child=_forget_session_in_child)


def start_trace(log_dir, create_perfetto_link: bool = False,
                create_perfetto_trace: bool = False,
                profiler_options: Optional[ProfileOptions] = None, *,
                perfetto_link_timeout_s: int = 300) -> ProfileSession:
  """Starts a trace that stop_trace() writes under ``log_dir``; returns its ProfileSession.

  ``create_perfetto_link``: stop_trace also writes perfetto_trace.json.gz and
  serves it once on 127.0.0.1:9001 for ui.perfetto.dev, blocking until it was
  fetched, for at most ``perfetto_link_timeout_s`` seconds (a Spyglass extra;
  0 waits without a limit, as JAX). Ctrl-C ends the wait (KeyboardInterrupt);
  the files are written before it starts.
  ``create_perfetto_trace``: write perfetto_trace.json.gz only.
  """
  return ProfileSession(log_dir, create_perfetto_link, create_perfetto_trace, profiler_options,
                        perfetto_link_timeout_s=perfetto_link_timeout_s).start()


# The stop path (stop_trace, ProfileSession.stop/__exit__, trace's exit) is
# not recorded by the Python tracer: its frames would be cut by the stop and
# written as incomplete events.
@_spyglass._untraced
def stop_trace() -> Optional[ProfileData]:
  """Stops the running trace, writes its files (see start_trace) and returns its ProfileData."""
  with _state.lock:
    session = _state.session
  if session is None:
    _spyglass.stop_trace()  # RuntimeError("No profile started") (the core has no session either)
    return _spyglass._last_trace_profile_data()
  return session.stop()


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
  """Context manager yielding a started ProfileSession, stopped on exit (also on errors).

  ``log_dir=None`` keeps the trace in memory only: read it from the yielded
  session's ``profile_data`` after the block. Also usable as a decorator.
  (A class rather than a generator: its exit is not recorded, see stop_trace.)
  """

  def __init__(self, log_dir=None, create_perfetto_link: bool = False, create_perfetto_trace: bool = False,
               profiler_options: Optional[ProfileOptions] = None, *, perfetto_link_timeout_s: int = 300):
    self._session = ProfileSession(log_dir, create_perfetto_link, create_perfetto_trace, profiler_options,
                                   perfetto_link_timeout_s=perfetto_link_timeout_s)

  def __enter__(self) -> "ProfileSession":
    return self._session.__enter__()

  @_spyglass._untraced
  def __exit__(self, exc_type, exc_val, exc_tb):
    self._session.__exit__(exc_type, exc_val, exc_tb)
    return False


def export_profile_data(profile_data: Union[ProfileData, ProfileSession], log_dir,
                        create_perfetto_link: bool = False, create_perfetto_trace: bool = False,
                        session_id: Optional[str] = None) -> None:
  """Writes a ProfileData (or a stopped ProfileSession's) as a run of ``log_dir``.

  As stop_trace writes a trace: ``<log_dir>/plugins/profile/<run>/<host>.xplane.pb``
  and ``<host>.trace.json.gz``, the run named ``session_id`` (for a session
  without one: its ``profiler_options.session_id``), else by the time;
  ``perfetto_trace.json.gz`` too when ``create_perfetto_trace`` or
  ``create_perfetto_link`` (which then serves it, as start_trace).
  """
  timeout_s = 300
  if isinstance(profile_data, ProfileSession):
    if profile_data.is_running:
      raise RuntimeError("Cannot export a ProfileSession while it is running. Call stop() first.")
    if profile_data.profile_data is None:
      raise RuntimeError("No profile data to export. Ensure the session has completed.")
    data = profile_data.profile_data
    if session_id is None and profile_data.profiler_options is not None:
      session_id = profile_data.profiler_options.session_id
    timeout_s = profile_data.perfetto_link_timeout_s
  elif isinstance(profile_data, ProfileData):
    data = profile_data
  else:
    raise TypeError(f"Expected ProfileData or ProfileSession, got {type(profile_data).__name__}")
  _spyglass.export_profile_data(data, os.fspath(log_dir), session_id or "", bool(create_perfetto_trace),
                                bool(create_perfetto_link), int(timeout_s))


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
