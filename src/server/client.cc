#include "server/client.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <grpcpp/support/proto_buffer_reader.h>

#include "export/export.h"
#include "export/log_dir.h"
#include "export/trace_json/trace_json_writer.h"
#include "model/xspace_import_chunked.h"
#include "profiler_service.grpc.pb.h"
#include "server/merge.h"
#include "server/options_convert.h"
#include "server/path_policy.h"
#include "server/rpc_util.h"
#include "common/clock.h"

namespace spyglass::server {
namespace {

namespace fs = std::filesystem;

constexpr char kProfileMethod[] = "/tensorflow.ProfilerService/Profile";
// Skipped tool_data entries described one by one per host; the rest counted.
constexpr size_t kToolWarningsPerHost = 4;
// Bytes of a server-sent name quoted in a warning.
constexpr size_t kQuotedBytes = 64;

std::string Quote(const std::string& s) {
  std::string q = s.substr(0, kQuotedBytes);
  for (char& c : q)
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  return "'" + q + (s.size() > kQuotedBytes ? "...'" : "'");
}

// Waits until the channel is connected; fails fast when the connection is
// refused, and at the deadline when nothing answers.
Status Connect(grpc::Channel* channel, const std::string& address, int timeout_ms) {
  auto deadline = AfterMs(timeout_ms);
  grpc_connectivity_state s = channel->GetState(true);
  while (s != GRPC_CHANNEL_READY) {
    if (s == GRPC_CHANNEL_TRANSIENT_FAILURE || s == GRPC_CHANNEL_SHUTDOWN)
      return UnavailableError("cannot connect to " + address +
                              ": the connection failed (nothing listens on that port, or it is not a gRPC server)");
    if (!channel->WaitForStateChange(s, deadline))
      return DeadlineExceededError("cannot connect to " + address + " within " + std::to_string(timeout_ms) +
                                   " ms (the host does not answer)");
    s = channel->GetState(true);
  }
  return Status::Ok();
}

struct HostCall {
  std::string address;
  std::string stem;
  tensorflow::ProfileResponseBytes response;
  Status status;
};

// Reads the reply's slices in order, giving each back as soon as it is read:
// the copy of a large field never sits beside the whole reply.
class SliceReader {
 public:
  explicit SliceReader(std::vector<grpc::Slice> slices) : slices_(std::move(slices)) {
    for (const grpc::Slice& s : slices_) left_ += s.size();
  }
  uint64_t left() const { return left_; }
  bool Byte(uint8_t* b) {
    if (!Settle()) return false;
    *b = slices_[i_].begin()[at_++];
    --left_;
    return true;
  }
  bool Varint(uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      uint8_t b;
      if (!Byte(&b)) return false;
      *v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  }
  // Appends the next n bytes to out (n <= left()).
  bool CopyTo(std::string* out, uint64_t n) {
    if (n > left_) return false;
    while (n > 0) {
      if (!Settle()) return false;
      const size_t take = std::min<uint64_t>(n, slices_[i_].size() - at_);
      out->append(reinterpret_cast<const char*>(slices_[i_].begin()) + at_, take);
      at_ += take, left_ -= take, n -= take;
    }
    return true;
  }

