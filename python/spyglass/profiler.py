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
  ``<host>.trace.json.gz`` (and, when asked, ``perfetto_trace.json.gz`` as JAX,
  a hard link to the trace JSON, plus ``perfetto_trace.pb``, native Perfetto).
* ``TraceAnnotation(name, **kwargs)`` / ``StepTraceAnnotation(name, **kwargs)``:
  context managers recording an event; keyword arguments become event
  arguments (bool -> 1/0, int, float, str; others ``str()``).
* ``annotate_function(func, name=None, **kwargs)``: decorator, bare or through
  ``functools.partial(annotate_function, name=..., **kwargs)``.
* ``ProfileOptions()``: JAX's attributes and defaults (``python_tracer_level=1``,
  ``host_tracer_level=2``, ``advanced_configuration={}`` ...).

* ``stop_and_get_fdo_profile()`` and ``PGLEProfiler`` (jax._src.profiler's):
  the FDO profile (XLA's ProfiledInstructionsProto) of a trace, through
  jaxlib's converter where jaxlib is present; b'' on CPU, as in jax.

With ``python_tracer_level=1`` (the default, as in JAX) every Python function
call is recorded as an event named ``$<file>:<line> <function>`` on its
thread, next to the annotations.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import os
import platform
import sys
import threading
import time
import warnings
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
    "stop_and_get_fdo_profile",
    "PGLEProfiler",
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
      _ensure_jax_memory_sampler()  # before the start: its thread's own frames stay out of the trace
      with _sample_lock:
        _spyglass.start_trace(self.log_dir or "", bool(self.create_perfetto_link),
                              bool(self.create_perfetto_trace), options,
                              int(self.perfetto_link_timeout_s))
      try:
        # Recorded in the /host:metadata plane (the core clears it at every start).
        _spyglass.set_metadata("python_version", platform.python_version())
      except BaseException:
        _spyglass._stop_trace_in_memory()  # a failed start leaves no session running
        raise
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
      with _sample_lock:  # the core's stop too: no sample is cut by it
        try:
          _sample_jax_memory()  # the track's last point, at the stop
        finally:
          _spyglass.stop_trace()  # whatever happened before
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

  ``create_perfetto_link``: stop_trace also writes the Perfetto files and
  serves perfetto_trace.json.gz once on 127.0.0.1:9001 for ui.perfetto.dev
  (JAX's URL), blocking until it was
  fetched, for at most ``perfetto_link_timeout_s`` seconds (a Spyglass extra;
  0 waits without a limit, as JAX). Ctrl-C ends the wait (KeyboardInterrupt);
  the files are written before it starts.
  ``create_perfetto_trace``: write them only: perfetto_trace.json.gz (as JAX; a
  hard link to <host>.trace.json.gz, the JSON written once) and
  perfetto_trace.pb (native Perfetto protobuf, the one to open for big traces).
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
    if _private_sessions:  # PGLE's session is not the trace's to stop (as in jax)
      raise RuntimeError("No profile started")
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
  ``perfetto_trace.json.gz`` and ``perfetto_trace.pb`` too when ``create_perfetto_trace`` or
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
  """Paths the last stop_trace wrote: run_dir, xplane_path, trace_json_path,
  perfetto_trace_path (.pb), perfetto_trace_json_path (perfetto_trace.json.gz)."""
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
  """A snapshot of the live allocations as gzipped pprof bytes (jax's device_memory_profile).

  Ours: the tracked allocations (``record_allocation``, numpy arrays after
  ``track_numpy()``, GPU allocations, the host heap under the heap hook),
  with their stacks (Python's for those recorded from Python). In a JAX
  program, also everything jax's holds: each live PJRT buffer (kind
  ``buffer``, per device) and executable (kind ``executable``) with the
  Python stack that made it. One profile, labelled ``kind`` and ``device``.
  ``backend``: None, every device (and every JAX backend in use); a JAX
  backend name ("cpu", "gpu", ...) or one of ours ("gpu", "gpu:1").
  """
  if not _HAVE_MEMORY:
    _missing("device_memory_profile", "include/spyglass/memory.h")
  ours = _spyglass.device_memory_profile(backend or "")
  theirs = _jax_heap_profiles(backend)
  if not theirs:
    return ours
  return _spyglass._merge_pprof([ours] + theirs)


def save_device_memory_profile(filename, backend: Optional[str] = None) -> None:
  """Writes device_memory_profile(backend) to ``filename`` (replaced).

  Written as every Spyglass output is: never through a symbolic link, under
  a temporary name renamed into place when complete.
  """
  if not _HAVE_MEMORY:
    _missing("save_device_memory_profile", "include/spyglass/memory.h")
  if "jax" not in sys.modules:
    _spyglass.save_device_memory_profile(os.fspath(filename), backend or "")
    return
  _spyglass._write_output_bytes(os.fspath(filename), device_memory_profile(backend))


# --- JAX's device memory ------------------------------------------------------
# Inside a JAX program PJRT owns the device memory: its clients know each live
# buffer and executable with the Python stack that made it (jaxlib's
# heap_profile, what jax.profiler.device_memory_profile returns). Nothing here
# imports jax: a program that did not is left alone.


def _jax_clients(backend: Optional[str]) -> list:
  """The PJRT clients of the JAX backends in use (of `backend` when named); [] without jax."""
  if "jax" not in sys.modules:
    return []
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  if backend is None:
    initialized = getattr(xla_bridge, "backends_are_initialized", lambda: True)
    if not initialized():
      return []  # no backend yet, so no buffer or executable (and no backend started for us)
    clients = list(xla_bridge.backends().values())
  else:
    try:
      clients = [xla_bridge.get_backend(backend)]
    except (RuntimeError, ValueError):  # not a JAX backend name ("gpu:1"): ours only
      return []
  unique = []
  for c in clients:
    if all(c is not u for u in unique):
      unique.append(c)
  return unique


def _jax_heap_profiles(backend: Optional[str]) -> list:
  """jaxlib's heap profiles (serialized pprof) of the JAX backends in use."""
  return [c.heap_profile() for c in _jax_clients(backend) if hasattr(c, "heap_profile")]


def _add_array_bytes(array, by_device: dict, labels: dict) -> None:
  """Adds each addressable shard's bytes of a jax.Array to its device's count.

  From the sharding's shard shape: reading the shards' data would make new
  arrays. `labels`: device -> label, filled as devices are met.
  """
  sharding = array.sharding
  devices = sharding.addressable_devices
  if len(devices) == 1:
    shard_bytes = array.nbytes
  else:
    try:
      shape = sharding.shard_shape(array.shape)
      n = 1
      for dim in shape:
        n *= int(dim)
      shard_bytes = n * array.dtype.itemsize
    except Exception:  # pylint: disable=broad-except
      shard_bytes = int(array.nbytes) // len(devices)  # uneven shards: an even split
  for d in devices:
    label = labels.get(d)
    if label is None:
      label = labels[d] = f"{d.platform}:{d.id}"
    if label in by_device:
      by_device[label] += shard_bytes


def _jax_device_bytes() -> Optional[list]:
  """[(device label, live bytes)] of JAX's devices now, None outside a JAX program.

  PJRT's own count where it keeps one (memory_stats' bytes_in_use: GPU, TPU),
  else the bytes of the live buffers on the device (CPU), labelled as the
  heap profiles label them ("cpu:0", "cuda:0").
  """
  out = []
  for client in _jax_clients(None):
    by_device = {}
    counted = False
    for d in client.local_devices():
      label = f"{d.platform}:{d.id}"
      stats = None
      try:
        stats = d.memory_stats()
      except Exception:  # pylint: disable=broad-except
        pass
      if stats and "bytes_in_use" in stats:
        by_device[label] = int(stats["bytes_in_use"])
      else:
        by_device.setdefault(label, 0)
        counted = True
    if counted:
      labels = {}
      for array in client.live_arrays():
        try:
          if array.is_deleted():
            continue
          _add_array_bytes(array, by_device, labels)
        except Exception:  # pylint: disable=broad-except
          continue  # deleted meanwhile
    out.extend(by_device.items())
  return out if out else None


# JAX's device bytes on the memory timeline: a Python thread samples them
# (_jax_device_bytes) while a session runs and pushes each value to the
# core's "jax memory <device>" counters (python/src/jax_memory.cc). The thread
# is started with the first session started here in a JAX program; it then
# serves every later session, remote captures included.
# SPYGLASS_JAX_MEMORY_INTERVAL_MS sets the period (default 10; 0: off).

_sampler_lock = threading.Lock()
_sampler_thread: Optional[threading.Thread] = None


def _jax_memory_interval_s() -> float:
  try:
    return max(0.0, float(os.environ.get("SPYGLASS_JAX_MEMORY_INTERVAL_MS", "10"))) / 1000.0
  except ValueError:
    return 0.01


def _sample_jax_memory() -> bool:
  """Pushes JAX's device bytes now; False once no session runs (or sampling is off)."""
  if _jax_memory_interval_s() == 0:
    return False
  try:
    values = _jax_device_bytes() if "jax" in sys.modules else None
  except Exception:  # pylint: disable=broad-except
    values = None  # a backend torn down meanwhile: this point is skipped
  if values:
    return _spyglass._jax_memory_push(values)
  return _spyglass._jax_memory_open()


class _SampleLock:
  """Held by each JAX memory sample and around the core's start and stop of a
  session started here: a session never begins or ends in the middle of a
  sample (the Python tracer would record the rest of it, or cut it as
  incomplete). A C++ mutex (jax_memory.cc), taken without the GIL."""

  # Untraced: the start's own frames after the core's start are not recorded.
  @_spyglass._untraced
  def __enter__(self):
    if _HAVE_JAX_MEMORY:
      _spyglass._jax_memory_lock()

  @_spyglass._untraced
  def __exit__(self, *exc):
    if _HAVE_JAX_MEMORY:
      _spyglass._jax_memory_unlock()


_HAVE_JAX_MEMORY = hasattr(_spyglass, "_jax_memory_run")
_sample_lock = _SampleLock()


@_spyglass._untraced  # called by the sampler thread's C++ loop only, the sample lock held
def _jax_memory_sampling_step() -> Optional[float]:
  """One sample; the pause before the next (seconds), None: none for this session."""
  try:
    interval = _jax_memory_interval_s()
    if interval == 0:
      return None
    began = time.perf_counter()
    if not _sample_jax_memory():
      return None
    # Thousands of live arrays make a sample cost milliseconds: the period
    # stretches so that sampling holds the GIL at most 5% of the time.
    return max(interval, 20 * (time.perf_counter() - began))
  except Exception:  # pylint: disable=broad-except
    return None  # the thread lives on for the next session


def _ensure_jax_memory_sampler() -> None:
  global _sampler_thread
  if "jax" not in sys.modules or not _HAVE_JAX_MEMORY or _jax_memory_interval_s() == 0:
    return
  with _sampler_lock:
    if _sampler_thread is not None:
      return
    # The thread runs the C++ loop (_jax_memory_run): none of its Python
    # frames but the untraced step is ever running inside a session.
    _sampler_thread = threading.Thread(target=_spyglass._jax_memory_run, args=(_jax_memory_sampling_step,),
                                       name="spyglass-jax-memory", daemon=True)
    _sampler_thread.start()
    deadline = time.monotonic() + 5
    while not _spyglass._jax_memory_runner_ready() and time.monotonic() < deadline:
      time.sleep(0.0005)  # until it waits in C++: its start stays out of the session about to start


def _stop_jax_memory_sampler() -> None:
  # At exit, before the interpreter finalizes: the thread must not take the
  # GIL then.
  global _sampler_thread
  thread, _sampler_thread = _sampler_thread, None
  if thread is not None:
    _spyglass._jax_memory_runner_exit()
    thread.join(2.0)


atexit.register(_stop_jax_memory_sampler)


def _forget_sampler_in_child():
  global _sampler_thread, _sampler_lock
  _sampler_thread = None  # threads do not survive a fork
  _sampler_lock = threading.Lock()
  if _HAVE_JAX_MEMORY:
    _spyglass._jax_memory_after_fork_child()


os.register_at_fork(after_in_child=_forget_sampler_in_child)


# --- FDO profiles and PGLE (jax._src.profiler's) -----------------------------
# XLA's profile-guided latency estimation reads a ProfiledInstructionsProto:
# the mean time of each HLO instruction on the devices, built by XLA's
# converter (jaxlib) from the device planes of a trace. The session stops
# first and writes nothing; only then is its XSpace converted, so that a
# failing conversion never leaves a session running.


def _jaxlib_profiler():
  """jaxlib's profiler module (XLA's converters), or None where jaxlib is absent."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  if "jaxlib._profiler" in sys.modules:
    return sys.modules["jaxlib._profiler"]
  try:
    if importlib.util.find_spec("jaxlib") is None:
      return None
    import jaxlib._profiler as jaxlib_profiler  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  return jaxlib_profiler


def _has_device_planes(data: ProfileData) -> bool:
  return any(p.name.startswith("/device:") for p in data.planes)


def _fdo_profile_of(data: Optional[ProfileData], as_textproto: bool = False) -> bytes:
  """The ProfiledInstructionsProto of a stopped trace (serialized; text with as_textproto).

  XLA's converter reads device planes only: a trace without them (CPU) gives
  what it gives there, b''. Where jaxlib is absent no trace holds XLA's
  instructions, so the profile is empty too.
  """
  if data is None:
    return b""
  if "jax" not in sys.modules and not _has_device_planes(data):
    return b""  # what the converter returns, without loading jaxlib into a program that does not use it
  converter = _jaxlib_profiler()
  if converter is None:
    return b""
  xspace = _spyglass._serialize_xspace(data)
  if as_textproto:
    return converter.get_fdo_profile(xspace, True)
  return converter.get_fdo_profile(xspace)


@_spyglass._untraced
def _stop_in_memory(session: "ProfileSession") -> Optional[ProfileData]:
  """Stops `session` without writing its run; its ProfileData (also session.profile_data)."""
  with _state.lock:
    if not session._is_running:  # pylint: disable=protected-access
      raise RuntimeError("No profile started")
    session._is_running = False  # pylint: disable=protected-access
    if _state.session is session:
      _state.session = None
  try:
    with _sample_lock:  # no JAX memory sample is cut by the stop
      _spyglass._stop_trace_in_memory()
  finally:
    session._profile_data = _spyglass._last_trace_profile_data()  # pylint: disable=protected-access
  return session._profile_data  # pylint: disable=protected-access


@_spyglass._untraced
def stop_and_get_fdo_profile() -> Union[bytes, str]:
  """Stops the running trace and returns its FDO profile (jax's stop_and_get_fdo_profile).

  The serialized ProfiledInstructionsProto that XLA's converter builds from
  the trace's device events (GPU; b'' on CPU, as jax returns there). Nothing
  is written under the trace's log_dir. Raises RuntimeError("No profile
  started") without a trace. The trace is stopped before the conversion:
  an error there never leaves it running.
  """
  with _state.lock:
    session = _state.session
  if session is None:
    raise RuntimeError("No profile started")
  return _fdo_profile_of(_stop_in_memory(session))


class PGLEProfiler:
  """Runs a program under the profiler a given number of times, then hands
  XLA the aggregated FDO profile (jax._src.profiler.PGLEProfiler).

  ``PGLEProfiler.trace(runner)`` profiles its block while the runner is
  enabled (``retries > 0``), not running and not consumed: a session of its
  own (``enable_hlo_proto`` and ``raise_error_on_start_failure`` on; not the
  one stop_trace stops), whose FDO profile is appended to ``fdo_profiles``.
  ``consume_fdo_profile()`` returns None until ``called_times == retries``,
  then XLA's aggregate of the profiles at ``percentile`` (cached).
  """

  def __init__(self, retries: int, percentile: int):
    self.retries: int = retries
    self.percentile: int = percentile
    self.collected_fdo: Optional[bytes] = None
    self.called_times: int = 0
    self.fdo_profiles: list = []
    self.current_session: Optional[ProfileSession] = None

  def consume_fdo_profile(self) -> Optional[bytes]:
    if self.collected_fdo is not None:
      return self.collected_fdo
    if not self.is_enabled() or self.called_times != self.retries:
      return None
    self.collected_fdo = _aggregate_fdo_profiles(self.fdo_profiles, self.percentile)
    return self.collected_fdo

  def is_fdo_consumed(self) -> bool:
    return self.collected_fdo is not None

  def disable(self) -> None:
    self.retries = 0

  def is_enabled(self) -> bool:
    return self.retries > 0

  def is_running(self) -> bool:
    return self.current_session is not None

  @classmethod
  @contextlib.contextmanager
  def trace(cls, runner: Optional["PGLEProfiler"]):
    if (runner is None or runner.is_running() or not runner.is_enabled()
        or runner.is_fdo_consumed()):
      yield
      return
    options = ProfileOptions()
    options.enable_hlo_proto = True
    options.raise_error_on_start_failure = True
    if not _jax_uses_gpus():
      # As in XLA's session there: no device tracer where jax runs no GPU
      # (ours would fail the start for want of a driver).
      options.device_tracer_level = 0
    runner.current_session = _start_private_session(options)
    try:
      yield
    finally:
      session, runner.current_session = runner.current_session, None
      try:
        data = _stop_in_memory(session)
      finally:
        _private_sessions.discard(session)
      runner.fdo_profiles.append(_fdo_profile_of(data))
      runner.called_times += 1
      if runner.fdo_profiles[-1] == b"":
        warnings.warn(
            "PGLE collected an empty trace, may be due to contention with "
            "another tool that subscribes to CUPTI, such as Nsight Systems - check "
            "for CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED from XLA. "
            "Consider populating a persistent compilation cache with PGLE enabled, "
            "and then profiling a second run that has the "
            "JAX_COMPILATION_CACHE_EXPECT_PGLE option enabled.",
            RuntimeWarning)


def _jax_uses_gpus() -> bool:
  jax = sys.modules.get("jax")
  if jax is None:
    return False
  try:
    return any(d.platform == "gpu" for d in jax.devices())
  except Exception:  # pylint: disable=broad-except
    return False


# PGLE's sessions: running in the core, but not the trace stop_trace stops.
_private_sessions: set = set()


def _start_private_session(options: ProfileOptions) -> ProfileSession:
  session = ProfileSession(None, profiler_options=options)
  with _state.lock:
    if _state.session is not None:
      raise RuntimeError("Profile has already been started. Only one profile may be run at a time.")
    _ensure_jax_memory_sampler()
    with _sample_lock:
      _spyglass.start_trace("", False, False, options, 0)
    session._is_running = True  # pylint: disable=protected-access
    _private_sessions.add(session)
  return session


def _aggregate_fdo_profiles(profiles: list, percentile: int) -> bytes:
  """XLA's aggregate of FDO profiles (each instruction's cost at `percentile`)."""
  if all(p == b"" for p in profiles):
    return b""  # what XLA's aggregate of empty profiles is
  converter = _jaxlib_profiler()
  if converter is None:  # only XLA's converter makes non-empty ones
    raise RuntimeError("aggregating FDO profiles needs jaxlib (XLA's aggregate_profiled_instructions)")
  return converter.aggregate_profiled_instructions(profiles, percentile)
