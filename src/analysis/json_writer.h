// A small JSON text builder for the analysis output (objects, arrays, numbers,
// strings): commas and escaping in one place.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

namespace spyglass::analysis {

class JsonWriter {
 public:
  void begin_object() { value_prefix(), out_ += '{', first_ = true; }
  void end_object() { out_ += '}', first_ = false; }
  void begin_array() { value_prefix(), out_ += '[', first_ = true; }
  void end_array() { out_ += ']', first_ = false; }
  void key(std::string_view k) {
    if (!first_) out_ += ',';
    string_literal(k);
    out_ += ':';
    after_key_ = true;
  }
  void value(std::string_view s) { value_prefix(), string_literal(s); }
  void value(const char* s) { value(std::string_view(s)); }
  void value(const std::string& s) { value(std::string_view(s)); }
  void value(double v) {
    value_prefix();
    if (!std::isfinite(v)) {
      out_ += "null";
      return;
    }
    char buf[64];
    // Integral values print as integers; others in the shortest form that
    // reads back the same.
    if (v == std::floor(v) && std::fabs(v) < 9e15) {
      std::snprintf(buf, sizeof(buf), "%.0f", v);
      out_ += buf;
      return;
    }
    auto r = std::to_chars(buf, buf + sizeof(buf), v);
    out_.append(buf, r.ptr);
  }
  void value(uint64_t v) { value_prefix(), out_ += std::to_string(v); }
  void value(int64_t v) { value_prefix(), out_ += std::to_string(v); }
  void value(bool v) { value_prefix(), out_ += v ? "true" : "false"; }
  template <typename T>
  void field(std::string_view k, const T& v) {
    key(k);
    value(v);
  }
  // An array of the values of `items`.
  template <typename T>
  void array(const std::vector<T>& items) {
    begin_array();
    for (const T& v : items) value(v);
    end_array();
  }
  // An array of objects, one for every `stride`-th item, whose fields
  // `fields(item)` writes.
  template <typename T, typename Fields>
  void object_array(const std::vector<T>& items, Fields fields, size_t stride = 1) {
    begin_array();
    for (size_t i = 0; i < items.size(); i += stride) {
      begin_object();
      fields(items[i]);
      end_object();
    }
    end_array();
  }
  const std::string& str() const { return out_; }

 private:
  void value_prefix() {
    if (!after_key_ && !first_) out_ += ',';
    after_key_ = false;
    first_ = false;
  }
  void string_literal(std::string_view s) {
    out_ += '"';
    for (unsigned char c : s) {
      if (c == '"' || c == '\\') out_ += '\\', out_ += static_cast<char>(c);
      else if (c < 0x20) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\u%04x", c);
        out_ += buf;
      } else {
        out_ += static_cast<char>(c);
      }
    }
    out_ += '"';
  }
  std::string out_;
  bool first_ = true, after_key_ = false;
};

}  // namespace spyglass::analysis
