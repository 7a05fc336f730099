// The one way this project creates files. Every output (exporter files, the
// server's and the client's profile files, tool data, memory profiles) is
// created inside a directory opened once as a descriptor, under a plain name
// (one path component), never through a symbolic link, and written under a
// temporary name that is renamed into place only when the whole write
// succeeded: a failed write leaves no truncated file, and a link or a hard
// link planted at the name is never written through.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::exporter {

class OutputDir {
 public:
  OutputDir() = default;
  ~OutputDir();
  OutputDir(OutputDir&& o) noexcept;
  OutputDir& operator=(OutputDir&& o) noexcept;
  OutputDir(const OutputDir&) = delete;
  OutputDir& operator=(const OutputDir&) = delete;

  // Opens the existing directory `path`. Symbolic links in `path` are
  // followed: the caller chose it.
  static Status Open(const std::string& path, OutputDir* dir);

  // Opens `base` (made with its parents if missing; links in it followed, as
  // in Open), then each name of `below` in turn: a plain component, made if
  // missing, refused (InvalidArgument) if it is a symbolic link or not a
  // directory. `*created` (optional) receives the paths this call made.
  static Status OpenBelow(const std::string& base, const std::vector<std::string>& below, OutputDir* dir,
                          std::vector<std::string>* created = nullptr);

  // Opens subdirectory `name` (plain), made if missing (then its path is
  // appended to `*created`, if given); InvalidArgument if it is a symbolic
  // link or not a directory.
  Status OpenSubdir(const std::string& name, OutputDir* sub, std::vector<std::string>* created = nullptr) const {
    return Subdir(name, /*must_be_new=*/false, sub, created);
  }

  // Makes the new subdirectory `name` (plain) and opens it, as OpenSubdir;
  // AlreadyExists if something is there already.
  Status MakeSubdir(const std::string& name, OutputDir* sub, std::vector<std::string>* created = nullptr) const {
    return Subdir(name, /*must_be_new=*/true, sub, created);
  }

  // Creates or replaces the regular file `name` (a plain component) with what
  // `write(fd)` writes; `write` returns 0 or the errno of its failure.
  // InvalidArgument if `name` is not plain or is a symbolic link or not a
  // regular file; Internal "cannot create/write <path>: <why>" on I/O errors.
  Status Write(const std::string& name, const std::function<int(int fd)>& write) const;
  Status WriteBytes(const std::string& name, std::string_view bytes) const;

  // Makes `name` a second name of the regular file `existing` (both plain, in
  // this directory): a hard link made under a temporary name and renamed into
  // place, so the bytes are written once. Refuses (InvalidArgument) a symbolic
  // link or non-regular file at either name, as Write; a regular file at
  // `name` is replaced, never written through. Where the file system refuses
  // hard links (EXDEV, EPERM, EMLINK, ENOTSUP...), the bytes are copied
  // through Write instead.
  Status LinkOrCopy(const std::string& existing, const std::string& name) const;

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  std::string PathOf(const std::string& name) const { return path_ == "/" ? "/" + name : path_ + "/" + name; }

 private:
  friend Status WriteOutputFile(const std::string& path, const std::function<int(int fd)>& write);
  OutputDir(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  Status Subdir(const std::string& name, bool must_be_new, OutputDir* sub, std::vector<std::string>* created) const;
  int fd_ = -1;
  std::string path_;
};

// Whether `name` is a plain file name: not empty, no '/', not "." or "..", no NUL.
bool IsPlainComponent(std::string_view name);

// `path` as <dir>/<name>: opens <dir> (OutputDir::Open) and writes <name> as
// OutputDir::Write does.
Status WriteOutputFile(const std::string& path, const std::function<int(int fd)>& write);
Status WriteOutputBytes(const std::string& path, std::string_view bytes);

// Writes all of `bytes` to `fd`; 0 or the errno of the failure.
int WriteAll(int fd, std::string_view bytes);

}  // namespace spyglass::exporter
