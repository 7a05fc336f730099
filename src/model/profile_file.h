// Opening a profile file (<host>.xplane.pb), one way for every reader: the
// public ProfileReader (spyglass/profile_reader.h) and ReadXSpaceFile
// (model/xspace_read.h, the Python package's ProfileData.from_file). The file
// is mapped read-only, not copied (the summary drops the pages it has read,
// so that its memory does not grow with the file); errors name it with a
// bounded quote.
//
// A file that another process truncates while it is mapped would kill the
// reader with SIGBUS on the first page past the new end. The mapping is
// guarded: a SIGBUS inside it puts zero pages there instead, and marks it, so
// that the reader fails with "changed while it was read" (FileChanged). A
// SIGBUS anywhere else goes to the handler that was there before.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "spyglass/status.h"

namespace spyglass::model {

// A read-only, guarded mapping of a whole regular file; unmapped when destroyed.
class MappedFile {
 public:
  MappedFile() = default;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  // NotFound when `path` cannot be opened; InvalidArgument when it is not a
  // regular file (a FIFO, which would block the open for ever, a device, a
  // folder) or holds more than max_bytes. An empty file maps to no bytes.
  Status Open(const std::string& path, uint64_t max_bytes);
  std::string_view bytes() const { return {data_, size_}; }
  // Gives the mapping up: UnmapFile(bytes) is then the caller's.
  std::string_view Release();

 private:
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// Whether the file mapped at `mapped` shrank under its mapping (pages past
// its new end read as zeros).
bool FileChanged(std::string_view mapped);
// InvalidArgument: `path` changed while it was read.
Status FileChangedError(const std::string& path);
// Ends a mapping that MappedFile::Release gave up (and its guard).
void UnmapFile(std::string_view mapped);

// Whether `bytes` (of the file `path`) are a profile this version reads, at
// the top level: not gzip-compressed, an XSpace's fields only, and a format
// version (in /host:metadata) no newer than this one's. InvalidArgument
// worded for the user otherwise: not a profile, truncated, gzipped, newer.
Status CheckProfileBytes(std::string_view bytes, const std::string& path);

// "<what> is too large: N bytes exceed the limit of M bytes".
Status TooLarge(const std::string& what, uint64_t size, uint64_t max_bytes);

}  // namespace spyglass::model
