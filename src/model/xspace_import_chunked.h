// Imports a serialized XSpace in pieces, so that the generated message tree
// (about 5x the wire size: an XEvent object is 72 bytes, its wire form ~15)
// exists for one piece at a time: peak memory is the bytes, the model and one
// piece, instead of the bytes, the whole tree and the model.
#pragma once

#include <string_view>

#include "model/xspace.h"
#include "spyglass/status.h"

namespace spyglass::model {

// Events parsed at a time (serialized bytes).
inline constexpr size_t kImportChunkBytes = size_t{8} << 20;

// The same model as ImportXSpaceBytes gives (metadata ids may be numbered in
// another order); InvalidArgument if the bytes do not parse as an XSpace.
Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out, size_t chunk_bytes = kImportChunkBytes);

}  // namespace spyglass::model
