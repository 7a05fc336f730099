#include "export/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

namespace spyglass::exporter {
namespace {

// A name as quoted in errors: at most this many bytes of it.
constexpr size_t kQuotedNameBytes = 80;

std::string Quote(std::string_view name) {
  std::string q(name.substr(0, kQuotedNameBytes));
  for (char& c : q)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return "'" + q + (name.size() > kQuotedNameBytes ? "...'" : "'");
}

// Opens a directory by path (links followed); -1 with errno set on failure.
int OpenDirFd(const std::string& path) { return ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); }

// A fresh name for a file written (or linked) before it is renamed into place.
std::string TempName() {
  static std::atomic<uint64_t> counter{0};
  return ".spyglass-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1)) + ".tmp";
}

// InvalidArgument if `name` in `dir_fd` exists and is not a regular file
// (a symbolic link is not followed); `what` says what was being done.
Status RefuseNonRegular(int dir_fd, const std::string& name, const std::string& what) {
  struct stat st;
  if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode))
    return InvalidArgumentError("refusing to " + what + ": " + name + " exists and is " +
                                (S_ISLNK(st.st_mode) ? "a symbolic link" : "not a regular file"));
  return Status::Ok();
}

// Copies what is left to read of `in` to `out`; 0 or the errno of the failure.
int CopyAll(int in, int out) {
  std::string buffer(1 << 20, '\0');
  for (;;) {
    ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return 0;
    if (int e = WriteAll(out, std::string_view(buffer.data(), static_cast<size_t>(n))); e != 0) return e;
  }
}

}  // namespace

bool IsPlainComponent(std::string_view name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

int WriteAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return 0;
}

OutputDir::~OutputDir() {
  if (fd_ >= 0) ::close(fd_);
}

OutputDir::OutputDir(OutputDir&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }

