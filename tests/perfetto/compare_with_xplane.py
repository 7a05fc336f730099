#!/usr/bin/env python3
"""A perfetto_trace.pb against the .xplane.pb of the same run, event for event.

The trace is decoded with the Perfetto project's own classes (PyPI `perfetto`:
perfetto.protos.perfetto.trace.perfetto_trace_pb2), then imported as
trace_processor imports it (spec PERFETTO.md sections 1.3, 2, 3, 4): sequence
ids and incremental state, interning, track descriptors, BEGIN/END nesting per
track, counters, flows. trace_processor_shell itself is a download the
`perfetto` wheel makes on first use (nothing here reaches that host), so it is
used only when SPYGLASS_TRACE_PROCESSOR names a local binary.

Compared with the .xplane.pb: processes and threads (pid, tid, names), every
slice (process, thread, name, start and duration in ns, args), every counter
sample (track, unit, time, value), every flow (the slices it joins) and every
CPU sample (the "CPU samples" lines, docs/sampling.md) as a PerfSample:
process, thread, time and its whole stack (function, file, line, native or
Python) resolved through the interned callstacks, frames and mappings as
trace_processor resolves them.

  compare_with_xplane.py RUN.xplane.pb perfetto_trace.pb [--expect-lost N]
"""
import argparse
import collections
import importlib
import os
import shutil
import subprocess
import sys
import tempfile

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb  # the Perfetto project's classes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INTERNAL = {"_r", "_p", "_pt", "_c", "_ct", "flops", "program_id", "symbol_id"}
COUNTERS = "_counters_"
SAMPLES = "CPU samples"
DEVICE_PID_BASE = 0x40000000


def fail(msg):
  sys.exit(f"FAIL: {msg}")


def compiled_pb2(name):
  out = tempfile.mkdtemp(prefix="sg_pb2_")
  subprocess.run([shutil.which("protoc") or "protoc", f"--python_out={out}", f"-I{REPO}/proto",
                  f"{REPO}/proto/{name}.proto"], check=True)
  sys.path.insert(0, out)
  return importlib.import_module(f"{name}_pb2")


def xplane_pb2():
  return compiled_pb2("xplane")


def pprof_samples(path):
  """The pprof CPU profile's sample counts by (tid, functions outermost first), summed over annotations."""
  import gzip
  prof = compiled_pb2("profile").Profile()
  with gzip.open(path, "rb") as f:
    prof.ParseFromString(f.read())
  st = prof.string_table
  functions = {fn.id: st[fn.name] for fn in prof.function}
  locations = {loc.id: [functions[l.function_id] for l in loc.line] for loc in prof.location}
  out = collections.Counter()
  for smp in prof.sample:
    thread = next(st[l.str] for l in smp.label if st[l.key] == "thread")
    names = [n for lid in smp.location_id for n in reversed(locations[lid])]  # leaf first
    out[(int(thread.rsplit(" ", 1)[1]), tuple(reversed(names)))] += smp.value[0]
  return out


def stat_value(plane, s):
  kind = s.WhichOneof("value")
  if kind == "ref_value":
    return plane.stat_metadata[s.ref_value].name
  if kind == "bytes_value":
    return "<opaque bytes>"
  return getattr(s, kind)


def int_stat(plane, stats, name):
  for s in stats:
    if plane.stat_metadata[s.metadata_id].name == name and s.WhichOneof("value") in ("int64_value", "uint64_value"):
      return stat_value(plane, s)
  return None


