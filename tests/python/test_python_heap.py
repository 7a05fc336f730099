"""Unmodified Python programs under the heap hook (`python -m spyglass run`,
and the same environment for each Python of this machine): the exit profile
names the Python functions and lines of known allocation sites, interleaved
with the native frames of a native extension's malloc; `go tool pprof` reads
it; memray's report of the same script agrees."""
import glob
import json
import os
import shutil
import subprocess
import sys

import pytest

from pprof_decode import parse_profile
from spyglass.__main__ import memory_env

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "heap_sites.py")
GO = shutil.which("go")
try:
  import numpy  # noqa: F401
  HAVE_NUMPY = True
except ImportError:
  HAVE_NUMPY = False


def line_of(marker):
  with open(SCRIPT) as f:
    for i, line in enumerate(f, 1):
      if line.rstrip().endswith("# SITE " + marker):
        return i
  raise AssertionError(marker)


def pythons():
  """(version, path) of the CPythons under ~/.pyenv that this hook supports: 3.10 to 3.13."""
  out = []
  for v in ("3.10", "3.11", "3.12", "3.13"):
    found = sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{v}.*/bin/python3")))
    out.append(pytest.param(found[-1] if found else None, id=v))
  return out


def exit_profile(out_dir):
  files = glob.glob(os.path.join(out_dir, "memory.*.exit.prof"))
  assert len(files) == 1, files
  with open(files[0], "rb") as f:
    return files[0], parse_profile(f.read())


def own(sample):
  return [f for f in sample["frames"] if f[1] == SCRIPT]


def at_line(samples, function, marker):
  """The samples whose innermost frame of the script is (function, the marker's line)."""
  want = (function, SCRIPT, line_of(marker))
  return [s for s in samples if own(s) and own(s)[0] == want]


def check_sites(samples, numpy_expected):
  # The bytearrays: 10 objects and their 10 buffers (100_000 bytes and the
  # trailing NUL), recorded through Python's allocators with the full stack.
  arrays = at_line(samples, "make_bytearrays", "bytearray")
  assert sum(s["count"] for s in arrays) == 20, arrays
  assert 10 * 100_001 < sum(s["bytes"] for s in arrays) <= 10 * (100_001 + 128), arrays
  for s in arrays:
    assert [f[0] for f in own(s)] == ["make_bytearrays", "main", "<module>"], s["frames"]
  # ctypes -> libc malloc: the native frames of the call (libffi, _ctypes)
  # above the Python frames, and the interpreter's native frames below them.
  native = [s for s in at_line(samples, "make_native", "native") if s["bytes"] == 3 * 777_777]
  assert len(native) == 1 and native[0]["count"] == 3, at_line(samples, "make_native", "native")
  frames = native[0]["frames"]
  names = [f[0] for f in frames]
  first_py = frames.index(own(native[0])[0])
  assert any("ffi_call" in n for n in names[:first_py]), frames
  assert [f[0] for f in own(native[0])] == ["make_native", "main", "<module>"], frames
  last_py = frames.index(own(native[0])[-1])
  assert any("main" in n for n in names[last_py + 1:]), frames  # pymain_main / __libc_start_main
  # PYMEM_DOMAIN_RAW, MEM and OBJ, one block each.
  for marker, size in (("raw", 111_111), ("mem", 222_222), ("obj", 333_333)):
    block = [s for s in at_line(samples, "make_each_domain", marker) if s["bytes"] == size]
    assert len(block) == 1 and block[0]["count"] == 1, (marker, at_line(samples, "make_each_domain", marker))
    assert [f[0] for f in own(block[0])] == ["make_each_domain", "main", "<module>"], block[0]["frames"]
  # numpy (where this Python has it): its data through numpy's malloc, the
  # Python frames of numpy's own functions, then the script's.
  arrays = [s for s in at_line(samples, "make_numpy", "numpy") if s["bytes"] == 4 * 800_000]
  if numpy_expected:
    assert len(arrays) == 1 and arrays[0]["count"] == 4, at_line(samples, "make_numpy", "numpy")
    assert [f[0] for f in own(arrays[0])] == ["make_numpy", "main", "<module>"], arrays[0]["frames"]
  # Freed before the end: nothing left.
  assert at_line(samples, "make_temporary", "temporary") == []