 private:
  // Moves past used-up slices, releasing them. False at the end.
  bool Settle() {
    while (i_ < slices_.size() && at_ == slices_[i_].size()) {
      slices_[i_] = grpc::Slice();
      ++i_, at_ = 0;
    }
    return i_ < slices_.size();
  }
  std::vector<grpc::Slice> slices_;
  size_t i_ = 0, at_ = 0;
  uint64_t left_ = 0;
};

void PutVarint(std::string* out, uint64_t v) {
  for (; v >= 0x80; v >>= 7) out->push_back(static_cast<char>(v | 0x80));
  out->push_back(static_cast<char>(v));
}

// ProfileResponse's field 8, the XSpace: its bytes, copied once.
constexpr uint64_t kXSpaceField = 8;

// Decodes a reply (its buffer is emptied): the XSpace is copied into a string
// of its exact size while the slices it came in are released, and the other
// fields (small: tool data, empty_trace) are parsed by protobuf. protobuf's
// own parser grows a large bytes field by appending, which held the slices,
// the old string and the doubled one at once (3.3-3.6x the reply).
bool DecodeReply(grpc::ByteBuffer* reply, tensorflow::ProfileResponseBytes* out) {
  std::vector<grpc::Slice> slices;
  if (!reply->Dump(&slices).ok()) return false;
  reply->Clear();
  SliceReader r(std::move(slices));
  std::string rest, xspace;
  bool has_xspace = false;
  while (r.left() > 0) {
    uint64_t tag, v;
    if (!r.Varint(&tag)) return false;
    const uint64_t field = tag >> 3, type = tag & 7;
    if (field == 0) return false;
    if (type == 2) {
      if (!r.Varint(&v) || v > r.left()) return false;
      if (field == kXSpaceField) {
        // Repeated occurrences of a message field merge: their bytes concatenate.
        xspace.reserve(xspace.size() + v);
        if (!r.CopyTo(&xspace, v)) return false;
        has_xspace = true;
        continue;
      }
      PutVarint(&rest, tag);
      PutVarint(&rest, v);
      if (!r.CopyTo(&rest, v)) return false;
    } else if (type == 0) {
      if (!r.Varint(&v)) return false;
      PutVarint(&rest, tag);
      PutVarint(&rest, v);
    } else if (type == 1 || type == 5) {
      PutVarint(&rest, tag);
      if (!r.CopyTo(&rest, type == 1 ? 8 : 4)) return false;
    } else {
      return false;  // groups: not in this message
    }
  }
  if (!out->ParseFromString(rest)) return false;
  if (has_xspace) out->mutable_xspace()->swap(xspace);
  return true;
}

// The reply is received as raw bytes and decoded into ProfileResponseBytes,
// whose XSpace stays one string: the peak is about the reply, where a
// generated XSpace tree costs many times its wire size.
void CallOne(HostCall* call, const tensorflow::ProfileRequest& request, const CaptureOptions& options) {
  auto channel = MakeChannel(call->address, static_cast<int>(options.max_reply_bytes));
  if (Status s = Connect(channel.get(), call->address, options.connect_timeout_ms); !s.ok()) {
    call->status = s;
    return;
  }
  grpc::ClientContext ctx;
  // As the reference client: max(60 s, 2 x duration) + delay.
  int64_t budget = std::max<int64_t>(60000, 2 * static_cast<int64_t>(options.duration_ms)) +
                   static_cast<int64_t>(options.delay_ms);
  ctx.set_deadline(AfterMs(budget));
  grpc::ByteBuffer reply;
  grpc::Status g = RawUnaryCall(&ctx, channel, kProfileMethod, request.SerializeAsString(), &reply);
  if (g.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
      g.error_message().find("larger than max") != std::string::npos) {
    call->status = FailedPreconditionError(
        "the reply from " + call->address + " is over the limit of " + std::to_string(options.max_reply_bytes) +
        " bytes (raise it with spyglass collect --max_reply_mb, or CaptureOptions::max_reply_bytes): " +
        g.error_message());
    return;
  }
  if (!g.ok()) {
    call->status = FromGrpc(g, call->address);
    return;
  }
  if (!reply.Valid()) {
    call->status = InternalError(call->address +
                                 " ended the call without a reply (a broken server, or not a profiler server)");
    return;
  }
  size_t size = reply.Length();
  const bool parsed = DecodeReply(&reply, &call->response);
  if (!parsed)
    call->status = InternalError(call->address + " answered with " + std::to_string(size) +
                                 " bytes that are not a profiler reply (tensorflow.ProfileResponse): a broken "
                                 "server, or not a profiler server");
}

// Gives the pages of a large string's buffer back to the system as a reader
// moves past them (MADV_DONTNEED on whole pages strictly inside it: the
// allocator's own words, before and after, are untouched). What was given
// back reads as zeros: for bytes that are not read again.
class PageReleaser {
 public:
  explicit PageReleaser(std::string* s) : s_(s), from_(Up(s->data())) {}
  void Before(const char* p) {
    if (s_->size() < kMinBytes || p < s_->data() || p > s_->data() + s_->size()) return;
    const uintptr_t to = reinterpret_cast<uintptr_t>(p) & ~(kPage - 1);
    if (to >= from_ + kStep) {
      ::madvise(reinterpret_cast<void*>(from_), to - from_, MADV_DONTNEED);
      from_ = to;
    }
  }

