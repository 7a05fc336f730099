"""Memory tracking with Python stacks, for device_memory_profile().

    import spyglass.memory as memory
    memory.track_numpy()                      # numpy array data, every thread
    ptr = memory.record_allocation(buf)       # any buffer (or an int address + nbytes)
    ...
    memory.record_free(ptr)
    spyglass.profiler.save_device_memory_profile("/tmp/memory.prof")   # go tool pprof -top /tmp/memory.prof

Each allocation is recorded with the Python stack that made it (function,
file, line; innermost first, at most 64 frames), as JAX's heap profiles
record its arrays; device ``"cpu:0"`` and kind ``"buffer"`` unless given.
``SPYGLASS_TRACK_NUMPY=1`` in the environment calls ``track_numpy()`` when
spyglass is imported.
"""
from __future__ import annotations

from . import _spyglass

__all__ = ["record_allocation", "record_free", "track_numpy", "numpy_tracking", "tracking_stats"]

# C functions: the recorded stack starts at their caller.
record_allocation = _spyglass.record_allocation
record_free = _spyglass.record_free
tracking_stats = _spyglass.tracking_stats


def track_numpy(enable: bool = True) -> bool:
  """Records numpy array data (every thread) with the allocating Python stack.

  Wraps numpy's default data-memory handler (NumPy >= 1.22); ``track_numpy(False)``
  undoes it: recording stops at once, and numpy's handler is restored as soon
  as no recorded array is alive (until then frees still clear their records).
  Returns the previous setting. Raises RuntimeError (or ImportError without
  numpy) if numpy cannot be tracked.
  """
  return _spyglass.track_numpy(bool(enable))


def numpy_tracking() -> bool:
  """Whether numpy arrays are being recorded."""
  return _spyglass.numpy_tracking()