@pytest.mark.parametrize("python", pythons())
def test_python_frames_each_python(python, tmp_path):
  """Every Python 3.10-3.13 of this machine: one hook, no extension needed in that Python."""
  if python is None:
    pytest.skip("this Python is not installed under ~/.pyenv")
  env = memory_env(str(tmp_path))
  p = subprocess.run([python, SCRIPT], env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  assert "spyglass:" not in p.stderr, p.stderr  # no warning, no unknown frees
  _, samples = exit_profile(str(tmp_path))
  has_numpy = subprocess.run([python, "-c", "import numpy"], capture_output=True, timeout=120).returncode == 0
  check_sites(samples, has_numpy)


FRAMES = os.path.join(HERE, "heap_frames.py")
WALK_PROBE = "import ctypes; print('WALK', ctypes.PyDLL(None).spyglass_heap_python_walk())"


def script_stacks(out_dir, script):
  """(frames, count, bytes) of each exit-profile sample allocated by `script`'s
  own lines (its innermost Python frame is the script's)."""
  _, samples = exit_profile(out_dir)
  out = []
  for s in samples:
    python = [f for f in s["frames"] if f[1].endswith(".py") or f[1].startswith("<")]
    if python and python[0][1] == script:
      out.append((tuple(map(tuple, s["frames"])), s["count"], s["bytes"]))
  return sorted(out)


@pytest.mark.parametrize("python", pythons())
def test_frames_read_in_place_match_the_api(python, tmp_path):
  """3.11-3.13 read Python frames from the interpreter's frame structs (no
  frame objects made); 3.10 through the public C API. The profiles are the
  same either way, stack for stack: generators resumed from different
  callers, frames in their prologue, callbacks from C, 80 deep, a coroutine,
  a thread."""
  if python is None:
    pytest.skip("this Python is not installed under ~/.pyenv")
  minor = subprocess.run([python, "-c", "import sys; print(sys.version_info[1])"], capture_output=True, text=True,
                         timeout=120).stdout.strip()
  env = memory_env(str(tmp_path / "probe"))
  p = subprocess.run([python, "-c", WALK_PROBE], env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and f"WALK {1 if minor == '10' else 2}" in p.stdout, (p.stdout, p.stderr)
  stacks = {}
  for walk in ("default", "api"):
    env = memory_env(str(tmp_path / walk))
    env["PYTHONHASHSEED"] = "0"
    if walk == "api":
      env["SPYGLASS_PYTHON_FRAME_WALK"] = "api"
    p = subprocess.run([python, FRAMES], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "spyglass:" not in p.stderr, p.stderr
    stacks[walk] = script_stacks(str(tmp_path / walk), FRAMES)
  assert stacks["default"] == stacks["api"]
  names = {f[0] for frames, _, _ in stacks["default"] for f in frames if f[1] == FRAMES}
  assert {"gen", "drive_a", "drive_b", "inner", "cells", "__init__", "key", "deep", "co", "in_thread"} <= names, names
  # The generator's block of each resumption names the caller that resumed it.
  gen_callers = {next(f[0] for f in frames[frames.index(g) + 1:] if f[1] == FRAMES)
                 for frames, _, _ in stacks["default"] for g in frames if g[0] == "gen"}
  assert gen_callers == {"drive_a", "drive_b"}, gen_callers


def test_python_m_spyglass_run(tmp_path):
  """The entry point itself: `python -m spyglass run script.py` (memory is the default)."""
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path), SCRIPT],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  path, samples = exit_profile(str(tmp_path))
  assert path in p.stderr, p.stderr  # the closing summary names the profile
  check_sites(samples, HAVE_NUMPY)


def test_python_allocator_malloc(tmp_path):
  """--python-allocator=malloc (PYTHONMALLOC=malloc): pymalloc bypassed, the same sites."""
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path), "--python-allocator", "malloc",
                      SCRIPT], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  check_sites(exit_profile(str(tmp_path))[1], HAVE_NUMPY)


def python_only(sample):
  """Whether every frame of a sample is a Python frame (a .py file or a frozen module)."""
  return all(f[1].endswith(".py") or f[1].startswith("<") for f in sample["frames"])


