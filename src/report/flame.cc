#include "report/flame.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <tuple>
#include <set>
#include <unordered_map>

#include "common/utf8.h"
#include "memory/call_site.h"

namespace spyglass::report {
namespace {

int64_t SatAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? INT64_MAX : r;
}

struct Node {
  uint32_t name;
  int64_t value = 0;
  std::map<uint32_t, uint32_t> children;  // name id -> node: stable, sorted order
};

std::string Label(const memory::PprofSample& s) {
  auto get = [&](std::string_view k) {
    auto it = s.labels.find(k);
    return it == s.labels.end() ? std::string("-") : std::string(it->second);
  };
  return get("device") + " " + get("kind");
}

bool EndsWith(std::string_view s, std::string_view end) {
  return s.size() >= end.size() && s.substr(s.size() - end.size()) == end;
}

bool IsPythonFrame(const memory::PprofFrame& f) { return memory::IsPythonFrame(f.file); }

std::string Capped(std::string_view s) {
  if (s.size() <= kMaxFlameNameLength) return std::string(s);
  return std::string(Utf8Prefix(s, kMaxFlameNameLength)) + "...";
}

// The page's stacks: distinct ones merged, the largest kept.
void AddStacks(const memory::PprofProfile& p, int index, int count_index, bool by_label, FlameGraph* g) {
  // CPU: stacks of different threads or annotations stay apart.
  std::map<std::string, uint32_t> thread_ids, annotation_ids;
  auto group = [](std::map<std::string, uint32_t>& m, std::vector<std::string>& names, const memory::PprofSample& s,
                  std::string_view key) {
    auto it = s.labels.find(key);
    std::string v = it == s.labels.end() ? std::string() : Capped(it->second);
    auto [at, added] = m.emplace(v, static_cast<uint32_t>(names.size()));
    if (added) names.push_back(v);
    return at->second;
  };
  std::map<std::tuple<std::string, std::string, int64_t, int>, uint32_t> frame_ids;
  auto frame = [&](std::string_view fn, std::string_view file, int64_t line, int kind) {
    auto key = std::make_tuple(Capped(fn), Capped(file), line, kind);
    auto [it, added] = frame_ids.emplace(key, static_cast<uint32_t>(g->frames.size()));
    if (added) {
      FlameFrame f;
      f.function = std::get<0>(key).empty() ? "<unknown>" : std::get<0>(key);
      f.file = std::get<1>(key);
      f.line = line;
      f.python = kind == 1;
      f.interpreter = kind == 2;
      f.label = kind == 3;
      g->frames.push_back(std::move(f));
    }
    return it->second;
  };
  struct Stack {
    int64_t value = 0, count = 0;
  };
  using Key = std::pair<std::pair<uint32_t, uint32_t>, std::vector<uint32_t>>;  // ((thread, annotation), frames)
  std::map<Key, Stack> stacks;
  std::vector<uint32_t> ids;
  for (const memory::PprofSample& s : p.samples) {
    int64_t v = index < static_cast<int>(s.values.size()) ? std::max<int64_t>(s.values[index], 0) : 0;
    int64_t c = count_index >= 0 && count_index < static_cast<int>(s.values.size()) ? s.values[count_index] : 0;
    ids.clear();
    if (by_label) ids.push_back(frame("[" + Label(s) + "]", "", 0, 3));
    const bool python_stack = std::any_of(s.frames.begin(), s.frames.end(), IsPythonFrame);
    size_t first = s.frames.size() > kMaxFlameStackDepth ? s.frames.size() - kMaxFlameStackDepth : 0;
    for (size_t k = s.frames.size(); k-- > first;) {
      const memory::PprofFrame& f = s.frames[k];
      // Only in a Python program's stack is a C frame the interpreter's.
      int kind = IsPythonFrame(f) ? (IsInterpreterFrame(f) ? 2 : 1) : (python_stack && IsInterpreterFrame(f) ? 2 : 0);
      ids.push_back(frame(f.function, f.file, f.line, kind));
    }
    std::pair<uint32_t, uint32_t> where{0, 0};
    if (g->cpu)
      where = {group(thread_ids, g->threads, s, "thread"), group(annotation_ids, g->annotations, s, "annotation")};
    Stack& st = stacks[Key{where, ids}];
    st.value = SatAdd(st.value, v);
    st.count = SatAdd(st.count, std::max<int64_t>(c, 0));
  }
  std::vector<const std::pair<const Key, Stack>*> order;
  for (const auto& e : stacks) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->second.value > b->second.value; });
  for (size_t i = 0; i < order.size(); ++i) {
    if (i >= kMaxFlameStacks) {
      ++g->hidden_stacks;
      g->hidden_value = SatAdd(g->hidden_value, order[i]->second.value);
      continue;
    }
    const std::vector<uint32_t>& frames = order[i]->first.second;
    g->stack_frames.insert(g->stack_frames.end(), frames.begin(), frames.end());
    g->stack_sizes.push_back(static_cast<uint32_t>(frames.size()));
    if (g->cpu) {
      g->stack_thread.push_back(order[i]->first.first.first);
      g->stack_annotation.push_back(order[i]->first.first.second);
    }
    g->stack_values.push_back(order[i]->second.value);
    g->stack_counts.push_back(order[i]->second.count);
  }
}

}  // namespace

