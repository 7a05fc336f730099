// The summary as JSON and as text tables (SummaryToJson, SummaryToText).
#include <algorithm>
#include <cstdio>

#include "analysis/cpu_summary.h"
#include "analysis/json_writer.h"
#include "analysis/summary.h"
#include "analysis/text_table.h"

namespace spyglass::analysis {
namespace {

constexpr size_t kThreadTables = 4;
constexpr size_t kMaxJsonSteps = 10000;

void WriteDistribution(JsonWriter& j, const Distribution& d) {
  j.begin_object();
  j.field("count", d.count);
  j.field("total_ns", d.total_ns);
  j.field("mean_ns", d.mean_ns);
  j.field("stddev_ns", d.stddev_ns);
  j.field("min_ns", d.min_ns);
  j.field("p50_ns", d.p50_ns);
  j.field("p90_ns", d.p90_ns);
  j.field("p99_ns", d.p99_ns);
  j.field("max_ns", d.max_ns);
  j.end_object();
}

void WriteSteps(JsonWriter& j, const std::vector<Step>& steps, size_t stride = 1) {
  j.object_array(
      steps,
      [&](const Step& s) {
        j.field("number", s.number);
        j.field("start_ns", s.start_ns);
        j.field("duration_ns", s.duration_ns);
      },
      stride);
}

void WriteRows(JsonWriter& j, const std::vector<AnnotationRow>& rows) {
  j.object_array(rows, [&](const AnnotationRow& r) {
    j.field("name", r.name);
    j.field("thread", r.thread);
    j.field("count", r.count);
    j.field("total_ns", r.total_ns);
    j.field("self_ns", r.self_ns);
    j.field("mean_ns", r.mean_ns);
    j.field("share", r.share);
    j.field("self_share", r.self_share);
  });
}

void WriteOps(JsonWriter& j, const std::vector<DeviceOpRow>& rows) {
  j.object_array(rows, [&](const DeviceOpRow& r) {
    j.field("device", r.device);
    j.field("name", r.name);
    j.field("kind", r.kind);
    j.field("count", r.count);
    j.field("total_ns", r.total_ns);
    j.field("mean_ns", r.mean_ns);
    j.field("share", r.share);
  });
}

}  // namespace

void WriteSummaryJson(JsonWriter& j, const Summary& s, const CpuSummary* cpu) {
  j.begin_object();
  j.field("file", s.file);
  j.key("hostnames");
  j.array(s.hostnames);
  j.field("producer", s.producer);
  j.field("file_bytes", s.file_bytes);
  j.field("planes", s.planes);
  j.field("lines", s.lines);
  j.field("events", s.events);
  j.field("start_ns", s.start_ns);
  j.field("end_ns", s.end_ns);
  j.field("wall_ns", s.wall_ns);
  j.key("steps");
  j.begin_object();
  j.field("name", s.steps.name);
  j.key("duration");
  WriteDistribution(j, s.steps.duration);
  j.key("slowest");
  WriteSteps(j, s.steps.slowest);
  // Every step up to kMaxJsonSteps; beyond, every stride-th (a chart's worth).
  size_t stride = (s.steps.all.size() + kMaxJsonSteps - 1) / kMaxJsonSteps;
  stride = std::max<size_t>(stride, 1);
  j.field("all_stride", static_cast<uint64_t>(stride));
  j.key("all");
  WriteSteps(j, s.steps.all, stride);
  j.end_object();
  j.key("top_total");
  WriteRows(j, s.top_total);
  j.key("top_self");
  WriteRows(j, s.top_self);
  j.key("threads");
  j.object_array(s.threads, [&](const ThreadSummary& t) {
    j.field("plane", t.plane);
    j.field("name", t.name);
    j.field("id", t.id);
    j.field("events", t.events);
    j.field("busy_ns", t.busy_ns);
    j.field("busy_share", t.busy_share);
    j.key("top_total");
    WriteRows(j, t.top_total);
    j.key("top_self");
    WriteRows(j, t.top_self);
  });
  j.field("threads_left_out", s.threads_left_out);
  j.key("kernels");
  WriteOps(j, s.kernels);
  j.key("copies");
  WriteOps(j, s.copies);
  j.key("counters");
  j.object_array(s.counters, [&](const CounterPeak& c) {
    j.field("plane", c.plane);
    j.field("name", c.name);
    j.field("samples", c.samples);
    j.field("peak", c.peak);
    j.field("peak_at_ns", c.peak_at_ns);
    j.field("last", c.last);
    j.field("unit", c.bytes ? "bytes" : "");
  });
  j.key("dropped");
  j.object_array(s.dropped, [&](const Summary::Dropped& d) {
    j.field("plane", d.plane);
    j.field("name", d.name);
    j.field("value", d.value);
  });
  j.key("errors");
  j.array(s.errors);
  j.key("warnings");
  j.array(s.warnings);
  if (cpu != nullptr && cpu->samples > 0) {
    j.key("cpu");
    WriteCpuSummaryJson(j, *cpu);
  }
  j.end_object();
}

std::string SummaryToJson(const Summary& s, const CpuSummary* cpu) {
  JsonWriter j;
  WriteSummaryJson(j, s, cpu);
  return j.str() + "\n";
}

std::string SummaryToText(const Summary& s, size_t width) {
  std::string out;
  out += "Profile  " + Printable(s.file) + "\n";
  std::string about = "         " + (s.producer.empty() ? std::string("unknown writer") : Printable(s.producer));
  for (const std::string& h : s.hostnames) about += ", host " + Printable(h);
  about += ", " + std::to_string(s.events) + " events, wall " + FormatNs(s.wall_ns) + "\n";
  out += about;

  const Distribution& d = s.steps.duration;
  if (d.count) {
    out += "\nSteps\n";
    TextTable t({"step", "count", "mean", "p50", "p90", "p99", "max", "stddev"}, width);
    t.add({s.steps.name, std::to_string(d.count), FormatNs(d.mean_ns), FormatNs(d.p50_ns), FormatNs(d.p90_ns), FormatNs(d.p99_ns),
           FormatNs(d.max_ns), FormatNs(d.stddev_ns)});
    out += t.render();
    if (!s.steps.slowest.empty()) {
      out += "  slowest:";
      for (const Step& st : s.steps.slowest)
        out += " #" + std::to_string(st.number) + " " + FormatNs(st.duration_ns) + ";";
      out.back() = '\n';
    }
  } else {
    out += "\nSteps: none (no event with a step_num; mark steps with StepTraceAnnotation)\n";
  }

  auto annotations = [&](const std::vector<AnnotationRow>& rows, const std::string& title) {
    AddTable(out, title, {"annotation", "count", "total", "self", "mean", "% wall", "self %"}, width, rows,
             [](const AnnotationRow& r) -> std::vector<std::string> {
               return {r.name, std::to_string(r.count), FormatNs(r.total_ns), FormatNs(r.self_ns),
                       FormatNs(r.mean_ns), FormatPct(r.share), FormatPct(r.self_share)};
             });
  };
  annotations(s.top_total, "Top annotations by total time (all threads)");
  annotations(s.top_self, "Top annotations by self time (all threads)");

  AddTable(out, "Threads (busy = time inside any event)",
           {"thread", "id", "events", "busy", "% wall", "top by self time"}, width, s.threads,
           [](const ThreadSummary& th) -> std::vector<std::string> {
             return {th.name, std::to_string(th.id), std::to_string(th.events), FormatNs(th.busy_ns),
                     FormatPct(th.busy_share), th.top_self.empty() ? "" : th.top_self[0].name};
           });
  if (s.threads_left_out)
    out += "  (" + std::to_string(s.threads_left_out) + " more threads not shown; --top 0 shows all)\n";
  // The busiest few threads' own tables (all of them with --thread).
  size_t shown = 0;
  for (const ThreadSummary& th : s.threads)
    if (th.top_self.size() > 1 && shown++ < kThreadTables)
      annotations(th.top_self, "Top by self time in thread " + th.name + " (" + std::to_string(th.id) + ")");

  auto ops = [&](const std::vector<DeviceOpRow>& rows, const std::string& title) {
    AddTable(out, title, {"name", "device", "count", "total", "mean", "% wall"}, width, rows,
             [](const DeviceOpRow& r) -> std::vector<std::string> {
               return {r.name, r.device, std::to_string(r.count), FormatNs(r.total_ns), FormatNs(r.mean_ns),
                       FormatPct(r.share)};
             });
  };
  ops(s.kernels, "Top GPU kernels");
  ops(s.copies, "Top GPU copies");

  AddTable(out, "Counters (peaks)", {"counter", "samples", "peak", "at", "last"}, width, s.counters,
           [](const CounterPeak& c) -> std::vector<std::string> {
             return {c.name, std::to_string(c.samples), FormatValue(c.peak, c.bytes), FormatNs(c.peak_at_ns),
                     FormatValue(c.last, c.bytes)};
           });

  out += "\nDropped and warnings\n";
  bool any = false;
  for (const Summary::Dropped& dr : s.dropped) {
    out += "  " + Printable(dr.name) + (dr.plane.empty() ? "" : " (" + Printable(dr.plane) + ")") + ": " +
           std::to_string(dr.value) + "\n";
    any = true;
  }
  for (const std::string& e : s.errors) out += "  error: " + Clip(Printable(e), width - 9) + "\n", any = true;
  for (const std::string& w : s.warnings) out += "  warning: " + Clip(Printable(w), width - 11) + "\n", any = true;
  if (!any) out += "  none recorded\n";
  return PrintableLines(out);  // a net under the names made printable above
}

}  // namespace spyglass::analysis
