"""JAX's own profiler tests, with jax.profiler replaced by spyglass.profiler.

JAX's files are not part of this repository: they are read from a copy of
jax's source at the tag of the installed jax (see find_jax_tests), rewritten
into a temporary folder, and run there in one pytest session with JAX's own
pytest settings (filterwarnings=error, --import-mode=importlib).

The rewrite is what a user does to switch: every `jax.profiler.<name>` and
jax's internal `jax._src.profiler` module (which the tests import for
stop_and_get_fdo_profile and PGLEProfiler) become `spyglass.profiler`.
Nothing else in the files changes; `python -m jax.collect_profile` (a
client) stays jax's and captures our server.

    python tests/python/jax_dropin.py [JAX_SOURCE] [pytest args...]

runs them by hand (JAX_SOURCE: a jax checkout or a folder holding the
test files; default: what find_jax_tests finds).
"""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

TEST_FILES = ("profiler_test.py", "profiler_session_test.py", "pgle_test.py")
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def jax_tag(python=sys.executable):
  """jax-v<version> of the jax that `python` imports (None without jax)."""
  p = subprocess.run([python, "-c", "import jax; print(jax.__version__)"], capture_output=True, text=True)
  return f"jax-v{p.stdout.strip()}" if p.returncode == 0 else None


def find_jax_tests(tag):
  """The folder holding JAX's test files at `tag`, or None.

  Looked for, in order: $SPYGLASS_JAX_TESTS (a folder with the files, or a
  jax checkout with tests/), then <repo>/../shared/jax_tests/<tag>/ (the
  shared folder that travels beside the repository to CI), then a git
  mirror of jax-ml/jax at $SPYGLASS_JAX_GIT (the tag is checked out of it).
  """
  candidates = []
  if os.environ.get("SPYGLASS_JAX_TESTS"):
    candidates.append(os.environ["SPYGLASS_JAX_TESTS"])
  candidates.append(os.path.join(os.path.dirname(REPO), "shared", "jax_tests", tag or ""))
  for c in candidates:
    for d in (c, os.path.join(c, "tests")):
      if os.path.isfile(os.path.join(d, TEST_FILES[0])):
        return d
  git_dir = os.environ.get("SPYGLASS_JAX_GIT")
  if git_dir and tag:
    # A jax newer than the mirror's tags (a post-release like 0.12.0.1, or a
    # mirror taken earlier) is tested with the newest files there are.
    if subprocess.run(["git", "--git-dir", git_dir, "rev-parse", "-q", "--verify", f"refs/tags/{tag}"],
                      capture_output=True).returncode != 0:
      tag = "HEAD"
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"spyglass_jax_tests_{tag}_{os.getpid()}")
    os.makedirs(out, exist_ok=True)
    for name in TEST_FILES + ("../pyproject.toml", "../conftest.py"):
      path = os.path.normpath(os.path.join("tests", name))
      p = subprocess.run(["git", "--git-dir", git_dir, "show", f"{tag}:{path}"], capture_output=True)
      if p.returncode == 0:
        with open(os.path.join(out, os.path.basename(path)), "wb") as f:
          f.write(p.stdout)
    if os.path.isfile(os.path.join(out, TEST_FILES[0])):
      return out
  return None


# `from jax._src import profiler` -> spyglass's module under the same name.
_SRC_IMPORT = re.compile(r"^from jax\._src import profiler$", re.M)
# `jax.profiler.<name>` (not `jax.profiler` in `import jax.profiler`).
_ATTR = re.compile(r"\bjax\.profiler\.(?=[A-Za-z_])")


def rewrite(text):
  """JAX's test source with jax.profiler replaced by spyglass.profiler."""
  text = _SRC_IMPORT.sub("from spyglass import profiler", text)
  text = _ATTR.sub("spyglass.profiler.", text)
  # Import spyglass.profiler where the file imports jax.profiler (or jax).
  if "spyglass.profiler." in text:
    text = re.sub(r"^import jax\.profiler$", "import jax.profiler\nimport spyglass.profiler", text,
                  count=1, flags=re.M)
    if "import spyglass.profiler" not in text:
      text = re.sub(r"^import jax$", "import jax\nimport spyglass.profiler", text, count=1, flags=re.M)
  return text


