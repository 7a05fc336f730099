// int64 arithmetic that saturates instead of overflowing: times read from a
// file or a peer can sit anywhere in int64 (far-future or hostile values).
#pragma once

#include <cstdint>

namespace spyglass {

inline int64_t SaturatedAdd(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_add_overflow(a, b, &r) ? (b < 0 ? INT64_MIN : INT64_MAX) : r;
}

inline int64_t SaturatedSub(int64_t a, int64_t b) {
  int64_t r;
  return __builtin_sub_overflow(a, b, &r) ? (b > 0 ? INT64_MIN : INT64_MAX) : r;
}

// A line's ns timestamp in ps plus an event's ps offset: where the event starts.
inline int64_t SaturatedPs(int64_t timestamp_ns, int64_t offset_ps) {
  int64_t base;
  if (__builtin_mul_overflow(timestamp_ns, int64_t{1000}, &base)) base = timestamp_ns < 0 ? INT64_MIN : INT64_MAX;
  return SaturatedAdd(base, offset_ps);
}

}  // namespace spyglass
