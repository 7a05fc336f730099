#include "server/request_policy.h"

#include <algorithm>

#include "common/quote.h"
#include "export/log_dir.h"
#include "server/options_convert.h"
#include "session/session.h"

namespace spyglass::server {
namespace {

// Lowers `o`'s buffer bound `field` and its advanced key `key` to `ceiling`;
// a request above it gets a warning in its output.
void ClampBuffer(profiler::ProfileOptions* o, uint64_t profiler::ProfileOptions::*field, const char* key,
                 uint64_t ceiling, const char* option, std::vector<std::string>* warnings) {
  o->*field = std::min(o->*field, ceiling);
  auto it = o->advanced_configuration.find(key);
  if (it == o->advanced_configuration.end() || !it->second.is_int() || it->second.as_int() < 0) return;
  uint64_t asked = static_cast<uint64_t>(it->second.as_int());
  if (asked <= ceiling) return;
  uint64_t used = std::min<uint64_t>(ceiling, std::numeric_limits<int64_t>::max());
  it->second = profiler::AdvancedValue(static_cast<int64_t>(used));
  warnings->push_back("spyglass: the request asked for " + std::string(key) + " = " + std::to_string(asked) +
                      " bytes; this server allows at most " + std::to_string(used) + " (ServerOptions::" + option +
                      "), which was used");
}

}  // namespace

Status CheckTerminateId(const std::string& session_id) {
  if (session_id.size() > kMaxNameBytes)
    return InvalidArgumentError("session_id " + QuoteInput(session_id) + " is longer than " +
                                std::to_string(kMaxNameBytes) + " bytes");
  return Status::Ok();
}

Status PrepareCapture(const profiler::ServerOptions& server, const tensorflow::ProfileRequest& req, uint64_t now_ns,
                      PreparedCapture* out) {
  *out = PreparedCapture{};
  profiler::ProfileOptions& options = out->options;
  options = FromProto(req.opts());
  // The session's duration: opts.duration_ms as the reference server, else the request's.
  out->duration_ms = options.duration_ms != 0 ? options.duration_ms : req.duration_ms();
  if (out->duration_ms == 0) return InvalidArgumentError("duration_ms must be greater than 0 (got 0)");
  if (out->duration_ms != kUntilTerminate && out->duration_ms > server.max_duration_ms)
    return InvalidArgumentError("duration_ms " + std::to_string(out->duration_ms) + " is over this server's limit of " +
                                std::to_string(server.max_duration_ms) + " ms (ServerOptions::max_duration_ms)");
  // A delayed start has its own, smaller bound; the caller waits without the session.
  out->delay_ns = options.start_timestamp_ns > now_ns ? options.start_timestamp_ns - now_ns : 0;
  if (out->delay_ns / 1000000 > server.max_start_delay_ms)
    return InvalidArgumentError("start_timestamp_ns is " + std::to_string(out->delay_ns / 1000000) +
                                " ms in the future, over this server's limit of " +
                                std::to_string(server.max_start_delay_ms) + " ms (ServerOptions::max_start_delay_ms)");
  options.start_timestamp_ns = 0;
  // session_id: the run directory and what Terminate names; the request's,
  // else the options', else a timestamp.
  out->session_id = !req.session_id().empty() ? req.session_id() : options.session_id;
  if (Status s = CheckTerminateId(out->session_id); !s.ok()) return s;
  if (out->session_id.empty()) out->session_id = exporter::TimestampRunName();
  options.session_id.clear();  // not a directory of this process: the request says where to write

  ClampBuffer(&options, &profiler::ProfileOptions::buffer_bytes_per_thread, "spyglass_buffer_bytes_per_thread",
              server.max_buffer_bytes_per_thread, "max_buffer_bytes_per_thread", &out->warnings);
  ClampBuffer(&options, &profiler::ProfileOptions::buffer_bytes_total, "spyglass_buffer_bytes_total",
              server.max_buffer_bytes_total, "max_buffer_bytes_total", &out->warnings);
  if (Status s = profiler::ValidateOptions(options); !s.ok()) return s;

  // A loopback client can be any local user: without a root the program
  // chose, this process creates no file a request names.
  out->write_file = !req.emit_xspace() && !server.allowed_log_root.empty();
  if (out->write_file) {
    std::string host = req.host_name();
    auto o = options.advanced_configuration.find("override_hostname");
    if (o != options.advanced_configuration.end() && o->second.is_string() && !o->second.as_string().empty())
      host = o->second.as_string();
    if (host.empty()) host = session::Hostname();
    if (Status s = ResolveProfileFile(req.repository_root(), out->session_id, host, server.allowed_log_root,
                                      &out->target);
        !s.ok())
      return s;
  }
  return Status::Ok();
}

}  // namespace spyglass::server
