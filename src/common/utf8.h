// UTF-8 validation, the one rule for the whole project (the model's
// ValidUtf8, the JSON writer's escaping): shortest forms only, no UTF-16
// surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <string_view>

namespace spyglass {

// The length of the valid UTF-8 sequence starting at s[i], or 0 if the
// bytes there are not one.
inline size_t Utf8SequenceLength(std::string_view s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  const size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
  if (len == 0 || c >= 0xf5 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  // Overlong 3/4-byte forms and UTF-16 surrogates are invalid too.
  const unsigned char c1 = static_cast<unsigned char>(s[i + 1]);
  if ((c == 0xe0 && c1 < 0xa0) || (c == 0xed && c1 >= 0xa0) || (c == 0xf0 && c1 < 0x90) || (c == 0xf4 && c1 >= 0x90))
    return 0;
  return len;
}

}  // namespace spyglass
