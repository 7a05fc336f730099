// Quoting untrusted input (a request's path, id or key) in an error message:
// a bounded, printable prefix, so that a megabyte-long field gives a short
// error instead of echoing itself (gRPC then fails on the metadata size).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "common/utf8.h"

namespace spyglass {

// Most bytes of an input quoted in a message.
inline constexpr size_t kQuotedInputBytes = 96;

// 'value' when it is short; else 'first bytes...' (N bytes). Control bytes
// show as '?'; a cut never splits a UTF-8 sequence.
inline std::string QuoteInput(std::string_view s) {
  bool cut = s.size() > kQuotedInputBytes;
  size_t n = Utf8Prefix(s, kQuotedInputBytes).size();
  std::string out = "'";
  for (size_t i = 0; i < n; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    out += c < 0x20 || c == 0x7f ? '?' : static_cast<char>(c);
  }
  out += cut ? "...' (" + std::to_string(s.size()) + " bytes)" : "'";
  return out;
}

}  // namespace spyglass