def test_python_mode_light(tmp_path):
  """--python-mode light (memray's default mode): the blocks malloc sees, each with the Python
  frames alone; pymalloc's objects are not recorded one by one, its arenas are."""
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "sites"), "--python-mode",
                      "light", SCRIPT], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  samples = exit_profile(str(tmp_path / "sites"))[1]
  # The bytearrays' buffers (100_001 bytes: malloc's), not their objects (pymalloc's).
  arrays = at_line(samples, "make_bytearrays", "bytearray")
  assert sum(s["count"] for s in arrays) == 10 and sum(s["bytes"] for s in arrays) == 10 * 100_001, arrays
  native = at_line(samples, "make_native", "native")
  assert sum(s["count"] for s in native) == 3 and sum(s["bytes"] for s in native) == 3 * 777_777, native
  for marker, size in (("raw", 111_111), ("mem", 222_222), ("obj", 333_333)):
    block = at_line(samples, "make_each_domain", marker)
    assert [(s["bytes"], s["count"]) for s in block] == [(size, 1)], (marker, block)
  for s in arrays + native + block:
    assert python_only(s) and [f[0] for f in own(s)][1:] == ["main", "<module>"], s["frames"]
  assert at_line(samples, "make_temporary", "temporary") == []
  # Small objects: their pymalloc arenas, named by the Python frames that needed them.
  script = tmp_path / "small.py"
  script.write_text("keep = None\n\ndef make_small():\n  global keep\n  keep = [str(i) for i in range(200_000)]  # SITE\n\n"
                    "make_small()\n")
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "small"), "--python-mode",
                      "light", str(script)], capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  samples = exit_profile(str(tmp_path / "small"))[1]
  small = [s for s in samples if s["frames"] and s["frames"][0][1:] == (str(script), 5)]  # <listcomp> or make_small
  # 200_000 strings of ~55 bytes (11 MB: pymalloc's arenas of 256 KiB or 1 MiB) and the list's buffer,
  # as a few blocks, not 200_000 objects.
  assert sum(s["bytes"] for s in small) >= 11 << 20 and sum(s["count"] for s in small) < 100, small
  assert all(python_only(s) for s in small), small


def test_address_reused_while_its_erase_waits(tmp_path):
  """A freed object's erase waits a few frees (its table slot prefetched); pymalloc hands the
  address out again at once, and the new object there must stay recorded (exit profile exact).
  The live bytes stay flat (each kept object replaces one), so no new peak settles the wait."""
  script = tmp_path / "reuse.py"
  script.write_text("N, M = 50_000, 1_000\nkeep = [None] * M\n\ndef reuse():\n  for i in range(N):\n"
                    "    t, u = bytes(300), bytes(300)\n"
                    "    del t  # back to pymalloc (not the latest allocation): the next object of its size gets its address\n"
                    "    keep[i % M] = bytes(300)  # SITE\n    del u\n\nreuse()\n")
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "out"), str(script)],
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr
  samples = exit_profile(str(tmp_path / "out"))[1]
  kept = [s for s in samples if s["frames"] and any(f[1:] == (str(script), 8) for f in s["frames"][:8])]
  assert sum(s["count"] for s in kept) == 1_000 and sum(s["bytes"] for s in kept) == 1_000 * (300 + 33), kept


def test_bad_arguments():
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--python-allocator", "jemalloc", SCRIPT],
                     capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and "--python-allocator must be pymalloc or malloc" in p.stderr, p.stderr
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--python-mode", "fast", SCRIPT],
                     capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and "--python-mode must be full or light" in p.stderr, p.stderr
  p = subprocess.run([sys.executable, "-m", "spyglass", "run"], capture_output=True, text=True, timeout=60)
  assert p.returncode == 2 and "no script given" in p.stderr, p.stderr


