"""Python frames in `spyglass run`'s memory profiles.

`spyglass run` (and `python -m spyglass run`) put this directory on PYTHONPATH
next to the preloaded heap hook (libspyglass_heap.so). At start-up it turns on
the hook's Python part (src/memory/heap_python.cc): CPython's allocators are
wrapped and every allocation gets the Python frames of its thread
(SPYGLASS_PYTHON_MODE=light: malloc's blocks and pymalloc's arenas only, with
Python frames alone). Then it
takes itself off sys.path and runs the sitecustomize it hides, if there is one.
Pure Python: the same file serves every CPython version.
"""
import os as _os
import sys as _sys


def _spyglass_full_library():
  """SPYGLASS_TRACE_DIR & co. in a Python without the spyglass package: the
  hook's libspyglass starts them (the package, when installed, has started them
  already from its .pth, before this module: one core in a process)."""
  if "spyglass._autostart" in _sys.modules:
    return
  if not any(_os.environ.get(n) for n in ("SPYGLASS_TRACE_DIR", "SPYGLASS_SERVER_PORT", "SPYGLASS_FLIGHT_RECORDER")):
    return
  try:
    import ctypes
    load = ctypes.CDLL(None).spyglass_heap_load_full_library
  except (ImportError, OSError, AttributeError):
    return  # the hook is not loaded
  load()


def _spyglass_start():
  here = _os.path.dirname(_os.path.abspath(__file__))
  _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
  _spyglass_full_library()
  if _os.environ.get("SPYGLASS_HEAP", "1") != "0" and _os.environ.get("SPYGLASS_PYTHON_FRAMES", "1") != "0":
    try:
      import ctypes
      lib = ctypes.PyDLL(None)  # the process's global scope, where the preloaded hook is
      start, end = lib.spyglass_heap_python_start, lib.spyglass_heap_python_exit
    except (ImportError, OSError, AttributeError):
      start = None  # the hook is not loaded: nothing to do
    if start is not None:
      # full (the default): every object of Python's allocators, Python frames
      # spliced into native stacks; light: malloc-level blocks and pymalloc's
      # arenas with Python frames only (memray's default mode), cheaper.
      rc = start(2 if _os.environ.get("SPYGLASS_PYTHON_MODE") == "light" else 1)
      if rc == 0:
        import atexit
        atexit.register(end)  # registered first, so it runs last: the main program has ended
      else:
        _sys.stderr.write(f"spyglass: this Python lacks what Python frames need (code {rc}); native stacks only\n")
  me = _sys.modules.pop("sitecustomize")
  try:
    import sitecustomize  # noqa: F401  (the one this file hides)
  except ImportError as e:
    if e.name != "sitecustomize":
      raise
    _sys.modules["sitecustomize"] = me


_spyglass_start()
del _spyglass_start
