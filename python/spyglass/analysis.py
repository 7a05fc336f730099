"""Where the time went, from code: the tables of `spyglass summary` and
`spyglass diff` as plain dicts (no pandas), computed by the same C++ core.

    from spyglass import analysis
    s = analysis.summary("/tmp/logs")             # a log dir, a run folder or one .xplane.pb
    print(s["steps"]["duration"]["p50_ns"], s["top_self"][0]["name"])
    d = analysis.diff("base_logs", "new_logs", fail_above=10, annotations=["matmul"])
    assert d["passed"], d["failures"]

Times are in nanoseconds; shares are fractions of the wall time. Files
written by JAX (jax.profiler) are read the same way as Spyglass's.
"""
import json as _json
import os as _os

from . import _spyglass

__all__ = ["summary", "diff"]


def _steps(steps):
    if steps is None:
        return None, None
    if isinstance(steps, int):
        return steps, steps
    first, last = steps
    return first, last


def summary(run, *, top=10, thread=None, steps=None):
    """The summary of a run as a dict (with CPU samples, their tables under
    "cpu", as `spyglass summary --json` has them).

    run: a .xplane.pb, a run folder (<log_dir>/plugins/profile/<run>), or a
    log dir (its newest run). top: rows per table (0: all). thread: only
    threads whose name contains it (or whose id it is). steps: a step number,
    or (first, last), inclusive: only those steps and the events inside them.
    """
    first, last = _steps(steps)
    return _json.loads(_spyglass._summary_json(_os.fspath(run), top, thread or "", first, last))


def diff(base, new, *, top=20, fail_above=None, annotations=(), thread=None, steps=None):
    """Two runs compared, as a dict: "steps", "annotations", "self",
    "kernels", "copies" (rows with base_ns, new_ns, delta_ns, delta_pct;
    per step when both runs have steps), "noise_pct", with CPU samples
    "cpu" (each function's self and total CPU time in both runs and their
    difference, as `spyglass diff --json` has it), and with fail_above
    (percent) the gate's "failures" and "passed".
    """
    first, last = _steps(steps)
    return _json.loads(_spyglass._diff_json(_os.fspath(base), _os.fspath(new), top,
                                            -1.0 if fail_above is None else float(fail_above),
                                            list(annotations), thread or "", first, last))
