// Reading a profile into the model from what a user hands over: a
// <host>.xplane.pb file, serialized XSpace bytes, or the XSpace text format.
// Bounded (max_bytes of input), and every failure is a Status naming the
// input with a bounded quote (common/quote.h), never a crash: not found, not
// a regular file, too large, truncated or not an XSpace.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "model/xspace.h"
#include "model/xspace_import.h"
#include "spyglass/status.h"

namespace spyglass::model {

// Reads `path` (a serialized XSpace) and imports it in pieces
// (xspace_import_chunked.h): the peak is the file's bytes, the model and one
// piece. NotFound if it cannot be opened, InvalidArgument otherwise; `out` is
// unchanged on error.
Status ReadXSpaceFile(const std::string& path, Space* out, size_t max_bytes = kDefaultMaxXSpaceBytes);

// The same for bytes already in memory.
Status ReadXSpaceBytes(std::string_view bytes, Space* out, size_t max_bytes = kDefaultMaxXSpaceBytes);

// The protobuf text format of an XSpace ("planes { name: ... }"), strictly:
// InvalidArgument with the first error's line and column.
Status ReadXSpaceText(std::string_view text, Space* out, size_t max_bytes = kDefaultMaxXSpaceBytes);
Status XSpaceTextToBytes(std::string_view text, std::string* bytes, size_t max_bytes = kDefaultMaxXSpaceBytes);

}  // namespace spyglass::model
