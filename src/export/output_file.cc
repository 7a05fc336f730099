#include "export/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace spyglass::exporter {

Status WriteOutputFile(const std::string& path, const std::function<int(int fd)>& write) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return InternalError("cannot create " + path + ": " + std::strerror(errno));
  int err = write(fd);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err != 0) return InternalError("cannot write " + path + ": " + std::strerror(err));
  return Status::Ok();
}

}  // namespace spyglass::exporter
