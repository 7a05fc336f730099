"""Memory profiles with Python stacks: numpy arrays (track_numpy) and buffers
registered from Python, read back by our own small pprof decoder and by
`go tool pprof` (-top, -traces, -diff_base)."""
import gzip
import os
import shutil
import subprocess
import sys
import threading

import pytest

np = pytest.importorskip("numpy")

import spyglass.memory as memory
import spyglass.profiler as profiler
from spyglass import _spyglass

from pprof_decode import parse_profile

THIS = os.path.abspath(__file__)
GO = shutil.which("go")


def line_of(marker):
  """Line number of the line of this file that ends with `# <marker>`."""
  with open(THIS) as f:
    for i, line in enumerate(f, 1):
      if line.rstrip().endswith("# " + marker):
        return i
  raise AssertionError(marker)


def snapshot(backend=None):
  return parse_profile(profiler.device_memory_profile(backend))


def own_frames(sample):
  """The sample's frames in this file (numpy's own Python functions, e.g. np.ones, come first)."""
  return [f for f in sample["frames"] if f[1] == THIS]


def held_by(samples, function):
  """(count, bytes) of samples whose innermost frame of this file is `function`."""
  c = b = 0
  for s in samples:
    own = own_frames(s)
    if own and own[0][0] == function:
      c += s["count"]
      b += s["bytes"]
  return c, b


def sample_of(samples, function):
  return next(s for s in samples if own_frames(s) and own_frames(s)[0][0] == function)


def pprof(*args):
  # scripts/setup.sh installs go (golang-go); a missing one is a broken setup, not a skip.
  assert GO is not None, "go (go tool pprof) not installed (run scripts/setup.sh)"
  p = subprocess.run([GO, "tool", "pprof", *args], capture_output=True, text=True, timeout=300,
                     env={**os.environ, "PPROF_TMPDIR": os.environ.get("TMPDIR", "/tmp")})
  assert p.returncode == 0, p.stderr
  return p.stdout


@pytest.fixture
def tracking():
  assert not memory.numpy_tracking()
  memory.track_numpy()
  try:
    yield
  finally:
    memory.track_numpy(False)


# ---- the functions whose allocations the tests look for ----------------------

def allocate_weights(n):
  out = []
  for _ in range(n):
    out.append(np.ones(250_000))  # ALLOC-WEIGHTS
  return out


def allocate_zeros(n):
  out = []
  for _ in range(n):
    out.append(np.zeros((100, 100), dtype=np.float32))  # ALLOC-ZEROS
  return out


def grow_cache(cache, n):
  for _ in range(n):
    cache.append(np.empty(64 * 1024, dtype=np.uint8))  # ALLOC-GROW


def register_buffer(buf):
  return memory.record_allocation(buf, device="gpu:1", kind="buffer")  # REGISTER


def thread_worker(ready, go, keep, n):
  mine = []
  for _ in range(n):
    mine.append(np.full(1000, 7, dtype=np.int64))  # ALLOC-THREAD
  keep.append(mine)
  ready.wait()
  go.wait()


# ---- tests -----------------------------------------------------------------------

def test_numpy_arrays_have_python_stacks(tracking):
  unknown_before = memory.tracking_stats()["unknown_frees"]
  weights = allocate_weights(4)
  zeros = allocate_zeros(3)
  samples = snapshot()
  assert held_by(samples, "allocate_weights") == (4, 4 * 250_000 * 8)
  assert held_by(samples, "allocate_zeros") == (3, 3 * 100 * 100 * 4)  # calloc
  s = sample_of(samples, "allocate_weights")
  assert s["frames"][0][0] == "ones"  # np.ones is Python code (numpy/_core/numeric.py)
  assert s["frames"][1] == ("allocate_weights", THIS, line_of("ALLOC-WEIGHTS"))
  assert s["frames"][2][0] == "test_numpy_arrays_have_python_stacks"  # the caller, then pytest's frames
  z = sample_of(samples, "allocate_zeros")
  assert z["frames"][0] == ("allocate_zeros", THIS, line_of("ALLOC-ZEROS"))  # np.zeros is C
  assert all(f[0] and f[1] for f in s["frames"])  # Python frames only, all named
  assert len(s["frames"]) <= 64
  assert s["labels"] == {"kind": "buffer", "device": "cpu:0"}
  del weights, zeros
  samples = snapshot()
  assert held_by(samples, "allocate_weights") == (0, 0)
  assert held_by(samples, "allocate_zeros") == (0, 0)
  # Arrays made before tracking started are freed through the wrapper too: quietly.
  assert memory.tracking_stats()["unknown_frees"] == unknown_before