 private:
  static constexpr uintptr_t kPage = 4096, kStep = uintptr_t{1} << 20;  // a call per MiB at most
  static constexpr size_t kMinBytes = size_t{4} << 20;
  static uintptr_t Up(const char* p) { return (reinterpret_cast<uintptr_t>(p) + kPage - 1) & ~(kPage - 1); }
  std::string* s_;
  uintptr_t from_;
};

// The .xplane.pb an older server on this machine wrote into the run dir (no
// emit_xspace), read without following a link and up to `max` bytes.
Status ReadLocalXPlane(const exporter::OutputDir& dir, const std::string& name, uint64_t max, std::string* bytes) {
  std::string path = dir.PathOf(name);
  int fd = ::openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return NotFoundError("cannot read " + path + ": " + std::strerror(errno));
  struct stat st;
  Status s;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    s = InvalidArgumentError("refusing to read " + path + ": not a regular file");
  } else if (static_cast<uint64_t>(st.st_size) > max) {
    s = FailedPreconditionError(path + " is over the reply limit of " + std::to_string(max) + " bytes");
  } else {
    bytes->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes->size()) {
      ssize_t n = ::read(fd, bytes->data() + done, bytes->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    bytes->resize(done);
  }
  ::close(fd);
  return s;
}

bool IsToolNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-';
}

// Writes the tool files a server returned as <stem>.<name>, within the
// bounds of client.h; `taken` holds every name of this run dir already
// written or reserved for our own outputs.
void WriteToolFiles(const HostCall& c, const exporter::OutputDir& dir, std::set<std::string>* taken,
                    std::vector<std::string>* warnings) {
  size_t files = 0, bytes = 0, skipped = 0;
  auto skip = [&](const std::string& why) {
    if (skipped++ < kToolWarningsPerHost) warnings->push_back(c.address + ": skipped tool data " + why);
  };
  for (const auto& tool : c.response.tool_data()) {
    const std::string& n = tool.name();
    if (n.empty() || n.size() > kMaxToolNameBytes || n[0] == '.' || !std::all_of(n.begin(), n.end(), IsToolNameChar)) {
      skip(Quote(n) + ": a name must be 1 to " + std::to_string(kMaxToolNameBytes) +
           " letters, digits, '.', '_' or '-', not starting with '.'");
      continue;
    }
    std::string file = c.stem + "." + n;
    if (taken->count(file)) {
      skip(Quote(n) + ": " + file + " is another output of this capture");
      continue;
    }
    if (files == kMaxToolFiles) {
      skip(Quote(n) + ": more than " + std::to_string(kMaxToolFiles) + " tool files");
      continue;
    }
    if (tool.data().size() > kMaxToolBytes - bytes) {
      skip(Quote(n) + ": over " + std::to_string(kMaxToolBytes) + " bytes of tool data in all");
      continue;
    }
    if (Status s = dir.WriteBytes(file, tool.data()); !s.ok()) {
      skip(Quote(n) + ": " + s.message());
      continue;
    }
    taken->insert(file);
    ++files;
    bytes += tool.data().size();
  }
  if (skipped > kToolWarningsPerHost)
    warnings->push_back(c.address + ": skipped " + std::to_string(skipped - kToolWarningsPerHost) +
                        " more tool data entries");
}

int64_t ProcessIdOf(const model::Space& space) {
  if (const model::Plane* host = space.find_plane(model::kHostPlaneName))
    for (const model::Stat& s : host->stats)
      if (host->stat_name(s) == model::kProcessIdStat) return s.kind == model::StatKind::kUint64 ? static_cast<int64_t>(s.u64) : s.i64;
  return 0;
}

Status CheckOptions(const std::vector<std::string>& addresses, const CaptureOptions& options,
                    const std::string& log_dir) {
  if (addresses.empty()) return InvalidArgumentError("no address to capture");
  for (const std::string& a : addresses)
    if (Status s = CheckAddress(a); !s.ok()) return s;
  if (options.duration_ms == 0) return InvalidArgumentError("the duration must be greater than 0 ms");
  if (options.duration_ms > options.max_duration_ms)
    return InvalidArgumentError("the duration " + std::to_string(options.duration_ms) + " ms is over the limit of " +
                                std::to_string(options.max_duration_ms) + " ms");
  if (options.delay_ms > options.max_delay_ms)
    return InvalidArgumentError("the delay " + std::to_string(options.delay_ms) + " ms is over the limit of " +
                                std::to_string(options.max_delay_ms) + " ms");
  // Keeps the start time and the call deadline far from overflowing.
  constexpr uint64_t kLongestMs = 30ull * 24 * 3600 * 1000;
  if (options.max_duration_ms > kLongestMs || options.max_delay_ms > kLongestMs)
    return InvalidArgumentError("max_duration_ms and max_delay_ms must be at most 30 days");
  if (options.max_reply_bytes == 0 || options.max_reply_bytes > static_cast<uint64_t>(INT_MAX))
    return InvalidArgumentError("max_reply_bytes must be 1 to " + std::to_string(INT_MAX) + " (gRPC's limit), not " +
                                std::to_string(options.max_reply_bytes));
  if (!options.override_hostnames.empty() && options.override_hostnames.size() != addresses.size())
    return InvalidArgumentError("override_hostnames must name one host per address (" +
                                std::to_string(addresses.size()) + ")");
  if (log_dir.empty()) return InvalidArgumentError("log_dir is empty");
  return profiler::ValidateOptions(options.profile);
}

Status CaptureInto(std::vector<HostCall>& calls, const CaptureOptions& options, const std::string& abs_log_dir,
                   const exporter::RunDir& run, CaptureResult* result) {
  const exporter::OutputDir& dir = run.dir;
  std::string session_id = fs::path(dir.path()).filename().string();
  profiler::ProfileOptions opts = options.profile;
  opts.duration_ms = options.duration_ms;
  opts.repository_path = abs_log_dir;
  opts.session_id = session_id;
  opts.start_timestamp_ns = internal::wall_ns() + options.delay_ms * 1000000ull;
  opts.advanced_configuration.erase("override_hostnames");

  auto fr = opts.advanced_configuration.find("spyglass_flight_recorder");
  bool flight_recorder = fr != opts.advanced_configuration.end() && fr->second.is_bool() && fr->second.as_bool();
  if (options.log && flight_recorder)
    *options.log << "Fetching the flight recorder's ring from " << calls.size()
                 << (calls.size() == 1 ? " server" : " servers") << "." << std::endl;
  else if (options.log)
    *options.log << "Starting to trace for " << options.duration_ms << " ms from " << calls.size()
                 << (calls.size() == 1 ? " server" : " servers") << "." << std::endl;
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) {
    tensorflow::ProfileRequest req;
    req.set_duration_ms(options.duration_ms);
    req.set_max_events(1000000);
    req.add_tools("xplane.pb");
    *req.mutable_opts() = ToProto(opts);
    if (!options.override_hostnames.empty()) {
      (*req.mutable_opts()->mutable_advanced_configuration())["override_hostname"].set_string_value(
          options.override_hostnames[i]);
    }
    req.set_repository_root(abs_log_dir + "/plugins/profile");
    req.set_session_id(session_id);
    req.set_host_name(calls[i].address);
    req.set_emit_xspace(true);
    threads.emplace_back([&calls, &options, i, req = std::move(req)] { CallOne(&calls[i], req, options); });
  }
  for (auto& t : threads) t.join();

