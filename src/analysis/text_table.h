// Text tables that fit a terminal width: the first column (a name) takes
// what the numbers leave and is clipped with "..."; numbers align right.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/utf8.h"

namespace spyglass::analysis {

// `s` safe to print on a terminal: a name from a profile must not move the
// cursor, set the title or write the clipboard. C0 controls (newline too),
// DEL, C1 controls (U+0080..U+009F), bidirectional overrides and bytes that
// are not UTF-8 show as '?', as in error messages (common/quote.h).
inline std::string Printable(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
      ++i;
      continue;
    }
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    uint32_t cp = n == 2 ? (c & 0x1fu) << 6 | (static_cast<unsigned char>(s[i + 1]) & 0x3fu)
                : n == 3 ? (c & 0x0fu) << 12 | (static_cast<unsigned char>(s[i + 1]) & 0x3fu) << 6 |
                               (static_cast<unsigned char>(s[i + 2]) & 0x3fu)
                         : 0x10000;
    bool control = cp < 0xa0 || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
    if (control) out += '?';
    else out.append(s.substr(i, n));
    i += n;
  }
  return out;
}

// Printable, line by line: the newlines of `text` stay.
inline std::string PrintableLines(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t start = 0; start < text.size();) {
    size_t nl = text.find('\n', start);
    size_t end = nl == std::string_view::npos ? text.size() : nl;
    out += Printable(text.substr(start, end - start));
    if (nl == std::string_view::npos) break;
    out += '\n';
    start = nl + 1;
  }
  return out;
}

// At most `n` bytes of `s`, ending in "..." when cut (never inside a UTF-8
// sequence).
inline std::string Clip(const std::string& s, size_t n) {
  if (s.size() <= n) return s;
  if (n <= 3) return s.substr(0, n);
  return std::string(Utf8Prefix(s, n - 3)) + "...";
}

// "1.23 ms", "456 ns", "12.0 s".
inline std::string FormatNs(double ns) {
  char buf[32];
  double a = std::fabs(ns);
  if (a < 1e3) std::snprintf(buf, sizeof(buf), "%.0f ns", ns);
  else if (a < 1e6) std::snprintf(buf, sizeof(buf), "%.2f us", ns / 1e3);
  else if (a < 1e9) std::snprintf(buf, sizeof(buf), "%.2f ms", ns / 1e6);
  else std::snprintf(buf, sizeof(buf), "%.2f s", ns / 1e9);
  return buf;
}

inline std::string FormatPct(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f%%", fraction * 100);
  return buf;
}

// A counter's value: bytes in binary units; anything else as a number
// (whole numbers in full, fractions to 4 significant digits: a PM metric's
// 0.35 must not show as 0).
inline std::string FormatValue(double v, bool bytes) {
  char buf[32];
  double a = std::fabs(v);
  if (bytes && a >= 1ull << 30) std::snprintf(buf, sizeof(buf), "%.2f GiB", v / double(1ull << 30));
  else if (bytes && a >= 1 << 20) std::snprintf(buf, sizeof(buf), "%.2f MiB", v / double(1 << 20));
  else if (bytes && a >= 1 << 10) std::snprintf(buf, sizeof(buf), "%.2f KiB", v / double(1 << 10));
  else if (bytes) std::snprintf(buf, sizeof(buf), "%.0f B", v);
  else if (v == std::floor(v) && a < 1e15) std::snprintf(buf, sizeof(buf), "%.0f", v);
  else std::snprintf(buf, sizeof(buf), "%.4g", v);
  return buf;
}

class TextTable {
 public:
  TextTable(std::vector<std::string> header, size_t width) : header_(std::move(header)), width_(width) {}
  void add(std::vector<std::string> row) {
    for (std::string& cell : row) cell = Printable(cell);
    for (size_t i = 1; i < row.size(); ++i) row[i] = Clip(row[i], kMaxCell);
    rows_.push_back(std::move(row));
  }
  std::string render() const {
    size_t n = header_.size();
    std::vector<size_t> w(n, 0);
    for (size_t i = 0; i < n; ++i) w[i] = header_[i].size();
    for (const auto& r : rows_)
      for (size_t i = 0; i < n && i < r.size(); ++i) w[i] = std::max(w[i], r[i].size());
    size_t rest = 2;  // indent
    for (size_t i = 1; i < n; ++i) rest += w[i] + 2;
    size_t first_max = width_ > rest + 12 ? width_ - rest : 12;
    w[0] = std::min(w[0], first_max);
    std::string out;
    auto line = [&](const std::vector<std::string>& r) {
      std::string l = "  ";
      for (size_t i = 0; i < n; ++i) {
        std::string cell = i < r.size() ? r[i] : "";
        if (i == 0) {
          cell = Clip(cell, w[0]);
          l += cell + std::string(w[0] - cell.size(), ' ');
        } else {
          l += "  " + std::string(w[i] - std::min(w[i], cell.size()), ' ') + cell;
        }
      }
      while (!l.empty() && l.back() == ' ') l.pop_back();
      out += l + "\n";
    };
    line(header_);
    for (const auto& r : rows_) line(r);
    return out;
  }

 private:
  static constexpr size_t kMaxCell = 28;
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
  size_t width_;
};

// "\n<title>\n" and a table of `rows`, whose cells `cells(row)` makes,
// appended to `out`; nothing when there are no rows.
template <typename Row, typename Cells>
void AddTable(std::string& out, const std::string& title, std::vector<std::string> header, size_t width,
              const std::vector<Row>& rows, Cells cells) {
  if (rows.empty()) return;
  out += "\n" + Printable(title) + "\n";
  TextTable t(std::move(header), width);
  for (const Row& r : rows) t.add(cells(r));
  out += t.render();
}

}  // namespace spyglass::analysis