def expected_from_xplane(path):
  x = xplane_pb2()
  space = x.XSpace()
  with open(path, "rb") as f:
    space.ParseFromString(f.read())
  threads, slices, counters = set(), collections.Counter(), collections.Counter()
  samples = collections.Counter()
  flow_groups = collections.defaultdict(set)
  pids = {}
  lost = 0
  for plane in space.planes:
    for s in plane.stats:
      if plane.stat_metadata[s.metadata_id].name in ("dropped_events", "overwritten_events",
                                                     "dropped_events_over_size_limit"):
        lost += max(0, stat_value(plane, s))
    if not any(len(l.events) for l in plane.lines):
      continue
    os_pid = int_stat(plane, plane.stats, "process_id") or 0
    pids[plane.name] = os_pid
    named_tids = {(l.display_id or l.id) & 0xFFFFFFFF for l in plane.lines
                  if len(l.events) and l.name not in (COUNTERS, SAMPLES)}
    for line in plane.lines:
      tid = (line.display_id or line.id) & 0xFFFFFFFF
      line_name = line.display_name or line.name
      if line.name == SAMPLES:
        if len(line.events) and tid not in named_tids:  # "<thread> <tid> CPU samples": the thread's name
          threads.add((plane.name, tid, line_name[:-len(" CPU samples")].rsplit(" ", 1)[0]))
        for e in line.events:
          ts = max(0, line.timestamp_ns + e.offset_ps // 1000)
          # Under the annotations open on the thread then, outermost first (docs/sampling.md).
          open_annotations = next((annotation_frames(plane, stat_value(plane, s)) for s in e.stats
                                   if plane.stat_metadata[s.metadata_id].name == "annotation_stack"), ())
          samples[(plane.name, tid, ts, open_annotations + xplane_stack(plane, e.metadata_id))] += 1
        continue
      if line.name != COUNTERS and len(line.events):
        threads.add((plane.name, tid, line_name))
      for e in line.events:
        md = plane.event_metadata[e.metadata_id]
        name = md.display_name or md.name
        ts = max(0, line.timestamp_ns + e.offset_ps // 1000)
        end = max(0, line.timestamp_ns + (e.offset_ps + max(0, e.duration_ps)) // 1000)
        if line.name == COUNTERS:
          for s in e.stats:
            stat = plane.stat_metadata[s.metadata_id].name
            if s.WhichOneof("value") not in ("int64_value", "uint64_value", "double_value"):
              continue
            track = name if stat in ("live_bytes", name) else f"{name} {stat}"
            unit = "bytes" if stat == "live_bytes" else None
            counters[(plane.name, track, unit, ts, float(stat_value(plane, s)))] += 1
          continue
        args = {}
        for s in list(md.stats) + list(e.stats):  # the event's own value wins
          key = plane.stat_metadata[s.metadata_id].name
          if key not in INTERNAL:
            args[key] = stat_value(plane, s)
        key = (plane.name, tid, name, ts, end - ts, frozenset(args.items()))
        slices[key] += 1
        corr = int_stat(plane, e.stats, "correlation_id")
        if corr is not None:
          flow_groups[("corr", os_pid, corr)].add(key)
        for p, t in (("_p", "_pt"), ("_c", "_ct")):
          v = int_stat(plane, e.stats, p)
          if v is not None:
            flow_groups[("pc", int_stat(plane, e.stats, t) or 0, v)].add(key)
  flows = {frozenset(g) for g in flow_groups.values() if len(g) > 1}
  return dict(threads=threads, slices=slices, counters=counters, flows=flows, pids=pids, lost=lost, samples=samples)


def xplane_stack(plane, leaf):
  """A sample's frames, outermost first: (function, file, line, kind) up the cpu_stack_parent chain."""
  frames = []
  while leaf:
    md = plane.event_metadata[leaf]
    f = {plane.stat_metadata[s.metadata_id].name: stat_value(plane, s) for s in md.stats}
    frames.append((md.display_name or md.name, f.get("cpu_frame_file", ""), f.get("cpu_frame_line", 0),
                   f.get("cpu_frame_kind", "native")))
    leaf = f.get("cpu_stack_parent", 0)
  return tuple(reversed(frames))


def annotation_frames(plane, text):
  """A sample's annotation stack ("outer::inner") as frames, outermost first; parts that join into the name of
  an event of the plane (a C++ name) are one annotation, the longest such run (of 8 parts at most)."""
  known = {n for md in plane.event_metadata.values() if not md.name.startswith("cpu_stack#")
           for n in (md.name, md.display_name) if "::" in n}
  parts, out, k = text.split("::"), [], 0
  while k < len(parts):
    take = next((m - k for m in range(min(len(parts), k + 8), k + 1, -1) if "::".join(parts[k:m]) in known), 1)
    out.append(("::".join(parts[k:k + take]), "", 0, "annotation"))
    k += take
  return tuple(out)


def check_no_unknown_fields(msg, where):
  # A field number or wire type the classes do not know shows up here.
  try:
    from google.protobuf import unknown_fields  # protobuf >= 4.22
    unknown = len(unknown_fields.UnknownFieldSet(msg))
  except ImportError:
    unknown = len(msg.UnknownFields())
  if unknown:
    fail(f"{where}: {unknown} unknown field(s) in {msg.DESCRIPTOR.full_name}")
  for field, value in msg.ListFields():
    if field.type == field.TYPE_MESSAGE:
      for m in (value if getattr(field, "is_repeated", None) or getattr(field, "label", 0) == 3 else [value]):
        check_no_unknown_fields(m, where)


def actual_from_perfetto(path):
  with open(path, "rb") as f:
    data = f.read()
  if not data or data[0] != 0x0A:
    fail("the file does not start with Trace.packet (0x0A): Perfetto would not see a proto trace")
  trace = pb.Trace()
  trace.ParseFromString(data)
  TE = pb.TrackEvent
  seq_valid, names, ann_names = {}, {}, {}
  interned = collections.defaultdict(dict)  # (seq, InternedData field) -> iid -> entry
  samples = collections.Counter()
  PROFILE_TABLES = ("function_names", "source_paths", "mapping_paths", "mappings", "frames", "callstacks")
  tracks, processes = {}, {}
  open_slices = collections.defaultdict(list)
  slices, counters, flows = [], collections.Counter(), collections.defaultdict(list)
  timeline = []  # (ts, packet index, track uuid, the slice a BEGIN opens or None for an END)
  lost = 0
  for i, p in enumerate(trace.packet):
    where = f"packet {i}"
    check_no_unknown_fields(p, where)
    seq = p.trusted_packet_sequence_id
    if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
      if seq == 0:
        fail(f"{where}: cleared state without a sequence id")
      seq_valid[seq] = True
      names[seq], ann_names[seq] = {}, {}
    if p.HasField("interned_data"):
      if not seq_valid.get(seq):
        fail(f"{where}: interned data while the sequence's state is invalid (trace_processor drops it)")
      for table, entries in ((names[seq], p.interned_data.event_names),
                             (ann_names[seq], p.interned_data.debug_annotation_names)):
        for en in entries:
          if en.iid == 0 or en.iid in table:
            fail(f"{where}: iid {en.iid} is 0 or defined twice")
          table[en.iid] = en.name
      for field in PROFILE_TABLES:
        for en in getattr(p.interned_data, field):
          if en.iid == 0 or en.iid in interned[(seq, field)]:
            fail(f"{where}: {field} iid {en.iid} is 0 or defined twice")
          interned[(seq, field)][en.iid] = en
    if p.HasField("perf_sample"):
      samples[sample_of(p, where, seq_valid, interned, processes)] += 1
    if p.HasField("trace_stats"):
      for b in p.trace_stats.buffer_stats:
        lost += b.trace_writer_packet_loss
    if p.HasField("track_descriptor"):
      td = p.track_descriptor
      if td.uuid == 0 or td.uuid in tracks:
        fail(f"{where}: track uuid {td.uuid} is 0 or declared twice")
      if td.HasField("process"):
        processes[td.process.pid] = td.process.process_name
        tracks[td.uuid] = dict(kind="process", pid=td.process.pid, name=td.process.process_name,
                               labels=list(td.process.process_labels))
      elif td.HasField("thread"):
        tracks[td.uuid] = dict(kind="thread", pid=td.thread.pid, tid=td.thread.tid, name=td.thread.thread_name)
      elif td.HasField("counter"):
        unit = {pb.CounterDescriptor.UNIT_SIZE_BYTES: "bytes"}.get(td.counter.unit)
        tracks[td.uuid] = dict(kind="counter", parent=td.parent_uuid, name=td.name, unit=unit)
      else:
        tracks[td.uuid] = dict(kind="lane", parent=td.parent_uuid, name=td.name)
    if not p.HasField("track_event"):
      continue
    if seq == 0:
      fail(f"{where}: a track event without trusted_packet_sequence_id (dropped)")
    if (p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE) and not seq_valid.get(seq):
      fail(f"{where}: skipped: needs incremental state that is not valid")
    te = p.track_event
    if te.track_uuid not in tracks:
      fail(f"{where}: track {te.track_uuid} has no descriptor before it")
    track = tracks[te.track_uuid]
    ts = p.timestamp
    if te.type == TE.TYPE_COUNTER:
      if track["kind"] != "counter":
        fail(f"{where}: a counter value on a track that is not a counter")
      value = te.double_counter_value if te.HasField("double_counter_value") else te.counter_value
      proc = tracks[track["parent"]]
      counters[(proc["name"], track["name"], track["unit"], ts, float(value))] += 1
      continue
    if track["kind"] not in ("thread", "lane"):
      fail(f"{where}: a slice on a {track['kind']} track")
    if te.type == TE.TYPE_SLICE_END:
      if te.HasField("name_iid") or te.HasField("name") or te.category_iids or te.categories:
        fail(f"{where}: an END with a name or category (trace_processor would not match it)")
      timeline.append((ts, i, te.track_uuid, None))
      continue
    if te.type not in (TE.TYPE_SLICE_BEGIN, TE.TYPE_INSTANT):
      fail(f"{where}: unexpected event type {te.type}")
    if te.name_iid not in names.get(seq, {}):
      fail(f"{where}: name iid {te.name_iid} not defined before on the sequence")
    args = {}
    for a in te.debug_annotations:
      if a.name_iid not in ann_names[seq]:
        fail(f"{where}: annotation name iid {a.name_iid} not defined")
      kind = a.WhichOneof("value")
      args[ann_names[seq][a.name_iid]] = getattr(a, kind)
    thread = track if track["kind"] == "thread" else tracks[track["parent"]]
    if track["kind"] == "lane" and track["name"] != thread["name"]:
      fail(f"{where}: an overflow lane named apart from its thread")
    s = dict(proc=processes[thread["pid"]], tid=thread["tid"], name=names[seq][te.name_iid], ts=ts, dur=0,
             args=frozenset(args.items()))
    slices.append(s)
    for fid in te.flow_ids:
      flows[fid].append(s)
    if te.type == TE.TYPE_SLICE_BEGIN:
      timeline.append((ts, i, te.track_uuid, s))
  # Then, as trace_processor does, the events in time order (the sort is
  # stable: file order at equal times), each END closing its track's
  # innermost open slice.
  timeline.sort(key=lambda e: (e[0], e[1]))
  for ts, i, uuid, s in timeline:
    stack = open_slices[uuid]
    if s is not None:
      stack.append(s)
      if len(stack) > 512:
        fail(f"packet {i}: deeper than 512 slices on a track")
      continue
    if not stack:
      fail(f"packet {i}: an END with no open slice on its track")
    s = stack.pop()
    s["dur"] = ts - s["ts"]
  for uuid, stack in open_slices.items():
    if stack:
      fail(f"track {uuid}: {len(stack)} slice(s) never ended")
  key = lambda s: (s["proc"], s["tid"], s["name"], s["ts"], s["dur"], s["args"])
  threads = {(processes[t["pid"]], t["tid"], t["name"]) for t in tracks.values() if t["kind"] == "thread"}
  pids = {t["name"]: t["pid"] for t in tracks.values() if t["kind"] == "process"}
  return dict(threads=threads, slices=collections.Counter(key(s) for s in slices), counters=counters, samples=samples,
              flows={frozenset(key(s) for s in g) for g in flows.values() if len(g) > 1}, pids=pids, lost=lost,
              lanes=sum(t["kind"] == "lane" for t in tracks.values()),
              labels={t["name"]: t["labels"] for t in tracks.values() if t["kind"] == "process"})


def sample_of(p, where, seq_valid, interned, processes):
  """A PerfSample resolved as trace_processor resolves it (stack_profile_sequence_state.cc)."""
  seq = p.trusted_packet_sequence_id
  if seq == 0 or not seq_valid.get(seq):
    fail(f"{where}: a sample on a sequence without valid incremental state")
  if not p.sequence_flags & pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE:
    fail(f"{where}: a sample using interned data without SEQ_NEEDS_INCREMENTAL_STATE")
  ps = p.perf_sample
  if ps.pid not in processes:
    fail(f"{where}: a sample of pid {ps.pid}, which no process track declares")
  if ps.cpu_mode != pb.Profiling.MODE_USER:
    fail(f"{where}: cpu_mode {ps.cpu_mode}, not MODE_USER")
  table = lambda field: interned[(seq, field)]
  def string(field, iid):
    if iid not in table(field):
      fail(f"{where}: {field} iid {iid} not interned")
    return table(field)[iid].str.decode()
  cs = table("callstacks").get(ps.callstack_iid)
  if cs is None or not cs.frame_ids:
    fail(f"{where}: callstack {ps.callstack_iid} not interned or empty")
  stack = []
  for fid in cs.frame_ids:  # outermost first
    fr = table("frames").get(fid)
    if fr is None:
      fail(f"{where}: frame {fid} not interned")
    m = table("mappings").get(fr.mapping_id)
    if m is None:
      fail(f"{where}: frame {fid}'s mapping {fr.mapping_id} not interned (trace_processor drops the sample)")
    for path in m.path_string_ids:
      string("mapping_paths", path)
    kind = {pb.Frame.KIND_NATIVE: "native", pb.Frame.KIND_INTERPRETED: "python"}.get(fr.kind)
    if string("mapping_paths", m.path_string_ids[0]) == "[annotation]":
      if fr.kind != pb.Frame.KIND_UNKNOWN or fr.source_path_iid or fr.line_number or fr.rel_pc:
        fail(f"{where}: annotation frame {fid} carries a kind, file, line or pc")
      kind = "annotation"
      if stack and stack[-1][3] != "annotation":
        fail(f"{where}: annotation frame {fid} inside a code frame (annotations are the outermost frames)")
    elif kind is None or (kind == "python") != (string("mapping_paths", m.path_string_ids[0]) == "[python]"):
      fail(f"{where}: frame {fid}: kind {fr.kind} in mapping {fr.mapping_id}")
    stack.append((string("function_names", fr.function_name_id),
                  string("source_paths", fr.source_path_iid) if fr.source_path_iid else "", fr.line_number, kind))
  return (processes[ps.pid], ps.tid, p.timestamp, tuple(stack))


def diff(what, expected, actual):
  if expected == actual:
    return
  if isinstance(expected, collections.Counter):
    missing, extra = expected - actual, actual - expected
  else:
    missing, extra = set(expected) - set(actual), set(actual) - set(expected)
  fail(f"{what} differ:\n  in the .xplane.pb only: {sorted(missing, key=str)[:10]}\n"
       f"  in the perfetto trace only: {sorted(extra, key=str)[:10]}")


def check_with_trace_processor(path, n_slices, n_samples):
  shell = os.environ.get("SPYGLASS_TRACE_PROCESSOR")
  if not shell:
    print("trace_processor: not run (set SPYGLASS_TRACE_PROCESSOR to a local trace_processor_shell)")
    return
  from perfetto.trace_processor import TraceProcessor, TraceProcessorConfig
  with TraceProcessor(trace=path, config=TraceProcessorConfig(bin_path=shell)) as tp:
    count = next(iter(tp.query("select count(*) as n from slice"))).n
    if count != n_slices:
      fail(f"trace_processor imported {count} slices, expected {n_slices}")
    # Every sample on a thread of a process, with its stack (what the UI's per-thread tracks and flame graph read).
    samples = next(iter(tp.query(
        "select count(*) as n from perf_sample join thread using (utid) "
        "where callsite_id is not null and upid is not null"))).n
    if samples != n_samples:
      fail(f"trace_processor has {samples} perf samples with a stack on a process's thread, expected {n_samples}")
    bad = [(r.name, r.value) for r in tp.query(
        "select name, value from stats where value > 0 and severity = 'error'")]
    if bad:
      fail(f"trace_processor import errors: {bad}")
  print(f"trace_processor: {count} slices, no import error")


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("xplane")
  ap.add_argument("perfetto")
  ap.add_argument("--min-slices", type=int, default=1)
  ap.add_argument("--expect-flows", type=int, default=0, help="at least this many flows")
  ap.add_argument("--expect-counter-unit", default=None, help="a counter track with this unit must be there")
  ap.add_argument("--expect-overflow-lane", action="store_true")
  ap.add_argument("--min-samples", type=int, default=0, help="at least this many distinct CPU samples")
  ap.add_argument("--expect-annotation-stack", action="append", default=[],
                  help="some sample's outermost frames are these annotations (outer|inner)")
  ap.add_argument("--pprof", help="the run's cpu.<pid>.<comm>.prof: its counts by thread and stack must match")
  a = ap.parse_args()
  exp = expected_from_xplane(a.xplane)
  act = actual_from_perfetto(a.perfetto)
  diff("threads", exp["threads"], act["threads"])
  diff("slices", exp["slices"], act["slices"])
  diff("counter samples", exp["counters"], act["counters"])
  diff("flows", exp["flows"], act["flows"])
  diff("CPU samples", exp["samples"], act["samples"])  # keyed by plane name = process track name
  if a.pprof:  # the same samples, as the pprof profile counts them
    by_stack = collections.Counter()
    for (proc, tid, ts, stack), n in act["samples"].items():
      by_stack[(tid, tuple(f[0] for f in stack if f[3] != "annotation"))] += n
    diff("CPU samples by thread and stack (pprof)", pprof_samples(a.pprof), by_stack)
  for want in a.expect_annotation_stack:
    want = tuple(want.split("|"))
    seen = {tuple(f[0] for f in stack if f[3] == "annotation") for (_, _, _, stack) in act["samples"]}
    if want not in seen:
      fail(f"no sample under the annotations {want}; annotation stacks seen: {sorted(seen)}")
  if len(exp["samples"]) < a.min_samples:
    fail(f"only {sum(exp['samples'].values())} CPU samples, expected at least {a.min_samples}")
  for plane, os_pid in exp["pids"].items():
    pid = act["pids"].get(plane)
    if plane.startswith("/host:CPU"):
      if os_pid and pid != os_pid:
        fail(f"{plane}: pid {pid}, recorded as {os_pid}")
    elif pid is None or pid < DEVICE_PID_BASE:
      fail(f"{plane}: device pid {pid} could be a real process's")
  if act["lost"] != exp["lost"]:
    fail(f"packet loss {act['lost']}, the model dropped {exp['lost']}")
  n = sum(exp["slices"].values())
  if n < a.min_slices:
    fail(f"only {n} slices")
  if len(exp["flows"]) < a.expect_flows:
    fail(f"{len(exp['flows'])} flows, expected at least {a.expect_flows}")
  if a.expect_counter_unit and not any(k[2] == a.expect_counter_unit for k in act["counters"]):
    fail(f"no counter track in {a.expect_counter_unit}")
  if a.expect_overflow_lane and not act["lanes"]:
    fail("no overflow lane, though events overlap without nesting")
  check_with_trace_processor(a.perfetto, n, sum(exp["samples"].values()))
  print(f"OK: {n} slices, {len(exp['threads'])} threads, {sum(exp['counters'].values())} counter samples, "
        f"{len(exp['flows'])} flows, {sum(exp['samples'].values())} CPU samples match")


if __name__ == "__main__":
  main()