def prepare(src_dir, dst_dir):
  """Writes the rewritten test files and JAX's pytest settings into dst_dir."""
  os.makedirs(dst_dir, exist_ok=True)
  for name in TEST_FILES:
    with open(os.path.join(src_dir, name), encoding="utf-8") as f:
      text = f.read()
    with open(os.path.join(dst_dir, name), "w", encoding="utf-8") as f:
      f.write(rewrite(text))
  # JAX's pytest settings: its pyproject's [tool.pytest.ini_options] (from the
  # source root or beside the tests), else the two that matter here.
  for d in (src_dir, os.path.dirname(src_dir)):
    if os.path.isfile(os.path.join(d, "pyproject.toml")):
      with open(os.path.join(d, "pyproject.toml"), encoding="utf-8") as f:
        text = f.read()
      if "[tool.pytest.ini_options]" in text:
        section = text.split("[tool.pytest.ini_options]", 1)[1].split("\n[", 1)[0]
        # Doctest globs of the jax tree are not ours to run.
        section = re.sub(r"^addopts = .*$", 'addopts = "--import-mode=importlib"', section, flags=re.M)
        with open(os.path.join(dst_dir, "pyproject.toml"), "w", encoding="utf-8") as f:
          f.write("[tool.pytest.ini_options]" + section)
        break
  else:
    with open(os.path.join(dst_dir, "pyproject.toml"), "w", encoding="utf-8") as f:
      f.write('[tool.pytest.ini_options]\nfilterwarnings = ["error"]\naddopts = "--import-mode=importlib"\n')
  return [os.path.join(dst_dir, n) for n in TEST_FILES]


def run(src_dir, dst_dir, *pytest_args, python=sys.executable, timeout=900):
  """Runs the rewritten tests in one pytest session; returns (CompletedProcess, results).

  results: {test id: "passed" | "failed" | "error" | "skipped"} from pytest's junit XML.
  """
  files = prepare(src_dir, dst_dir)
  junit = os.path.join(dst_dir, "junit.xml")
  env = dict(os.environ, JAX_PLATFORMS=os.environ.get("JAX_PLATFORMS", "cpu"))
  env.pop("PYTEST_ADDOPTS", None)
  cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}",
         "--rootdir", dst_dir, "-c", os.path.join(dst_dir, "pyproject.toml"), *files, *pytest_args]
  p = subprocess.run(cmd, cwd=dst_dir, capture_output=True, text=True, env=env, timeout=timeout)
  results = {}
  if os.path.isfile(junit):
    for case in ET.parse(junit).getroot().iter("testcase"):
      outcome = "passed"
      for child in case:
        if child.tag in ("failure", "error", "skipped"):
          outcome = {"failure": "failed"}.get(child.tag, child.tag)
      results[f"{case.get('classname')}.{case.get('name')}"] = outcome
  return p, results


def main(argv):
  src = argv[1] if len(argv) > 1 and not argv[1].startswith("-") else None
  args = argv[2:] if src else argv[1:]
  tag = jax_tag()
  src = src or find_jax_tests(tag)
  if src is None:
    print(f"JAX's test files at {tag} not found (see find_jax_tests)", file=sys.stderr)
    return 2
  if os.path.isdir(os.path.join(src, "tests")):
    src = os.path.join(src, "tests")
  dst = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"spyglass_jax_dropin_{os.getpid()}")
  shutil.rmtree(dst, ignore_errors=True)
  p, results = run(src, dst, *args)
  sys.stdout.write(p.stdout[-20000:])
  sys.stderr.write(p.stderr[-5000:])
  counts = {}
  for outcome in results.values():
    counts[outcome] = counts.get(outcome, 0) + 1
  print(f"{tag}: {counts}")
  return p.returncode


if __name__ == "__main__":
  sys.exit(main(sys.argv))
