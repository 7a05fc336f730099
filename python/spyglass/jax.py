"""Spyglass and XLA's profiler in one trace, in both directions (docs/jax-plugin.md).

    import spyglass.jax        # one line

After it, every XLA profiler session of the process (``jax.profiler.start_trace``
and ``trace``, ``jax.collect_profile`` and XProf's capture of a
``jax.profiler.start_server``) also runs Spyglass's tracers, and XLA's trace
holds our planes: C++ and Python ``TraceAnnotation``s and the memory counters,
on XLA's ``/host:CPU`` threads. Programs left untouched get the same with
``SPYGLASS_JAX_PLUGIN=1`` in their environment (the plugin is then registered
when the program imports jax).

The other way needs no line: in a process where jax is imported,
``spyglass.profiler.start_trace`` (and ``spyglass collect``, ``python -m
spyglass run --trace``) also drives XLA's ``ProfilerSession``, and its planes
(XLA's host events, device planes) are merged into Spyglass's trace. The
plugin is then passive: one session of each kind, nothing recorded twice.

The plugin is XLA's public profiler plugin C API (``PLUGIN_Profiler_Api``),
handed to jaxlib's ``register_plugin_profiler``; see python/src/xla_plugin.cc.
"""
import threading

from . import _spyglass
from ._jax_session import _when_jax_imported, xla_session_active  # pylint: disable=unused-import

__all__ = ["enable", "disable", "enabled", "plugin_stats"]

_lock = threading.Lock()
_registered = False


def enable() -> None:
  """Registers Spyglass's profiler plugin with XLA (once) and turns it on."""
  global _registered
  from jax._src.lib import _profiler  # pylint: disable=g-import-not-at-top
  with _lock:
    if not _registered:
      # XLA keeps the factory for the process; disable() makes it record nothing.
      _profiler.register_plugin_profiler(_spyglass._xla_plugin_capsule())
      _registered = True
    _spyglass._xla_plugin_set_enabled(True)


def disable() -> None:
  """XLA's sessions from now on run without Spyglass's tracers."""
  _spyglass._xla_plugin_set_enabled(False)


def enabled() -> bool:
  return _spyglass._xla_plugin_enabled()


def plugin_stats() -> dict:
  """owned_sessions (XLA sessions that ran ours), passive_sessions, bytes_supplied."""
  return _spyglass._xla_plugin_stats()


def _enable_when_jax_imported():
  _when_jax_imported(enable)


# `import spyglass.jax` is the one line that turns the plugin on.
_enable_when_jax_imported()
