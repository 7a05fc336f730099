"""`python -m spyglass run` ends as `spyglass run` does (memory/run_summary.h):
a Python program that runs out of memory (MemoryError) or dies of a signal
leaves a profile of the moment (the dying process's dump made into pprof), and
the closing summary says how each process ended."""
import glob
import os
import subprocess
import sys

from pprof_decode import parse_profile


def run(tmp_path, source):
  script = tmp_path / "prog.py"
  script.write_text(source)
  out = tmp_path / "mem"
  p = subprocess.run([sys.executable, "-m", "spyglass", "run", "-o", str(out), str(script)],
                     capture_output=True, text=True, timeout=300)
  return p, out


def test_memory_error_leaves_an_oom_profile(tmp_path):
  p, out = run(tmp_path, "def make_huge():\n    return bytearray(10**13)\n\nmake_huge()\n")
  assert p.returncode == 1, p.stderr
  assert "MemoryError" in p.stderr
  assert "(main)" in p.stderr and "exit status 1; out of memory: an allocation of 9.1 TiB failed in make_huge" in p.stderr
  [oom] = glob.glob(str(out / "memory.*.oom.prof"))
  assert os.path.basename(oom) in p.stderr
  assert not glob.glob(str(out / "*.raw"))  # the dump was made into the profile
  with open(oom, "rb") as f:
    samples = parse_profile(f.read())
  failed = [s for s in samples if s["labels"].get("kind") == "failed"]
  assert len(failed) == 1 and failed[0]["count"] == 1 and failed[0]["bytes"] == 0
  assert any(fn == "make_huge" and line == 2 for fn, _, line in failed[0]["frames"]), failed[0]["frames"]


def test_fatal_signal_leaves_a_signal_profile(tmp_path):
  p, out = run(tmp_path, "import os, signal\nkeep = [bytearray(1000) for _ in range(100)]\n"
                         "os.kill(os.getpid(), signal.SIGTERM)\n")
  assert p.returncode == -15, p.stderr  # the program's death is the wrapper's
  assert "killed by SIGTERM (snapshot at the signal)" in p.stderr, p.stderr
  [sig] = glob.glob(str(out / "memory.*.signal.prof"))
  with open(sig, "rb") as f:
    samples = parse_profile(f.read())
  assert sum(s["bytes"] for s in samples) > 100 * 1000