  // Our own outputs: no tool file may take their names.
  std::set<std::string> taken = {exporter::FileNameOf(exporter::Format::kPerfettoTraceJson, "")};
  for (const HostCall& c : calls)
    taken.insert({exporter::FileNameOf(exporter::Format::kXPlane, c.stem),
                  exporter::FileNameOf(exporter::Format::kTraceJson, c.stem)});

  // Write what came back, host by host.
  std::vector<model::Space> spaces;
  int captured = 0;  // hosts that sent a non-empty trace
  std::vector<std::string> failures;
  for (HostCall& c : calls) {
    CaptureHostResult host;
    host.address = c.address;
    std::string xplane = exporter::FileNameOf(exporter::Format::kXPlane, c.stem);
    std::string bytes;
    if (c.status.ok()) {
      if (c.response.has_xspace()) {
        bytes.swap(*c.response.mutable_xspace());
      } else if (Status s = ReadLocalXPlane(dir, xplane, options.max_reply_bytes, &bytes); !s.ok()) {
        c.status = s.code() == StatusCode::kNotFound
                       ? UnavailableError(c.address + " returned no XSpace and wrote no " + dir.PathOf(xplane) +
                                          " (a server on another machine that does not support emit_xspace)")
                       : s;
      }
    }
    if (c.status.ok() && c.response.empty_trace()) {
      host.empty = true;
      result->warnings.push_back("No trace event is collected from " + c.address);
    }
    // The .xplane.pb is written as received (nothing serialized again), then
    // the events are decoded from the wire into the model while the pages
    // of the bytes already read are given back: the peak is about the
    // model, not the bytes beside it. A reply that does not parse leaves no
    // file: the one written is removed.
    model::Space space;
    exporter::ExportedFiles files;
    const bool as_received = c.status.ok() && c.response.has_xspace();
    if (as_received) {
      exporter::ExportRequest request{{exporter::Format::kXPlane}, c.stem, bytes};
      if (Status s = exporter::Export(space, dir, request, &files); !s.ok()) c.status = s;
    }
    if (c.status.ok()) {
      Status s;
      if (as_received) {
        PageReleaser release(&bytes);
        s = model::ImportXSpaceBytesChunked(bytes, &space, [&](const char* p) { release.Before(p); });
        // Once more from the file written, the bytes whole (the import's
        // second pass for strings that are not UTF-8 reads them again).
        if (!s.ok() && ReadLocalXPlane(dir, xplane, options.max_reply_bytes, &bytes).ok())
          s = model::ImportXSpaceBytesChunked(bytes, &space);
      } else {
        s = model::ImportXSpaceBytesChunked(bytes, &space);
      }
      if (!s.ok()) {
        c.status = InvalidArgumentError(c.address + " sent an XSpace that does not parse: " + s.message());
        if (as_received) ::unlinkat(dir.fd(), xplane.c_str(), 0);
      }
    }
    const uint64_t reply_bytes = bytes.size();
    std::string().swap(bytes);
    if (c.status.ok()) {
      WriteToolFiles(c, dir, &taken, &result->warnings);
      host.xplane_path = dir.PathOf(xplane);
      const uint64_t json_limit = reply_bytes * options.max_trace_json_expansion + (64ull << 20);
      const uint64_t json_bytes = exporter::EstimateTraceJsonBytes(space, json_limit);
      if (json_bytes > json_limit) {
        result->warnings.push_back(c.address + ": its trace JSON would be over " + std::to_string(json_limit >> 20) +
                                   " MiB from a " + std::to_string(reply_bytes >> 10) +
                                   " KiB reply (names repeated by many events); wrote only " + xplane);
      } else {
        exporter::ExportRequest json{{exporter::Format::kTraceJson}, c.stem, {}};
        if (Status w = exporter::Export(space, dir, json, &files); !w.ok()) return w;
        host.trace_json_path = files.trace_json;
        if (!host.empty) spaces.push_back(std::move(space));  // for perfetto_trace.json.gz
      }
      if (!host.empty) ++captured;
    }
    c.response.Clear();
    if (!c.status.ok()) {
      host.error = c.status.message();
      failures.push_back(c.status.ToString());
      result->warnings.push_back("capture from " + c.address + " failed: " + c.status.ToString());
    }
    result->hosts.push_back(std::move(host));
  }
  if (options.log)
    for (const std::string& w : result->warnings) *options.log << "warning: " << w << std::endl;
  if (captured == 0) {
    if (failures.size() == 1) {
      Status only = calls.size() == 1 ? calls[0].status : Status();
      if (!only.ok()) return only;
    }
    std::string why;
    for (const std::string& f : failures) why += "\n  " + f;
    return UnavailableError("No trace event was collected" +
                            (why.empty() ? std::string(": the servers returned empty traces") : ":" + why));
  }