def test_go_pprof_top_and_traces_show_python_frames(tracking, tmp_path):
  weights = allocate_weights(3)
  path = tmp_path / "memory.prof"
  profiler.save_device_memory_profile(str(path))
  top = pprof("-top", str(path))
  assert "allocate_weights" in top, top
  lines = pprof("-top", "-lines", str(path))
  where = f"allocate_weights {THIS}:{line_of('ALLOC-WEIGHTS')}"
  assert where in lines, lines
  traces = pprof("-traces", str(path))
  assert "allocate_weights" in traces and "test_go_pprof_top_and_traces_show_python_frames" in traces, traces
  traces = pprof("-traces", "-lines", str(path))
  assert f"test_numpy_memory.py:{line_of('ALLOC-WEIGHTS')}" in traces, traces
  del weights
  path2 = tmp_path / "after.prof"
  profiler.save_device_memory_profile(str(path2))
  assert "allocate_weights" not in pprof("-top", str(path2))


def test_diff_base_points_at_the_function_that_grew(tracking, tmp_path):
  cache = []
  stable = allocate_zeros(2)
  grow_cache(cache, 2)
  early = tmp_path / "early.prof"
  profiler.save_device_memory_profile(str(early))
  grow_cache(cache, 10)
  late = tmp_path / "late.prof"
  profiler.save_device_memory_profile(str(late))
  out = pprof("-top", f"-diff_base={early}", str(late))
  rows = [l for l in out.splitlines() if l.strip() and l.split()[-1] in ("grow_cache", "allocate_zeros")]
  assert rows and rows[0].split()[-1] == "grow_cache", out
  assert rows[0].split()[0] in ("640kB", "640KB", "655.36kB"), out  # 10 x 64 KiB
  assert not any(r.split()[-1] == "allocate_zeros" for r in rows), out  # unchanged: not in the diff
  # Our own report agrees.
  spyglass_cli = shutil.which("spyglass")
  if spyglass_cli:
    p = subprocess.run([spyglass_cli, "memdiff", str(early), str(late)], capture_output=True, text=True)
    assert "grow_cache" in p.stdout
  del cache, stable


def test_user_buffer_has_its_python_stack():
  buf = bytearray(123_457)
  ptr = register_buffer(buf)
  try:
    samples = snapshot("gpu")
    assert held_by(samples, "register_buffer") == (1, 123_457)
    s = sample_of(samples, "register_buffer")
    assert s["frames"][0] == ("register_buffer", THIS, line_of("REGISTER"))
    assert s["labels"] == {"kind": "buffer", "device": "gpu:1"}
    assert held_by(snapshot("cpu"), "register_buffer") == (0, 0)
  finally:
    memory.record_free(ptr)
  assert held_by(snapshot(), "register_buffer") == (0, 0)
  # An int address needs nbytes; the profiler module has the same functions.
  assert profiler.record_allocation is memory.record_allocation
  addr = profiler.record_allocation(0x7F0000001000, 4096, device="cpu:0", kind="cache")
  assert [s for s in snapshot() if s["labels"].get("kind") == "cache" and s["bytes"] == 4096]
  profiler.record_free(addr)
  with pytest.raises(TypeError, match="nbytes is required"):
    memory.record_allocation(0x7F0000002000)
  with pytest.raises(TypeError, match="buffer protocol"):
    memory.record_allocation(object(), 10)
  with pytest.raises(ValueError):
    memory.record_allocation(0, 10)
  with pytest.raises(ValueError):
    memory.record_allocation(buf, -1)


