"""The bridge between Spyglass's sessions and XLA's (imported by ``import
spyglass``): the callbacks through which the C++ core drives XLA's
ProfilerSession inside a Spyglass session, and the hook that runs code when
the program imports jax. The user-facing module is spyglass.jax.
"""
import importlib.abc
import importlib.util
import os
import sys
import threading
import time

from . import _spyglass

_lock = threading.Lock()

# --- When jax gets imported ---------------------------------------------------

_on_jax_import = []  # callbacks run once, right after `jax` is imported


class _JaxImportWatcher(importlib.abc.MetaPathFinder):
  """Runs the callbacks after the module ``jax`` has executed, then leaves."""

  @_spyglass._untraced  # runs at every import: not in the program's trace
  def find_spec(self, fullname, path=None, target=None):
    if fullname != "jax":
      return None
    _remove_watcher()
    try:
      spec = importlib.util.find_spec(fullname)
    except Exception:  # pylint: disable=broad-except
      return None  # the program's import goes on as without us, and fails as it would
    if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
      return spec
    loader = spec.loader
    exec_module = loader.exec_module

    def exec_then_notify(module):
      exec_module(module)
      _run_on_jax_import()

    loader.exec_module = exec_then_notify
    return spec


_watcher = _JaxImportWatcher()


def _remove_watcher():
  try:
    sys.meta_path.remove(_watcher)
  except ValueError:
    pass


def _run_on_jax_import():
  with _lock:
    callbacks = list(_on_jax_import)
    _on_jax_import.clear()
  for cb in callbacks:
    try:
      cb()
    except Exception as e:  # pylint: disable=broad-except
      _say(f"jax: {e}")


def _when_jax_imported(callback) -> None:
  """Runs ``callback`` now if jax is imported, else right after its import."""
  if "jax" in sys.modules:
    callback()
    return
  with _lock:
    _on_jax_import.append(callback)
  if _watcher not in sys.meta_path:
    sys.meta_path.insert(0, _watcher)


def _forget_jax_import(callback) -> None:
  """Drops a callback _when_jax_imported kept; the watcher goes with the last."""
  with _lock:
    try:
      _on_jax_import.remove(callback)
    except ValueError:
      return
    empty = not _on_jax_import
  if empty:
    _remove_watcher()


def _say(line):
  try:
    os.write(2, f"spyglass: {line}\n".encode("utf-8", "replace"))
  except OSError:
    pass


# --- XLA's session inside a Spyglass session ------------------------------------
# The C++ core calls these (python/src/xla_plugin.cc, the "xla_session" tracer)
# at the start and stop of every Spyglass session, under the GIL.


class _XlaSession:
  """XLA's ProfilerSession for one Spyglass session; started when jax is
  imported (now, or later during the session)."""

  def __init__(self, options: dict):
    self.options = options
    self.session = None
    self.stopped = False
    self.created_wall_ns = 0  # about XLA's zero: its start time, taken as it is created
    self.yielded = None  # the XSpace of a session that made way for the program's
    self.lock = threading.Lock()

  @_spyglass._untraced
  def start(self):
    from jax._src.lib import _profiler  # pylint: disable=g-import-not-at-top
    with self.lock:
      if self.stopped or self.session is not None or self.yielded is not None:
        return
      session_class = _make_way_for_the_program(_profiler)
      o = _profiler.ProfileOptions()
      o.host_tracer_level = int(self.options["host_tracer_level"])
      o.python_tracer_level = 0  # Spyglass's Python tracer records the calls
      # One CUPTI subscriber: XLA's device tracer, unless ours began first
      # (jax imported during a session that started without it, on a GPU).
      # A jaxlib that cannot turn XLA's off (0.10 has no device_tracer_level)
      # gets no session then: XLA's tracer would enable CUPTI's activity API
      # even where its subscription failed, taking our activity buffers.
      if _spyglass._gpu_tracer_active():
        if not hasattr(o, "device_tracer_level"):
          sys.stderr.write("spyglass: XLA's events are not in this trace: Spyglass's GPU tracer began before jax "
                           "was imported and this jaxlib cannot start XLA's session without its own\n")
          self.stopped = True
          return
        o.device_tracer_level = 0
      o.enable_hlo_proto = bool(self.options["enable_hlo_proto"])
      o.include_dataset_ops = bool(self.options["include_dataset_ops"])
      _set_jax_metadata(_profiler)
      self.created_wall_ns = time.time_ns()
      self.session = session_class(o)
      _running.add(self)

  @_spyglass._untraced
  def make_way(self):
    """The program starts an XLA session of its own: ours stops now (XLA runs
    one at a time), what it recorded so far kept for the merge."""
    with self.lock:
      session, self.session = self.session, None
      _running.discard(self)
      if session is not None:
        self.yielded = session.stop()

  @_spyglass._untraced
  def stop(self):
    _forget_jax_import(self.start)
    with self.lock:
      self.stopped = True
      session, self.session = self.session, None
      _running.discard(self)
    if session is None:
      return self.yielded
    return session.stop()


