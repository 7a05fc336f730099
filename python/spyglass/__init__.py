"""Spyglass: a profiler with jax.profiler's API, without JAX.

    import spyglass.profiler as profiler      # where you had: import jax.profiler as profiler
    with profiler.trace("/tmp/logs"):
        with profiler.TraceAnnotation("work", batch=64):
            ...

See spyglass.profiler for the API, and `python -m spyglass.collect_profile`.
"""
import os as _os

from . import _spyglass
from ._spyglass import InvalidArgumentError

__version__ = _spyglass.__version__

# A forked child does not inherit the parent's session (the C++ core drops it);
# the Python tracer's hooks must go too.
if hasattr(_os, "register_at_fork"):
    _os.register_at_fork(after_in_child=_spyglass._after_fork_child)

# SPYGLASS_TRACK_NUMPY=1: record numpy arrays from the start (spyglass.memory.track_numpy).
if _os.environ.get("SPYGLASS_TRACK_NUMPY", "") not in ("", "0"):
  _spyglass.track_numpy(True)

# In a JAX process every Spyglass session also drives XLA's (spyglass/jax.py);
# SPYGLASS_JAX_PLUGIN=1 puts Spyglass's planes in XLA's sessions.
from . import _jax_session
_jax_session._install(lambda: __import__("spyglass.jax"))

# SPYGLASS_TRACE_DIR, SPYGLASS_SERVER_PORT, SPYGLASS_FLIGHT_RECORDER,
# SPYGLASS_OPTIONS: profiling started from outside (spyglass/_autostart.py).
from . import _autostart
_autostart.start_from_environment()

__all__ = ["InvalidArgumentError", "analysis", "memory", "profiler", "__version__"]