def test_many_threads_allocating_numpy_arrays(tracking):
  threads_n, per_thread = 8, 200
  ready, go = threading.Barrier(threads_n + 1), threading.Barrier(threads_n + 1)
  keep = []
  threads = [threading.Thread(target=thread_worker, args=(ready, go, keep, per_thread)) for _ in range(threads_n)]
  for t in threads:
    t.start()
  ready.wait()  # every thread holds its arrays
  samples = snapshot()
  go.wait()
  for t in threads:
    t.join()
  count, nbytes = held_by(samples, "thread_worker")
  assert (count, nbytes) == (threads_n * per_thread, threads_n * per_thread * 8000)
  s = sample_of(samples, "thread_worker")
  names = [f[0] for f in s["frames"]]
  i = names.index("thread_worker")
  assert s["frames"][i][2] == line_of("ALLOC-THREAD")
  assert names[i + 1:i + 3] == ["run", "_bootstrap_inner"]  # threading's frames, up to the thread's start
  keep.clear()
  assert held_by(snapshot(), "thread_worker") == (0, 0)


def test_undo_removes_the_handler():
  assert _spyglass._numpy_hook_state() == "removed"
  assert memory.track_numpy() is False
  assert _spyglass._numpy_hook_state() == "tracking" and memory.numpy_tracking()
  kept = allocate_weights(1)
  assert memory.track_numpy(False) is True
  # An array recorded while tracking is alive: the wrappers stay (pass-through)
  # so that its free still clears its record.
  assert _spyglass._numpy_hook_state() == "draining"
  after = allocate_zeros(2)
  samples = snapshot()
  assert held_by(samples, "allocate_weights") == (1, 250_000 * 8)
  assert held_by(samples, "allocate_zeros") == (0, 0)  # not recorded any more
  del kept
  assert held_by(snapshot(), "allocate_weights") == (0, 0)
  memory.track_numpy(False)
  assert _spyglass._numpy_hook_state() == "removed"
  del after
  # Nothing alive: undo restores numpy's handler at once.
  memory.track_numpy()
  tmp = allocate_zeros(1)
  del tmp
  memory.track_numpy(False)
  assert _spyglass._numpy_hook_state() == "removed"
  assert held_by(snapshot(), "allocate_zeros") == (0, 0)
  assert np.ones(10).sum() == 10  # numpy still works


def test_environment_variable_tracks_numpy_at_import():
  code = ("import spyglass, numpy as np\n"
          "assert spyglass._spyglass.numpy_tracking()\n"
          "def make(): return np.ones(1000)\n"
          "a = make()\n"
          "import spyglass.profiler as p, gzip\n"
          "assert b'make' in gzip.decompress(p.device_memory_profile())\n")
  env = {**os.environ, "SPYGLASS_TRACK_NUMPY": "1"}
  p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
  assert p.returncode == 0, p.stderr


def test_save_device_memory_profile_never_writes_through_a_link(tracking, tmp_path):
  """The Python call writes through the project's one output path: a link
  planted at the name is refused and its target stays as it was."""
  outside = tmp_path / "outside.txt"
  outside.write_text("keep me")
  link = tmp_path / "memory.prof"
  link.symlink_to(outside)
  with pytest.raises(profiler.InvalidArgumentError, match="symbolic link"):
    profiler.save_device_memory_profile(link)
  assert outside.read_text() == "keep me"
  good = tmp_path / "good.prof"
  profiler.save_device_memory_profile(good)  # os.PathLike accepted
  assert gzip.decompress(good.read_bytes())
