// int64 arithmetic that neither overflows nor is undefined: times read from
// a file or a peer can sit anywhere in int64 (far-future or hostile values).
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

// A line's ns timestamp in ps plus an event's ps offset, modulo 2^64 (not
// saturated): a file whose lines hold ns since the epoch passes int64 in ps,
// and wrapping keeps the differences between its events exact, which is
// what readers use (saturating made them all one time).
inline int64_t WrappedPs(int64_t timestamp_ns, int64_t offset_ps) {
  return static_cast<int64_t>(static_cast<uint64_t>(timestamp_ns) * 1000u + static_cast<uint64_t>(offset_ps));
}

}  // namespace spyglass
