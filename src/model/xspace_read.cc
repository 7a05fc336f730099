#include "model/xspace_read.h"

#include <fcntl.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "common/quote.h"
#include "model/xspace_import_chunked.h"
#include "xplane.pb.h"

namespace spyglass::model {
namespace {

Status TooLarge(const std::string& what, uint64_t size, size_t max_bytes) {
  return InvalidArgumentError(what + " is too large: " + std::to_string(size) + " bytes exceed the limit of " +
                              std::to_string(max_bytes) + " bytes");
}

// Keeps the first error of a text-format parse (protobuf would log them).
class FirstError : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (!message_.empty()) return;
    message_ = "line " + std::to_string(line + 1) + " column " + std::to_string(column + 1) + ": " +
               QuoteInput(message);
  }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

Status ParseText(std::string_view text, size_t max_bytes, tensorflow::profiler::XSpace* space) {
  if (text.size() > max_bytes) return TooLarge("the XSpace text", text.size(), max_bytes);
  google::protobuf::TextFormat::Parser parser;
  FirstError errors;
  parser.RecordErrorsTo(&errors);
  google::protobuf::io::ArrayInputStream in(text.data(), static_cast<int>(text.size()));
  if (!parser.Parse(&in, space))
    return InvalidArgumentError("the text is not an XSpace in the protobuf text format: " +
                                (errors.message().empty() ? std::string("parse error") : errors.message()));
  return Status::Ok();
}

}  // namespace

Status ReadXSpaceFile(const std::string& path, Space* out, size_t max_bytes) {
  const std::string quoted = QuoteInput(path);
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return NotFoundError("cannot open " + quoted + ": " + std::strerror(errno));
  struct stat st;
  std::string bytes;
  Status s;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    s = InvalidArgumentError("cannot read " + quoted + ": not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    s = TooLarge(quoted, static_cast<uint64_t>(st.st_size), max_bytes);
  } else {
    // Reads what is there: a file shrinking meanwhile gives fewer bytes
    // (then a parse error), one growing is read up to its size at fstat.
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        s = InvalidArgumentError("cannot read " + quoted + ": " + std::strerror(errno));
        break;
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    bytes.resize(done);
  }
  ::close(fd);
  if (!s.ok()) return s;
  if (Status r = ImportXSpaceBytesChunked(bytes, out); !r.ok())
    return InvalidArgumentError(quoted + " is not a profile: " + r.message() + " (truncated, or not a .xplane.pb)");
  return Status::Ok();
}

Status ReadXSpaceBytes(std::string_view bytes, Space* out, size_t max_bytes) {
  if (bytes.size() > max_bytes) return TooLarge("the XSpace", bytes.size(), max_bytes);
  if (Status s = ImportXSpaceBytesChunked(bytes, out); !s.ok())
    return InvalidArgumentError(s.message() + " (" + std::to_string(bytes.size()) + " bytes; truncated, or not a profile)");
  return Status::Ok();
}

Status ReadXSpaceText(std::string_view text, Space* out, size_t max_bytes) {
  tensorflow::profiler::XSpace space;
  if (Status s = ParseText(text, max_bytes, &space); !s.ok()) return s;
  ImportXSpace(space, out);
  return Status::Ok();
}

Status XSpaceTextToBytes(std::string_view text, std::string* bytes, size_t max_bytes) {
  tensorflow::profiler::XSpace space;
  if (Status s = ParseText(text, max_bytes, &space); !s.ok()) return s;
  if (!space.SerializeToString(bytes)) return InvalidArgumentError("the XSpace does not serialize (over 2 GiB)");
  return Status::Ok();
}

}  // namespace spyglass::model
