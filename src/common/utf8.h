// UTF-8 validation, the one rule for the whole project (the model's
// ValidUtf8, the JSON writer's escaping): shortest forms only, no UTF-16
// surrogates, nothing above U+10FFFF.
#pragma once

#include <cstddef>
#include <string>
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

// The longest start of `s` of at most `max` bytes that does not end inside a
// UTF-8 character: a cut at a character boundary (`s` whole when it fits).
inline std::string_view Utf8Prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t n = max;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

// What a cut name shows after its kept start: how many bytes were left out.
inline std::string CutNote(size_t left_out) { return "...(+" + std::to_string(left_out) + " bytes)"; }

// `s` cut at a character boundary to at most `max` bytes, with the note of
// what was left out; `s` whole when it fits. A capped name is bounded
// whatever the input (a megabyte name on every event is neither kept nor
// shown whole).
inline std::string Utf8Capped(std::string_view s, size_t max) {
  std::string_view kept = Utf8Prefix(s, max);
  if (kept.size() == s.size()) return std::string(s);
  return std::string(kept) + CutNote(s.size() - kept.size());
}

}  // namespace spyglass