bool IsInterpreterFrame(const memory::PprofFrame& f) {
  // Python code that starts or imports the program.
  for (std::string_view file : {"<frozen runpy>", "<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>",
                                "<frozen zipimport>"})
    if (f.file == file) return true;
  for (std::string_view file : {"/runpy.py", "/importlib/_bootstrap.py", "/importlib/_bootstrap_external.py"})
    if (EndsWith(f.file, file)) return true;
  if (memory::IsPythonFrame(f.file)) return false;
  // CPython's C: the eval loop and the calls that link one Python frame to
  // the next, and the startup below the first one.
  for (std::string_view prefix : {"_PyEval_", "PyEval_", "_PyFunction_Vectorcall", "PyObject_Vectorcall", "_PyObject_Vectorcall",
                                  "_PyObject_Call", "PyObject_Call", "_PyObject_MakeTpCall", "method_vectorcall", "cfunction_",
                                  "builtin_exec", "run_mod", "run_eval_code_obj", "pyrun_", "_PyRun_", "PyRun_", "pymain_",
                                  "Py_RunMain", "Py_BytesMain", "Py_Main", "slot_tp_", "vectorcall_", "_start", "__libc_start"})
    if (f.function.rfind(prefix, 0) == 0) return true;
  return f.function == "main" && f.file.empty();
}