  if (options.create_perfetto_trace && !spaces.empty()) {
    // All hosts on one time base, each process under its own pid.
    model::Space merged;
    if (spaces.size() > 1) {
      uint64_t start = UINT64_MAX;
      for (const model::Space& s : spaces) start = std::min(start, ProfileStartTime(s) ? ProfileStartTime(s) : start);
      if (start == UINT64_MAX) start = 0;
      for (size_t i = 0; i < spaces.size(); ++i) {
        int64_t pid = ProcessIdOf(spaces[i]);
        MergeChildSpace(std::move(spaces[i]), start, std::to_string(pid ? pid : static_cast<int64_t>(i + 1)),
                        /*require_process_id=*/false, &merged);
      }
    }
    exporter::ExportedFiles files;
    exporter::ExportRequest perfetto{{exporter::Format::kPerfettoTraceJson}, "", {}};
    if (Status s = exporter::Export(spaces.size() == 1 ? spaces[0] : merged, dir, perfetto, &files); !s.ok()) return s;
    result->perfetto_trace_path = files.perfetto_trace;
  }
  return Status::Ok();
}

}  // namespace

Status Capture(const std::vector<std::string>& addresses, const CaptureOptions& options, const std::string& log_dir,
               CaptureResult* result) {
  *result = CaptureResult{};
  if (Status s = CheckGrpcUsable(); !s.ok()) return s;
  if (Status s = CheckOptions(addresses, options, log_dir); !s.ok()) return s;

  std::vector<HostCall> calls(addresses.size());
  std::set<std::string> stems;
  for (size_t i = 0; i < addresses.size(); ++i) {
    calls[i].address = addresses[i];
    const std::string& host = options.override_hostnames.empty() ? addresses[i] : options.override_hostnames[i];
    if (Status s = HostFileStem(host, &calls[i].stem); !s.ok()) return s;
    if (!stems.insert(calls[i].stem).second)
      return InvalidArgumentError("two servers would write the same files " + calls[i].stem +
                                  ".*: capture each address once, with distinct override_hostnames");
  }

  // The run directory, made here first: a server on this machine writes into
  // it when it does not support emit_xspace.
  std::error_code ec;
  std::string abs_log_dir = fs::absolute(log_dir, ec).lexically_normal().string();
  if (ec) return InvalidArgumentError("bad log_dir " + log_dir + ": " + ec.message());
  while (abs_log_dir.size() > 1 && abs_log_dir.back() == '/') abs_log_dir.pop_back();
  exporter::RunDir run;
  if (Status s = exporter::MakeRunDir(abs_log_dir, options.profile.session_id, &run); !s.ok()) return s;
  result->run_dir = run.dir.path();
  Status s = CaptureInto(calls, options, abs_log_dir, run, result);
  if (!s.ok()) exporter::RemoveIfEmpty(run);
  return s;
}

}  // namespace spyglass::server
