"""A JAX program under the heap hook with the Python tracer on (`python -m
spyglass run --trace T -o M`, `spyglass run --memory --trace T -- python`).

The tracer names each function it enters in the code object's extra slots
(_PyCode_SetExtra, which reallocates the code's extra array through
PyMem_Realloc); the hook, recording that reallocation, walked the same
frames (an importlib or runpy function already seen by the hook, its outer
frame on the stack) and read the code's extra array after the reallocation
had freed it and before the interpreter stored the new one: SIGSEGV (139) on
every JAX run; with PYTHONMALLOC=malloc (glibc's free writes over the first
slots) on every traced run, JAX or not."""
import glob
import os
import subprocess
import sys
import textwrap

import pytest

from pprof_decode import parse_profile
from test_cli import SPYGLASS, sh
from test_env_start import check_script_functions, clean_env, trace_events, write_script

HAVE_JAX = subprocess.run([sys.executable, "-c", "import jax"], capture_output=True, timeout=300).returncode == 0

JAX_PROGRAM = textwrap.dedent("""\
    import jax
    import jax.numpy as jnp
    from jax.profiler import StepTraceAnnotation

    @jax.jit
    def step(x):
        return jnp.tanh(x @ x.T).sum()

    def train():
        x = jnp.ones((64, 64))
        total = 0.0
        for i in range(10):
            with StepTraceAnnotation("train", step_num=i):
                total += float(step(x + i))
        return total

    print("TOTAL", round(train(), 3), flush=True)
    """)


def write_program(tmp_path):
  p = tmp_path / "jax_steps.py"
  p.write_text(JAX_PROGRAM)
  return str(p)


def expected_output(script):
  r = sh(sys.executable, script, env=clean_env(JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr
  return r.stdout


def check_run(r, script, logs, mem, want_stdout):
  assert r.returncode == 0, (r.returncode, r.stderr[-3000:])  # not -11 / 139
  assert r.stdout == want_stdout, r.stdout
  names = {e["name"] for e in trace_events(logs)}
  assert "$jax_steps.py:9 train" in names, sorted(names)[:40]  # the Python tracer's event
  [prof] = glob.glob(os.path.join(mem, "memory.*.exit.prof"))
  with open(prof, "rb") as f:
    samples = parse_profile(f.read())
  assert any(path == script for s in samples for _, path, _ in s["frames"])  # the hook's Python frames


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not importable")
def test_jax_under_heap_hook_and_python_tracer(tmp_path):
  script = write_program(tmp_path)
  want = expected_output(script)
  env = clean_env(JAX_PLATFORMS="cpu")
  logs, mem = str(tmp_path / "logs"), str(tmp_path / "mem")
  r = sh(sys.executable, "-m", "spyglass", "run", "--trace", logs, "-o", mem, script, env=env)
  check_run(r, script, logs, mem, want)
  logs, mem = str(tmp_path / "logs2"), str(tmp_path / "mem2")
  r = sh(SPYGLASS, "run", "--memory", "--trace", logs, "-o", mem, "--", sys.executable, script, env=env)
  check_run(r, script, logs, mem, want)


@pytest.mark.skipif(not HAVE_JAX, reason="jax is not importable")
def test_jax_native_frames_named_from_the_symbol_table(tmp_path):
  """The heap hook alone on a small JAX program. jaxlib's libjax_common.so
  has no DWARF and some 740k symbols: the exit and peak snapshots name its
  thousands of frames from its symbol table. libdw's lookup scanned the
  whole table for each address (milliseconds each): the snapshots took
  minutes of CPU and the run outlasted its 300 s limit."""
  script = tmp_path / "jax_small.py"
  script.write_text('import jax.numpy as jnp\nprint("SUM", float(jnp.tanh(jnp.ones((32, 32))).sum()), flush=True)\n')
  mem = str(tmp_path / "mem")
  r = sh(sys.executable, "-m", "spyglass", "run", "-o", mem, str(script), env=clean_env(JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
  assert r.stdout.startswith("SUM "), r.stdout
  [prof] = glob.glob(os.path.join(mem, "memory.*.exit.prof"))
  with open(prof, "rb") as f:
    samples = parse_profile(f.read())
  # Named by the symbol table: XLA's C++ functions, with no source file.
  from_symbols = {name for s in samples for name, path, _ in s["frames"] if path == "" and "xla::" in name}
  assert len(from_symbols) > 10, sorted(from_symbols)


def test_trace_and_memory_with_python_allocator_malloc(tmp_path):
  """No JAX needed: the tracer's first call of runpy's _run_code (the script's)
  grows that code's extra array while the outer _run_code (running spyglass's
  __main__) is on the stack; glibc's free, under PYTHONMALLOC=malloc, writes
  over the freed array, so a read of it is a wild pointer at once."""
  script = write_script(tmp_path)
  logs, mem = str(tmp_path / "logs"), str(tmp_path / "mem")
  r = sh(sys.executable, "-m", "spyglass", "run", "--trace", logs, "-o", mem, "--python-allocator", "malloc", script,
         "exit", "4")
  assert r.returncode == 4, (r.returncode, r.stderr[-3000:])  # the script's status, not 139
  assert "ARGS ['exit', '4']" in r.stdout
  check_script_functions(trace_events(logs))
  [prof] = glob.glob(os.path.join(mem, "memory.*.exit.prof"))
  with open(prof, "rb") as f:
    assert any(path == script for s in parse_profile(f.read()) for _, path, _ in s["frames"])