OutputDir& OutputDir::operator=(OutputDir&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

Status OutputDir::Open(const std::string& path, OutputDir* dir) {
  if (path.empty()) return InvalidArgumentError("the output directory is empty");
  int fd = OpenDirFd(path);
  if (fd < 0) return InternalError("cannot open directory " + path + ": " + std::strerror(errno));
  *dir = OutputDir(fd, path);
  return Status::Ok();
}

Status OutputDir::OpenBelow(const std::string& base, const std::vector<std::string>& below, OutputDir* dir,
                            std::vector<std::string>* created) {
  if (base.empty()) return InvalidArgumentError("the output directory is empty");
  std::error_code ec;
  bool existed = std::filesystem::exists(base, ec);
  std::filesystem::create_directories(base, ec);
  if (ec) return InternalError("cannot create " + base + ": " + ec.message());
  if (!existed && created) created->push_back(base);
  OutputDir cur;
  if (Status s = Open(base, &cur); !s.ok()) return s;
  for (const std::string& name : below) {
    OutputDir next;
    if (Status s = cur.OpenSubdir(name, &next, created); !s.ok()) return s;
    cur = std::move(next);
  }
  *dir = std::move(cur);
  return Status::Ok();
}

Status OutputDir::Subdir(const std::string& name, bool must_be_new, OutputDir* sub,
                         std::vector<std::string>* created) const {
  if (!IsPlainComponent(name))
    return InvalidArgumentError("refusing to make directory " + Quote(name) + " in " + path_ + ": not a plain file name");
  std::string path = PathOf(name);
  bool made = ::mkdirat(fd_, name.c_str(), 0755) == 0;
  if (!made && errno != EEXIST) return InternalError("cannot create directory " + path + ": " + std::strerror(errno));
  if (!made && must_be_new) return AlreadyExistsError(path + " exists");
  int fd = ::openat(fd_, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return e == ELOOP || e == ENOTDIR
               ? InvalidArgumentError("refusing to write through " + path + ": it is a symbolic link or not a directory")
               : InternalError("cannot open directory " + path + ": " + std::strerror(e));
  }
  if (made && created) created->push_back(path);
  *sub = OutputDir(fd, std::move(path));
  return Status::Ok();
}

Status OutputDir::Write(const std::string& name, const std::function<int(int fd)>& write) const {
  if (fd_ < 0) return InternalError("cannot write " + Quote(name) + ": the output directory is not open");
  if (!IsPlainComponent(name))
    return InvalidArgumentError("refusing to write " + Quote(name) + " in " + path_ + ": not a plain file name");
  std::string path = PathOf(name);
  // A clear error for what is already there; the rename below never writes
  // through a link even when one appears after this check.
  if (Status s = RefuseNonRegular(fd_, name, "write " + path); !s.ok()) return s;
  std::string tmp;
  int fd = -1;
  for (int i = 0; i < 100 && fd < 0; ++i) {
    tmp = TempName();
    fd = ::openat(fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return InternalError("cannot create " + path + ": " + std::strerror(errno));
  int err = write(fd);
  if (::close(fd) != 0 && err == 0) err = errno;
  if (err == 0 && ::renameat(fd_, tmp.c_str(), fd_, name.c_str()) != 0) err = errno;
  if (err != 0) {
    ::unlinkat(fd_, tmp.c_str(), 0);
    return InternalError("cannot write " + path + ": " + std::strerror(err));
  }
  return Status::Ok();
}

Status OutputDir::LinkOrCopy(const std::string& existing, const std::string& name) const {
  if (fd_ < 0) return InternalError("cannot write " + Quote(name) + ": the output directory is not open");
  if (!IsPlainComponent(existing) || !IsPlainComponent(name))
    return InvalidArgumentError("refusing to link " + Quote(name) + " to " + Quote(existing) + " in " + path_ +
                                ": not plain file names");
  const std::string what = "link " + PathOf(name) + " to " + existing;
  struct stat st;
  if (::fstatat(fd_, existing.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
    return InternalError("cannot " + what + ": " + std::strerror(errno));
  if (Status s = RefuseNonRegular(fd_, existing, what); !s.ok()) return s;
  if (Status s = RefuseNonRegular(fd_, name, what); !s.ok()) return s;
  // linkat without AT_SYMLINK_FOLLOW links `existing` itself, never a link's
  // target; the new name is made fresh, then renamed over whatever is there.
  std::string tmp;
  int err = EEXIST;
  for (int i = 0; i < 100 && err == EEXIST; ++i) {
    tmp = TempName();
    err = ::linkat(fd_, existing.c_str(), fd_, tmp.c_str(), 0) == 0 ? 0 : errno;
  }
  if (err == 0) {
    err = ::renameat(fd_, tmp.c_str(), fd_, name.c_str()) == 0 ? 0 : errno;
    // A rename onto another name of the same file leaves both names: the
    // temporary one goes either way.
    ::unlinkat(fd_, tmp.c_str(), 0);
    if (err != 0) return InternalError("cannot " + what + ": " + std::strerror(err));
    return Status::Ok();
  }
  // No hard links here (another file system's rules, a link count limit):
  // the same bytes, copied.
  int in = ::openat(fd_, existing.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (in < 0) return InternalError("cannot " + what + ": " + std::strerror(errno));
  Status s = Write(name, [in](int out) { return CopyAll(in, out); });
  ::close(in);
  return s;
}

Status OutputDir::WriteBytes(const std::string& name, std::string_view bytes) const {
  return Write(name, [bytes](int fd) { return WriteAll(fd, bytes); });
}

Status WriteOutputFile(const std::string& path, const std::function<int(int fd)>& write) {
  size_t slash = path.rfind('/');
  std::string dir_path = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (!IsPlainComponent(name))
    return InvalidArgumentError("refusing to write " + Quote(path) + ": it does not end in a plain file name");
  int fd = OpenDirFd(dir_path);
  if (fd < 0) return InternalError("cannot create " + path + ": " + std::strerror(errno));
  return OutputDir(fd, dir_path).Write(name, write);
}

Status WriteOutputBytes(const std::string& path, std::string_view bytes) {
  return WriteOutputFile(path, [bytes](int fd) { return WriteAll(fd, bytes); });
}

}  // namespace spyglass::exporter
