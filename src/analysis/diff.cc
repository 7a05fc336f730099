#include "analysis/diff.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "analysis/json_writer.h"
#include "common/quote.h"
#include "analysis/text_table.h"

namespace spyglass::analysis {
namespace {

DiffRow Row(std::string name, std::string kind, uint64_t bc, double b, uint64_t nc, double n, double noise_pct) {
  DiffRow r;
  r.name = std::move(name);
  r.kind = std::move(kind);
  r.base_count = bc, r.new_count = nc;
  r.base_ns = b, r.new_ns = n;
  r.delta_ns = n - b;
  r.delta_pct = b > 0 ? (n - b) / b * 100 : (n > 0 ? 100 : 0);
  r.within_noise = noise_pct >= 0 && std::fabs(r.delta_pct) <= 2 * noise_pct;
  return r;
}

// Rows of two tables matched by name, biggest absolute change first; each
// run's values divided by its `per` (its step count, or 1).
template <typename T, typename Value>
std::vector<DiffRow> Match(const std::vector<T>& base, const std::vector<T>& next, const char* kind, Value value,
                           double base_per, double new_per, double noise_pct) {
  struct Sides {
    uint64_t base_count = 0, new_count = 0;
    double base = 0, next = 0;
  };
  std::map<std::string, Sides> by_name;  // summed over devices, for kernels
  for (const T& r : base) by_name[r.name].base_count += r.count, by_name[r.name].base += value(r) / base_per;
  for (const T& r : next) by_name[r.name].new_count += r.count, by_name[r.name].next += value(r) / new_per;
  std::vector<DiffRow> out;
  for (const auto& [name, s] : by_name)
    out.push_back(Row(name, kind, s.base_count, s.base, s.new_count, s.next, noise_pct));
  std::stable_sort(out.begin(), out.end(),
                   [](const DiffRow& a, const DiffRow& b) {
                     double x = std::fabs(a.delta_ns), y = std::fabs(b.delta_ns);
                     // Ties (a parent grows with its child): the bigger relative change first.
                     return x != y ? x > y : std::fabs(a.delta_pct) > std::fabs(b.delta_pct);
                   });
  return out;
}

std::string Pct(double p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%+.1f%%", p);
  return buf;
}

std::string Signed(double ns) { return (ns >= 0 ? "+" : "-") + FormatNs(std::fabs(ns)); }

void WriteRows(JsonWriter& j, const std::vector<DiffRow>& rows) {
  j.object_array(rows, [&](const DiffRow& r) {
    j.field("name", r.name);
    j.field("kind", r.kind);
    j.field("base_count", r.base_count);
    j.field("new_count", r.new_count);
    j.field("base_ns", r.base_ns);
    j.field("new_ns", r.new_ns);
    j.field("delta_ns", r.delta_ns);
    j.field("delta_pct", r.delta_pct);
    j.field("within_noise", r.within_noise);
    if (r.kind == "counter") j.field("unit", r.bytes ? "bytes" : "");
  });
}

}  // namespace

Diff CompareSummaries(Summary base, Summary next, const DiffOptions& options) {
  Diff d;
  const Distribution& b = base.steps.duration;
  const Distribution& n = next.steps.duration;
  if (b.count > 1 && n.count > 1 && b.mean_ns > 0 && n.mean_ns > 0) {
    double se_b = b.stddev_ns / std::sqrt(static_cast<double>(b.count)) / b.mean_ns;
    double se_n = n.stddev_ns / std::sqrt(static_cast<double>(n.count)) / n.mean_ns;
    d.noise_pct = 100 * std::sqrt(se_b * se_b + se_n * se_n);
  }
  d.per_step = b.count > 0 && n.count > 0;
  if (b.count || n.count) {
    for (auto [name, pb, pn] : {std::tuple{"step mean", b.mean_ns, n.mean_ns}, std::tuple{"step p50", b.p50_ns, n.p50_ns},
                                std::tuple{"step p90", b.p90_ns, n.p90_ns}, std::tuple{"step p99", b.p99_ns, n.p99_ns},
                                std::tuple{"step max", b.max_ns, n.max_ns}})
      d.steps.push_back(Row(name, "step", b.count, pb, n.count, pn, d.noise_pct));
  }
  // Per step in each run: the same work over more steps is no regression.
  double bp = d.per_step ? static_cast<double>(b.count) : 1, np = d.per_step ? static_cast<double>(n.count) : 1;
  auto total = [](const auto& r) { return r.total_ns; };
  d.annotations = Match(base.top_total, next.top_total, "annotation", total, bp, np, d.noise_pct);
  d.self = Match(base.top_self, next.top_self, "self", [](const AnnotationRow& r) { return r.self_ns; }, bp, np,
                 d.noise_pct);
  d.kernels = Match(base.kernels, next.kernels, "kernel", total, bp, np, d.noise_pct);
  d.copies = Match(base.copies, next.copies, "copy", total, bp, np, d.noise_pct);
  {
    std::map<std::string, std::pair<const CounterPeak*, const CounterPeak*>> by_name;
    for (const CounterPeak& c : base.counters) by_name[c.name].first = &c;
    for (const CounterPeak& c : next.counters) by_name[c.name].second = &c;
    for (const auto& [name, p] : by_name) {
      d.counters.push_back(Row(name, "counter", p.first ? p.first->samples : 0, p.first ? p.first->peak : 0,
                               p.second ? p.second->samples : 0, p.second ? p.second->peak : 0, -1));
      d.counters.back().bytes = (p.first ? p.first : p.second)->bytes;
    }
  }

  if (options.fail_above_pct >= 0) {
    char buf[256];
    if (!d.steps.empty()) {
      const DiffRow& mean = d.steps[0];
      if (mean.delta_pct > options.fail_above_pct) {
        std::snprintf(buf, sizeof(buf), "step time regressed %+.1f%% (mean %s -> %s), above %.1f%%", mean.delta_pct,
                      FormatNs(mean.base_ns).c_str(), FormatNs(mean.new_ns).c_str(), options.fail_above_pct);
        d.failures.push_back(buf);
      }
    } else if (options.annotations.empty()) {
      d.gate_error = true;
      d.failures.push_back("nothing to gate on: neither run has steps; name an --annotation");
    }
    for (const std::string& a : options.annotations) {
      auto it = std::find_if(d.annotations.begin(), d.annotations.end(), [&](const DiffRow& r) { return r.name == a; });
      if (it == d.annotations.end()) {
        d.gate_error = true;
        d.failures.push_back("annotation " + QuoteInput(a) + " is in neither run");
        continue;
      }
      if (it->new_count == 0) {
        // Gone (renamed, or no longer run): nothing left to measure it by.
        d.gate_error = true;
        d.failures.push_back("annotation '" + a.substr(0, 96) + "' is not in the new run (" +
                             std::to_string(it->base_count) + " in the base)");
        continue;
      }
      if (it->delta_pct > options.fail_above_pct) {
        std::snprintf(buf, sizeof(buf), "%+.1f%% (%s -> %s%s), above %.1f%%", it->delta_pct,
                      FormatNs(it->base_ns).c_str(), FormatNs(it->new_ns).c_str(), d.per_step ? " per step" : "",
                      options.fail_above_pct);
        d.failures.push_back("annotation " + QuoteInput(a) + " regressed " + buf);
      }
    }
  }
  size_t top = options.top == 0 ? SIZE_MAX : options.top;
  for (auto* v : {&d.annotations, &d.self, &d.kernels, &d.copies})
    if (v->size() > top) v->resize(top);
  d.base = std::move(base);
  d.next = std::move(next);
  return d;
}

Status DiffRuns(const std::string& base, const std::string& next, const DiffOptions& options, Diff* out) {
  SummaryOptions so = options.summary;
  so.top = 0;
  Summary b, n;
  if (Status s = Summarize(base, so, &b); !s.ok()) return s;
  if (Status s = Summarize(next, so, &n); !s.ok()) return s;
  *out = CompareSummaries(std::move(b), std::move(n), options);
  // The summaries keep the top rows only, like `summary`.
  size_t top = options.summary.top == 0 ? SIZE_MAX : options.summary.top;
  for (Summary* s : {&out->base, &out->next}) {
    for (auto* v : {&s->top_total, &s->top_self})
      if (v->size() > top) v->resize(top);
    for (ThreadSummary& t : s->threads)
      for (auto* v : {&t.top_total, &t.top_self})
        if (v->size() > top) v->resize(top);
    for (auto* v : {&s->kernels, &s->copies})
      if (v->size() > top) v->resize(top);
  }
  // CPU time by function, where a run was sampled (a run whose samples
  // cannot be read has none, as in `summary`).
  if (!out->base.cpu_samples || !SummarizeCpu(base, 0, &out->cpu_base).ok()) out->cpu_base = CpuSummary{};
  if (!out->next.cpu_samples || !SummarizeCpu(next, 0, &out->cpu_next).ok()) out->cpu_next = CpuSummary{};
  out->cpu = CompareCpu(out->cpu_base, out->cpu_next, options.top);
  for (CpuSummary* c : {&out->cpu_base, &out->cpu_next}) {
    std::vector<CpuScope*> scopes{&c->all};
    for (CpuScope& sc : c->threads) scopes.push_back(&sc);
    for (CpuScope& sc : c->steps) scopes.push_back(&sc);
    for (CpuScope* sc : scopes)
      for (auto* v : {&sc->top_self, &sc->top_total})
        if (v->size() > top) v->resize(top);
  }
  return Status::Ok();
}

std::string DiffToJson(const Diff& d) {
  JsonWriter j;
  j.begin_object();
  j.field("per_step", d.per_step);
  j.field("noise_pct", d.noise_pct);
  j.key("steps");
  WriteRows(j, d.steps);
  j.key("annotations");
  WriteRows(j, d.annotations);
  j.key("self");
  WriteRows(j, d.self);
  j.key("kernels");
  WriteRows(j, d.kernels);
  j.key("copies");
  WriteRows(j, d.copies);
  j.key("counters");
  WriteRows(j, d.counters);
  j.key("failures");
  j.array(d.failures);
  j.field("passed", d.failures.empty());
  if (d.cpu_base.samples > 0 || d.cpu_next.samples > 0) {
    j.key("cpu");
    WriteCpuDiffJson(j, d.cpu_base, d.cpu_next, d.cpu);
  }
  j.key("base");
  WriteSummaryJson(j, d.base, &d.cpu_base);  // "cpu" as `summary --json` has it, with samples
  j.key("new");
  WriteSummaryJson(j, d.next, &d.cpu_next);
  j.end_object();
  return j.str() + "\n";
}

std::string DiffToText(const Diff& d, size_t width) {
  std::string out;
  out += "Base  " + Printable(d.base.file) + " (" +
         (d.base.producer.empty() ? "unknown writer" : Printable(d.base.producer)) + ", " +
         std::to_string(d.base.steps.duration.count) + " steps)\n";
  out += "New   " + Printable(d.next.file) + " (" +
         (d.next.producer.empty() ? "unknown writer" : Printable(d.next.producer)) + ", " +
         std::to_string(d.next.steps.duration.count) + " steps)\n";
  if (d.noise_pct >= 0) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "Noise: +-%.1f%% (standard error of the mean step time, both runs); '~' marks changes within 2x "
                  "that\n",
                  d.noise_pct);
    out += buf;
  } else {
    out += "Noise: unknown (needs two or more steps in each run)\n";
  }
  auto table = [&](const std::vector<DiffRow>& rows, const std::string& title) {
    AddTable(out, title, {"name", "base", "new", "delta", "delta %", ""}, width, rows,
             [](const DiffRow& r) -> std::vector<std::string> {
               return {r.name, r.base_count ? FormatNs(r.base_ns) : "-", r.new_count ? FormatNs(r.new_ns) : "-",
                       Signed(r.delta_ns), Pct(r.delta_pct), r.within_noise ? "~" : ""};
             });
  };
  const char* unit = d.per_step ? " (time per step)" : " (total time)";
  table(d.steps, "Steps");
  table(d.annotations, std::string("Annotations by total time, biggest change first") + unit);
  table(d.self, std::string("Annotations by self time, biggest change first") + unit);
  table(d.kernels, std::string("GPU kernels") + unit);
  table(d.copies, std::string("GPU copies") + unit);
  AddTable(out, "Counter peaks", {"name", "base", "new", "delta", "delta %"}, width, d.counters,
           [](const DiffRow& r) -> std::vector<std::string> {
             return {r.name, r.base_count ? FormatValue(r.base_ns, r.bytes) : "-",
                     r.new_count ? FormatValue(r.new_ns, r.bytes) : "-",
                     (r.delta_ns >= 0 ? "+" : "-") + FormatValue(std::fabs(r.delta_ns), r.bytes), Pct(r.delta_pct)};
           });
  if (!d.failures.empty()) {
    out += "\nFAILED:\n";
    for (const std::string& f : d.failures) out += "  " + Printable(f) + "\n";
  }
  return PrintableLines(out);  // a net under the names made printable above
}

}  // namespace spyglass::analysis