namespace {

FlameGraph Build(const memory::PprofProfile& p, const std::string& title, const FlameOptions& options, int index,
                 int count_index, std::string unit, bool cpu) {
  FlameGraph g;
  g.title = title;
  g.unit = std::move(unit);
  g.cpu = cpu;
  std::unordered_map<std::string, uint32_t> ids;
  auto intern = [&](const std::string& n) {
    auto [it, added] = ids.emplace(n, static_cast<uint32_t>(g.names.size()));
    if (added) g.names.push_back(n);
    return it->second;
  };
  std::vector<Node> nodes{Node{intern("all"), 0, {}}};
  // Several devices or kinds (cpu heap, gpu...): one subtree each.
  std::set<std::string> labels;
  for (const memory::PprofSample& s : p.samples) labels.insert(Label(s));
  const bool by_label = labels.size() > 1;
  std::map<std::string, FlameSite> sites;
  for (const memory::PprofSample& s : p.samples) {
    int64_t v = index < static_cast<int>(s.values.size()) ? s.values[index] : 0;
    if (v < 0) {
      ++g.negative_samples;
      v = 0;
    }
    int64_t c = count_index >= 0 && count_index < static_cast<int>(s.values.size()) ? s.values[count_index] : 0;
    FlameSite& site = sites[memory::CallSite(s)];
    site.value = SatAdd(site.value, v);
    site.count = SatAdd(site.count, std::max<int64_t>(c, 0));
    uint32_t at = 0;
    nodes[0].value = SatAdd(nodes[0].value, v);
    auto step = [&](const std::string& name) {
      uint32_t id = intern(name);
      auto it = nodes[at].children.find(id);
      uint32_t child;
      if (it == nodes[at].children.end()) {
        child = static_cast<uint32_t>(nodes.size());
        nodes[at].children.emplace(id, child);
        nodes.push_back(Node{id, 0, {}});
      } else {
        child = it->second;
      }
      nodes[child].value = SatAdd(nodes[child].value, v);
      at = child;
    };
    if (by_label) step("[" + Label(s) + "]");
    const bool fold = options.fold_interpreter && std::any_of(s.frames.begin(), s.frames.end(), [](const auto& f) {
                        return memory::IsPythonFrame(f.file);
                      });
    for (auto f = s.frames.rbegin(); f != s.frames.rend(); ++f) {
      // The innermost frame stays: it is where the bytes were allocated.
      if (fold && f + 1 != s.frames.rend() && IsInterpreterFrame(*f)) {
        ++g.folded_frames;
        continue;
      }
      step(f->function.empty() ? std::string("<unknown>") : std::string(f->function));
    }
  }
  g.total = nodes[0].value;
  const int64_t min_value = static_cast<int64_t>(static_cast<double>(g.total) * kFlameMinShare);
  // Preorder walk, without recursion (stacks can be thousands deep).
  std::vector<std::pair<uint32_t, uint32_t>> todo{{0, 0}};  // (node, depth)
  while (!todo.empty()) {
    auto [n, depth] = todo.back();
    todo.pop_back();
    g.node_name.push_back(nodes[n].name);
    g.node_depth.push_back(depth);
    g.node_value.push_back(nodes[n].value);
    // Largest child first (pushed last).
    std::vector<uint32_t> kids;
    for (const auto& [id, child] : nodes[n].children)
      if (nodes[child].value > min_value) kids.push_back(child);
    std::stable_sort(kids.begin(), kids.end(), [&](uint32_t a, uint32_t b) { return nodes[a].value < nodes[b].value; });
    for (uint32_t k : kids) todo.emplace_back(k, depth + 1);
  }
  for (auto& [name, site] : sites) {
    site.site = name;
    g.top_sites.push_back(site);
  }
  std::stable_sort(g.top_sites.begin(), g.top_sites.end(),
                   [](const FlameSite& a, const FlameSite& b) { return a.value > b.value; });
  if (g.top_sites.size() > kFlameTopSites) g.top_sites.resize(kFlameTopSites);
  // Allocation sites mean nothing for CPU time.
  if (cpu) g.top_sites.clear();
  g.fold = options.fold_interpreter;
  AddStacks(p, index, count_index, by_label, &g);
  return g;
}

}  // namespace

FlameGraph BuildFlameGraph(const memory::PprofProfile& p, const std::string& title, const FlameOptions& options) {
  int index = p.bytes_index >= 0 ? p.bytes_index : p.count_index >= 0 ? p.count_index : 0;
  return Build(p, title, options, index, p.count_index, p.bytes_index >= 0 ? "bytes" : "count", false);
}

FlameGraph BuildCpuFlameGraph(const memory::PprofProfile& p, const std::string& title, const FlameOptions& options) {
  int index = -1, count = -1;
  for (size_t i = 0; i < p.sample_types.size(); ++i) {
    if (p.sample_types[i].second == "nanoseconds") index = static_cast<int>(i);
    if (p.sample_types[i].first == "samples") count = static_cast<int>(i);
  }
  if (index < 0) return Build(p, title, options, count >= 0 ? count : 0, count, "count", true);
  return Build(p, title, options, index, count, "nanoseconds", true);
}

}  // namespace spyglass::report
