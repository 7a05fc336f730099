// Imports a serialized XSpace without the generated message tree of its
// events (about 5x the wire size: an XEvent object is 72 bytes, its wire form
// ~15): planes and lines but their events are parsed by protobuf, events and
// their stats are decoded from the wire straight into the model. Peak memory
// is the bytes and the model; 2-3x faster than parsing the messages.
#pragma once

#include <functional>
#include <string_view>

#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::model {

// Kept for callers of the former piecewise import; no longer used.
inline constexpr size_t kImportChunkBytes = size_t{8} << 20;

// The same model as ImportXSpaceBytes gives (metadata ids may be numbered in
// another order); InvalidArgument if the bytes do not parse as an XSpace
// (whatever protobuf rejects). `chunk_bytes` is ignored.
Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out, size_t chunk_bytes = kImportChunkBytes);

// The same, telling `consumed` after each line how far into `bytes` it will
// not read again (increasing), so that the caller may release those pages.
// Strings that are not UTF-8 then fail the import (the plain form reads them
// with a second pass over the bytes): retry with the plain form.
Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out,
                                const std::function<void(const char* done_before)>& consumed);

}  // namespace spyglass::model
