"""JAX's own profiler tests pass with jax.profiler replaced by spyglass.profiler.

tests/profiler_test.py, profiler_session_test.py and pgle_test.py of the
installed jax's tag, rewritten by jax_dropin.py, in one pytest session with
JAX's pytest settings. JAX's files are not in this repository: the test runs
where jax_dropin.find_jax_tests finds them ($SPYGLASS_JAX_TESTS, the shared
folder's jax_tests/<tag>/, or a git mirror of jax at $SPYGLASS_JAX_GIT) and
skips, naming the tag, elsewhere.
"""
import os

import pytest

import jax_dropin


def test_jax_profiler_tests_pass_on_spyglass(tmp_path):
  tag = jax_dropin.jax_tag()
  if tag is None:
    pytest.skip("jax not installed")
  src = jax_dropin.find_jax_tests(tag)
  if src is None:
    pytest.skip(f"JAX's test files at {tag} not found ($SPYGLASS_JAX_TESTS, ../shared/jax_tests/{tag}/, "
                "$SPYGLASS_JAX_GIT)")
  p, results = jax_dropin.run(src, str(tmp_path / "jax_tests"))
  bad = {name: outcome for name, outcome in results.items() if outcome in ("failed", "error")}
  assert p.returncode == 0 and not bad, f"{bad}\n{p.stdout[-8000:]}\n{p.stderr[-3000:]}"
  passed = [name for name, outcome in results.items() if outcome == "passed"]
  # On CPU jax 0.10.2's files pass 21 of 36 (the GPU, ROCm and PGLE cases
  # skip there; newer files also skip the subprocess case under pytest).
  assert len(passed) >= 18, results
  for name in ("profiler_test.ProfilerTest.testProfilerGetFDOProfile",
               "profiler_test.ProfilerTest.testProgrammaticProfiling",
               "profiler_test.ProfilerTest.testDeviceMemoryProfile"):
    assert results.get(name) == "passed", (name, results)
  # The rewrite left no test of jax's own profiler behind.
  for name in jax_dropin.TEST_FILES:
    with open(os.path.join(tmp_path, "jax_tests", name), encoding="utf-8") as f:
      text = f.read()
    assert "jax.profiler." not in text.replace("import jax.profiler", "")
    assert "from jax._src import profiler" not in text


def test_rewrite_replaces_every_profiler_reference():
  src = ("import jax\nimport jax.profiler\nfrom jax._src import profiler\n"
         "jax.profiler.start_trace(d)\nprofiler.stop_and_get_fdo_profile()\n"
         "x = partial(jax.profiler.annotate_function, name='a')\n")
  out = jax_dropin.rewrite(src)
  assert "spyglass.profiler.start_trace(d)" in out
  assert "partial(spyglass.profiler.annotate_function" in out
  assert "from spyglass import profiler" in out
  assert "import spyglass.profiler" in out
