#include "model/profile_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/quote.h"

namespace spyglass::model {

Status TooLarge(const std::string& what, uint64_t size, uint64_t max_bytes) {
  return InvalidArgumentError(what + " is too large: " + std::to_string(size) + " bytes exceed the limit of " +
                              std::to_string(max_bytes) + " bytes");
}

MappedFile::~MappedFile() { Unmap(); }

void MappedFile::Unmap() {
  std::string_view m = Release();
  if (!m.empty()) munmap(const_cast<char*>(m.data()), m.size());
}

std::string_view MappedFile::Release() {
  std::string_view out = bytes();
  data_ = nullptr;
  size_ = 0;
  return out;
}

Status MappedFile::Open(const std::string& path, uint64_t max_bytes) {
  Unmap();
  const std::string quoted = QuoteInput(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFoundError("cannot open " + quoted + ": " + std::strerror(errno));
  struct stat st {};
  Status s;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    s = InvalidArgumentError(quoted + " is not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    s = TooLarge(quoted, static_cast<uint64_t>(st.st_size), max_bytes);
  } else if (st.st_size > 0) {
    void* m = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      s = InternalError("cannot map " + quoted + ": " + std::strerror(errno));
    } else {
      madvise(m, static_cast<size_t>(st.st_size), MADV_SEQUENTIAL);  // read front to back
      data_ = static_cast<const char*>(m);
      size_ = static_cast<size_t>(st.st_size);
    }
  }
  ::close(fd);
  return s;
}

}  // namespace spyglass::model
