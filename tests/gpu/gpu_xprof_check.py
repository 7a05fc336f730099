"""Reads a GPU .xplane.pb with XProf's converter (pip package xprof) and checks
what its GPU tools show: kernel_stats lists the kernel with its duration and
grid/block; framework_op_stats and overview_page put its device time under the
launch's outermost annotation; trace_viewer@ shows the kernel on /device:GPU:0 with its
annotation, the copies with their byte counts, and a flow from the launch on
the host thread to the kernel.

  python3 gpu_xprof_check.py <file.xplane.pb> [--kernel NAME] [--min-kernel-us N]
      [--copy-bytes N ...] [--annotation A] [--no-exact]

With no options it checks the synthetic file of gpu_records_test. Exit 0: ok,
1: a check failed, 77: xprof not installed.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile


def convert(path, tool):
  from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top
  params = {"use_saved_result": False}
  if tool.startswith("trace_viewer"):
    params["trace_viewer_options"] = {"resolution": 0, "full_dma": True, "format": "json"}
  data, _ = raw_to_tool_data.xspace_to_tool_data([path], tool, params)
  if data is None:
    raise RuntimeError(f"xprof {tool}: converter returned no data")
  if isinstance(data, bytes):
    data = data.decode("utf-8")
  return json.loads(data)


def rows(table):
  """(column ids, list of row dicts) of a DataTable or list of them."""
  tables = table if isinstance(table, list) else [table]
  out = []
  for t in tables:
    if not isinstance(t, dict) or "cols" not in t:
      continue
    cols = [c.get("id") or c.get("label") for c in t["cols"]]
    for r in t.get("rows", []):
      out.append({c: (cell or {}).get("v") for c, cell in zip(cols, r.get("c", []))})
  return out


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("xplane")
  ap.add_argument("--kernel", default="vector_add(float*, float*, float*, int)")
  ap.add_argument("--kernel-us", type=float, default=100.0, help="expected total duration (exact mode)")
  ap.add_argument("--grid", default="256,2,1")
  ap.add_argument("--block", default="128,1,1")
  ap.add_argument("--copy-bytes", type=int, action="append", default=None)
  ap.add_argument("--annotation", default="train::layer1")
  ap.add_argument("--no-exact", action="store_true", help="real GPU: durations only > 0")
  ap.add_argument("--pm-counter", default="sm__cycles_active.avg=42.5",
                  help="NAME=VALUE: a PM sampling counter on /device:GPU:0 ('' to skip)")
  a = ap.parse_args()
  copies = a.copy_bytes or [1048576, 65536]
  try:
    import xprof  # noqa: F401 pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    print(f"SKIP: xprof not importable ({e!r})")
    return 77
  failures = []
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, os.path.basename(a.xplane))
    shutil.copy(a.xplane, path)  # the converter writes caches next to its input

    ks = rows(convert(path, "kernel_stats"))
    mine = [r for r in ks if a.kernel in str(r.get("kernel_name", ""))]
    print(f"kernel_stats: {len(ks)} rows; {a.kernel}: {mine}")
    if not mine:
      failures.append(f"kernel_stats has no row for {a.kernel}")
    else:
      r = mine[0]
      total = float(r.get("total_duration_us") or 0)
      if a.no_exact:
        if total <= 0:
          failures.append(f"kernel duration {total} us")
      elif abs(total - a.kernel_us) > 0.01:
        failures.append(f"kernel_stats total_duration_us {total}, expected {a.kernel_us}")
      if not a.no_exact:
        for key, want in (("grid_dim", a.grid), ("block_dim", a.block)):
          if str(r.get(key)) != want:
            failures.append(f"kernel_stats {key} {r.get(key)!r}, expected {want!r}")
      if a.annotation and a.annotation.split("::")[0] not in str(r.get("op_name", "")):
        failures.append(f"kernel_stats op_name {r.get('op_name')!r} lacks {a.annotation.split('::')[0]!r}")

    # framework_op_stats and overview_page: device time under the outermost
    # annotation of the launch (tf_op).
    top = a.annotation.split("::")[0] if a.annotation else ""
    if top:
      fw = rows(convert(path, "framework_op_stats"))
      dev_ops = [r for r in fw if str(r.get("host_or_device", "")).lower() == "device"]
      if not any(r.get("operation") == top for r in dev_ops):
        failures.append(f"framework_op_stats: no device op {top!r}: {[(r.get('operation'), r.get('host_or_device')) for r in fw][:10]}")
      ov = rows(convert(path, "overview_page"))
      if not any(r.get("operation") == top for r in ov):
        failures.append(f"overview_page: no top op {top!r}")
      print(f"framework_op_stats: {len(dev_ops)} device ops; overview_page: {len(ov)} rows")

    # trace_viewer@ (what the UI loads): events per process, and the flow
    # from the launch on the host thread to the kernel (same bind_id).
    tv = convert(path, "trace_viewer@")
    events = [e for e in tv.get("traceEvents", []) if isinstance(e, dict)]
    pids = {e["pid"]: e.get("args", {}).get("name") for e in events
            if e.get("ph") == "M" and e.get("name") == "process_name"}
    gpu_pids = {p for p, n in pids.items() if n and "/device:GPU:0" in n}
    if not gpu_pids:
      failures.append(f"trace_viewer@ has no /device:GPU:0 process: {sorted(set(pids.values()), key=str)}")
    dev = [e for e in events if e.get("pid") in gpu_pids and e.get("ph") == "X"]
    kern = [e for e in dev if e.get("name") == a.kernel]
    launch = [e for e in events if e.get("name") == a.kernel and e.get("pid") not in gpu_pids and e.get("ph") == "X"]
    if not kern:
      failures.append(f"trace_viewer@: no kernel {a.kernel} on /device:GPU:0")
    if not launch:
      failures.append("trace_viewer@: no launch event named by the kernel on a host thread")
    linked = {e.get("bind_id") for e in kern if e.get("flow_in")} & {e.get("bind_id") for e in launch if e.get("flow_out")}
    if kern and launch and not linked:
      failures.append("trace_viewer@: no flow (bind_id) from the launch to the kernel")
    for prefix in ("Memcpy", "Memset"):
      if not any(e.get("name", "").startswith(prefix) for e in dev):
        failures.append(f"trace_viewer@: no {prefix} on /device:GPU:0")
    print(f"trace_viewer@: {len(dev)} device events, {len(launch)} launches, {len(linked)} linked")
    # PM sampling: a counter track of the GPU with the sampled values.
    if a.pm_counter:
      name, value = a.pm_counter.split("=")
      counters = [e for e in events if e.get("pid") in gpu_pids and e.get("ph") == "C" and e.get("name") == name]
      # trace_viewer@ packs a track's samples as "entries": [[ts, value], ...].
      values = [v for e in counters for v in e.get("args", {}).values()]
      values += [x[1] for e in counters for x in e.get("entries", []) if len(x) == 2]
      if not any(abs(float(v) - float(value)) < 1e-9 for v in values):
        failures.append(f"trace_viewer@: no counter {name}={value} on /device:GPU:0: {counters[:4]}")
      print(f"trace_viewer@: counter {name}: {values}")

    # The event details (args) come from the legacy trace_viewer tool.
    legacy = convert(path, "trace_viewer")
    levents = [e for e in legacy.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    lk = [e for e in levents if e.get("name") == a.kernel and "kernel_details" in e.get("args", {})]
    if a.annotation and not any(e["args"].get("annotation_stack") == a.annotation for e in lk):
      failures.append(f"kernel args {[e.get('args') for e in lk]} lack annotation_stack={a.annotation}")
    for n in copies:
      if not any(f"size:{n} " in str(e.get("args", {}).get("memcpy_details", "")) and
                 "kind_src" in str(e.get("args", {}).get("memcpy_details", "")) for e in levents):
        failures.append(f"trace_viewer: no device memcpy of {n} bytes: "
                        f"{[e.get('args', {}).get('memcpy_details') for e in levents if 'memcpy_details' in e.get('args', {})]}")
  for f in failures:
    print("FAIL:", f)
  print("ok" if not failures else f"{len(failures)} failure(s)")
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
