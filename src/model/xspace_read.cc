#include "model/xspace_read.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include "common/quote.h"
#include "model/profile_file.h"
#include "model/xspace_import_chunked.h"
#include "xplane.pb.h"

namespace spyglass::model {
namespace {

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
  MappedFile file;
  if (Status s = file.Open(path, max_bytes); !s.ok()) return s;
  Status s = CheckProfileBytes(file.bytes(), path);
  // Imported into a copy: `out` stays as it was if the file changed meanwhile.
  Space read;
  if (s.ok() && !(s = ImportXSpaceBytesChunked(file.bytes(), &read)).ok())
    s = InvalidArgumentError(QuoteInput(path) + " is not a profile: " + s.message() +
                             " (truncated, or not a .xplane.pb)");
  if (FileChanged(file.bytes())) return FileChangedError(path);
  if (!s.ok()) return s;
  for (Plane& p : read.planes) out->planes.push_back(std::move(p));
  for (auto [from, to] : {std::pair{&read.errors, &out->errors}, std::pair{&read.warnings, &out->warnings},
                          std::pair{&read.hostnames, &out->hostnames}})
    to->insert(to->end(), from->begin(), from->end());
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
