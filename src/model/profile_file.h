// Opening a profile file (<host>.xplane.pb), one way for every reader: the
// public ProfileReader (spyglass/profile_reader.h) and ReadXSpaceFile
// (model/xspace_read.h, the Python package's ProfileData.from_file). The file
// is mapped read-only, not copied; errors name it with a bounded quote.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "spyglass/status.h"

namespace spyglass::model {

// A read-only mapping of a whole regular file; unmapped when destroyed.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // NotFound when `path` cannot be opened; InvalidArgument when it is not a
  // regular file or holds more than max_bytes. An empty file maps to no bytes.
  Status Open(const std::string& path, uint64_t max_bytes);
  std::string_view bytes() const { return {data_, size_}; }
  // Gives the mapping up: munmap(data, size) is then the caller's.
  std::string_view Release();

 private:
  void Unmap();

  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Whether `bytes` (of the file `path`) are a profile this version reads, at
// the top level: not gzip-compressed, an XSpace's fields only, and a format
// version (in /host:metadata) no newer than this one's. InvalidArgument
// worded for the user otherwise: not a profile, truncated, gzipped, newer.
Status CheckProfileBytes(std::string_view bytes, const std::string& path);

// "<what> is too large: N bytes exceed the limit of M bytes".
Status TooLarge(const std::string& what, uint64_t size, uint64_t max_bytes);

}  // namespace spyglass::model