def test_go_pprof_reads_python_frames(tmp_path):
  # scripts/setup.sh installs go; a missing one is a broken setup, not a skip.
  assert GO is not None, "go not installed (run scripts/setup.sh)"
  subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path), SCRIPT], check=True,
                 capture_output=True, timeout=300)
  path, _ = exit_profile(str(tmp_path))
  env = {**os.environ, "PPROF_TMPDIR": str(tmp_path), "GOTOOLCHAIN": "local"}
  traces = subprocess.run([GO, "tool", "pprof", "-traces", "-lines", path], capture_output=True, text=True,
                          timeout=300, env=env)
  assert traces.returncode == 0, traces.stderr
  for fn, marker in (("make_bytearrays", "bytearray"), ("make_native", "native")):
    assert f"{fn} {SCRIPT}:{line_of(marker)}" in traces.stdout, traces.stdout[:4000]
  top = subprocess.run([GO, "tool", "pprof", "-top", "-lines", path], capture_output=True, text=True, timeout=300,
                       env=env)
  assert top.returncode == 0 and f"make_native {SCRIPT}:{line_of('native')}" in top.stdout, top.stdout


MEMRAY_READ = r"""
import collections, json, sys
from memray import FileReader
script = sys.argv[2]
by_line = collections.defaultdict(lambda: [0, 0])
for a in FileReader(sys.argv[1]).get_leaked_allocation_records(merge_threads=True):
  own = [f for f in a.stack_trace() if f[1] == script]
  if own:
    by_line[f"{own[0][0]}:{own[0][2]}"][0] += a.n_allocations
    by_line[f"{own[0][0]}:{own[0][2]}"][1] += a.size
print(json.dumps(by_line))
"""


def test_numbers_agree_with_memray(tmp_path):
  """memray (tracing Python's allocators too, as we do) reports the same live
  bytes and blocks per site of the script at its end."""
  # scripts/setup.sh and python_test.sh install memray; a missing one is a broken setup, not a skip.
  assert subprocess.run([sys.executable, "-c", "import memray"], timeout=120).returncode == 0, "memray missing"
  subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(tmp_path / "sg"), SCRIPT], check=True,
                 capture_output=True, timeout=300)
  _, samples = exit_profile(str(tmp_path / "sg"))
  bin_path = str(tmp_path / "memray.bin")
  m = subprocess.run([sys.executable, "-m", "memray", "run", "--trace-python-allocators", "-q", "-o", bin_path,
                      SCRIPT], capture_output=True, text=True, timeout=300)
  assert m.returncode == 0, m.stderr
  r = subprocess.run([sys.executable, "-c", MEMRAY_READ, bin_path, SCRIPT], capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr
  theirs = json.loads(r.stdout)
  # (Not the ctypes site: memray hooks malloc in each library's PLT, and a
  # pointer from dlsym, as ctypes calls it, goes around that; the hook sees it.)
  sites = [("make_bytearrays", "bytearray")] + [("make_each_domain", d) for d in ("raw", "mem", "obj")] + ([("make_numpy", "numpy")] if HAVE_NUMPY else [])
  for fn, marker in sites:
    ours = at_line(samples, fn, marker)
    key = f"{fn}:{line_of(marker)}"
    assert key in theirs, theirs
    assert [sum(s["count"] for s in ours), sum(s["bytes"] for s in ours)] == theirs[key], (key, ours, theirs)
  assert f"make_temporary:{line_of('temporary')}" not in theirs


def test_startup_module_hides_itself_and_chains(tmp_path):
  """The startup module leaves sys.path as it was, runs the sitecustomize it
  hides, and does nothing (no message) where the hook is not loaded."""
  user = tmp_path / "user"
  user.mkdir()
  (user / "sitecustomize.py").write_text("print('USER SITECUSTOMIZE')\n")
  probe = "import sys; print('ON PATH', any('spyglass_python_startup' in p for p in sys.path))"
  env = memory_env(str(tmp_path / "mem"))
  env["PYTHONPATH"] += os.pathsep + str(user)
  p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and "USER SITECUSTOMIZE" in p.stdout and "ON PATH False" in p.stdout, (p.stdout, p.stderr)
  assert glob.glob(str(tmp_path / "mem" / "memory.*.exit.prof")), p.stderr
  # Without the hook: the module finds nothing to turn on, and says nothing.
  del env["LD_PRELOAD"]
  p = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0 and "USER SITECUSTOMIZE" in p.stdout and p.stderr == "", (p.stdout, p.stderr)


def test_bad_sample_bytes():
  for bad in ("-5", "1e3", str((1 << 30) + 1)):
    p = subprocess.run([sys.executable, "-m", "spyglass", "run", "--sample-bytes", bad, SCRIPT], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 2 and "--sample-bytes must be an integer" in p.stderr, (bad, p.stderr)