# XLA's sessions that ours started and that run now.
_running = set()
_original_session_class = None


def _make_way_for_the_program(_profiler):
  """Returns XLA's ProfilerSession class, and from the first call on puts a
  stand-in for it on jaxlib's module: a session the program starts itself
  (jax.profiler.start_trace, trace, ProfileSession) first stops the one ours
  drives, instead of failing with "Another profiling session active"."""
  global _original_session_class
  if _original_session_class is not None:
    return _original_session_class
  original = _profiler.ProfilerSession
  _original_session_class = original

  class _Meta(type):
    def __instancecheck__(cls, obj):
      return isinstance(obj, original)

  class ProfilerSession(metaclass=_Meta):  # pylint: disable=redefined-outer-name
    __doc__ = original.__doc__

    def __new__(cls, *args, **kwargs):
      for xs in list(_running):
        xs.make_way()
      return original(*args, **kwargs)

  _profiler.ProfilerSession = ProfilerSession
  return original


@_spyglass._untraced
def _xla_session_start(options: dict):
  if os.environ.get("SPYGLASS_JAX_SESSION", "1") == "0":
    return None
  xs = _XlaSession(options)
  if "jax" in sys.modules:
    _init_backends()
    xs.start()
  else:
    _when_jax_imported(xs.start)
  return xs


@_spyglass._untraced
def _xla_session_stop(xs):
  return xs.stop()


def _set_jax_metadata(_profiler):
  # What jax.profiler.start_trace puts on XLA's /host:metadata plane.
  try:
    import jax  # pylint: disable=g-import-not-at-top
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    from jax._src.lib import version as jaxlib_version  # pylint: disable=g-import-not-at-top
    _profiler.set_metadata("jax_version", jax.__version__)
    _profiler.set_metadata("jaxlib_version", ".".join(map(str, jaxlib_version)))
    for name in xla_bridge.backends():
      backend = xla_bridge.get_backend(name)
      _profiler.set_metadata(f"{backend.platform}_version", backend.platform_version)
  except Exception:  # pylint: disable=broad-except
    pass


def _init_backends():
  # As jax.profiler.start_trace: backends first, or a device's tracer would
  # find no device to trace.
  try:
    from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
    xla_bridge.get_backend()
  except Exception:  # pylint: disable=broad-except
    pass


def options_for_this_process(options):
  """The options Spyglass's own session gets: in a JAX process, XLA's device
  tracer traces the device (CUPTI takes one subscriber, and XLA's knows the
  HLO op of each kernel), so ours is off there."""
  if ("jax" not in sys.modules or options.device_tracer_level == 0
      or os.environ.get("SPYGLASS_JAX_SESSION", "1") == "0"):
    return options
  ours = _spyglass._profile_options_copy(options)
  ours.device_tracer_level = 0
  return ours


def xla_session_active() -> bool:
  """Whether this process can drive XLA's profiler (jax imported)."""
  return "jax" in sys.modules


def _install(enable_plugin):
  """At ``import spyglass``: the core's XLA-session tracer gets its callbacks;
  SPYGLASS_JAX_PLUGIN=1 registers the plugin when jax is imported."""
  _spyglass._set_xla_session_driver(_xla_session_start, _xla_session_stop)
  if os.environ.get("SPYGLASS_JAX_PLUGIN", "") not in ("", "0"):
    _when_jax_imported(enable_plugin)
