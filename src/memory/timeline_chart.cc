#include "memory/timeline_chart.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <map>

#include "memory/pprof.h"

namespace spyglass::memory {
namespace {

std::string Duration(int64_t ns) {
  char buf[32];
  double v = static_cast<double>(ns);
  if (ns < 1000000)
    std::snprintf(buf, sizeof buf, "%.0f us", v / 1e3);
  else if (ns < 1000000000)
    std::snprintf(buf, sizeof buf, "%.1f ms", v / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.2f s", v / 1e9);
  return buf;
}

// Names from a file: control bytes shown as '?'.
std::string Printable(std::string s) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  return s;
}

std::string Pad(const std::string& s, size_t n, bool right) {
  if (s.size() >= n) return s;
  return right ? std::string(n - s.size(), ' ') + s : s + std::string(n - s.size(), ' ');
}

// The values of one series per column: each column the highest value of the
// points in its slice of [0, end]; a column without a point keeps the value
// of the last point before it (live bytes hold until they change).
std::vector<int64_t> Columns(const Timeline& t, size_t width, int64_t end_ns,
                             const std::function<int64_t(const TimelinePoint&)>& value,
                             const std::function<int64_t(const TimelinePoint&)>& carry) {
  std::vector<int64_t> col(width, -1);
  int64_t last = 0;
  size_t next = 0;
  for (const TimelinePoint& p : t.points) {
    size_t c = end_ns > 0 ? static_cast<size_t>(static_cast<double>(std::max<int64_t>(0, p.t_ns)) /
                                                static_cast<double>(end_ns) * static_cast<double>(width - 1) + 0.5)
                          : 0;
    c = std::min(c, width - 1);
    for (; next < c; ++next)
      if (col[next] < 0) col[next] = last;
    col[c] = std::max(col[c], value(p));
    last = carry(p);
    next = std::max(next, c + 1);
  }
  for (; next < width; ++next)
    if (col[next] < 0) col[next] = last;
  for (int64_t& v : col) v = std::max<int64_t>(v, 0);
  return col;
}

}  // namespace

std::string TimelineChart(const Timeline& t, const std::string& name, const TimelineChartOptions& options) {
  const size_t width = std::clamp<size_t>(options.width, 10, 400);
  const size_t height = std::clamp<size_t>(options.height, 2, 40);
  std::string out = "Live bytes over time in " + name + "\n";
  if (t.points.empty()) return out + "  (no points: the program allocated nothing while tracked)\n";
  const int64_t end_ns = std::max<int64_t>(t.points.back().t_ns, 1);
  out += "  " + std::to_string(t.points.size()) + " points over " + Duration(end_ns) + " (a point every " +
         Duration(t.interval_ns) + " at most, while the program allocates); one column = " +
         Duration(end_ns / static_cast<int64_t>(width)) + "\n";
  const std::string axis_end = Duration(end_ns);

  for (size_t d = 0; d < t.devices.size(); ++d) {
    auto live = [d](const TimelinePoint& p) { return d < p.live.size() ? p.live[d] : 0; };
    auto high = [d, &live](const TimelinePoint& p) { return std::max(live(p), d < p.max.size() ? p.max[d] : 0); };
    std::vector<int64_t> col = Columns(t, width, end_ns, high, live);
    int64_t top = *std::max_element(col.begin(), col.end());
    int64_t peak = d < t.peak_bytes.size() ? t.peak_bytes[d] : top;
    out += "\n" + Printable(t.devices[d]) + ": peak " + HumanBytes(std::max(peak, top)) + ", at the end " +
           HumanBytes(live(t.points.back())) + "\n";
    const std::string top_label = HumanBytes(top);
    const size_t label = std::max<size_t>(top_label.size(), 3);
    for (size_t r = height; r >= 1; --r) {
      std::string row = "  " + Pad(r == height ? top_label : "", label, true) + " |";
      for (int64_t v : col) {
        // Rows fill from the bottom: row r when v reaches r/height of the top (rounded up).
        size_t level = top > 0 ? static_cast<size_t>((static_cast<double>(v) * static_cast<double>(height) +
                                                      static_cast<double>(top) - 1) / static_cast<double>(top))
                               : 0;
        row += level >= r ? '#' : ' ';
      }
      while (!row.empty() && row.back() == ' ') row.pop_back();
      out += row + "\n";
    }
    out += "  " + Pad("0 B", label, true) + " +" + std::string(width, '-') + "\n";
    out += "  " + std::string(label, ' ') + "  0" + Pad(axis_end, width - 1, true) + "\n";
  }

  // The call sites that held most at any point, each scaled to its own
  // maximum. Sites with the same named stack (a loop unrolled into several
  // calls, say) are one line.
  std::map<uint32_t, std::string> key_of;
  for (const TimelineSite& s : t.sites)
    key_of[s.id] = Printable(s.stack.empty() ? "(no stack)" : s.stack) +
                   (t.devices.size() > 1 ? "  [" + Printable(s.device) + "]" : "");
  auto key = [&](uint32_t id) {
    auto it = key_of.find(id);
    return it != key_of.end() ? it->second : "(site " + std::to_string(id) + ")";
  };
  auto bytes_of = [&](const TimelinePoint& p, const std::string& k) {
    int64_t sum = 0;
    for (const auto& [id, b] : p.sites)
      if (key(id) == k) sum += b;
    return sum;
  };
  std::map<std::string, int64_t> key_max;
  for (const TimelinePoint& p : t.points) {
    std::map<std::string, int64_t> here;
    for (const auto& [id, b] : p.sites) here[key(id)] += b;
    for (const auto& [k, b] : here) key_max[k] = std::max(key_max[k], b);
  }
  std::vector<std::pair<int64_t, std::string>> order;
  for (const auto& [k, m] : key_max) order.push_back({m, k});
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (order.size() > options.top_sites) order.resize(options.top_sites);
  if (order.empty()) return out;
  static constexpr char kLevels[] = " .:-=+*#%@";
  out += "\nTop call sites over time (each line scaled to its own maximum: '" + std::string(kLevels) +
         "' = 0 to it; blank also where the site was not among a point's top sites):\n";
  for (const auto& [m, k] : order) {
    auto bytes = [&, k = k](const TimelinePoint& p) { return bytes_of(p, k); };
    std::vector<int64_t> col = Columns(t, width, end_ns, bytes, bytes);
    std::string line = "  |";
    for (int64_t v : col) line += kLevels[m > 0 ? std::min<int64_t>(9, (v * 9 + m - 1) / m) : 0];
    std::string where = k.size() > 100 ? k.substr(0, 97) + "..." : k;
    out += line + "|  max " + Pad(HumanBytes(m), 10, true) + "  " + where + "\n";
  }
  return out;
}

}  // namespace spyglass::memory
