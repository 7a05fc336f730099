#include "server/client.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "export/log_dir.h"
#include "export/trace_json/trace_json_writer.h"
#include "model/xspace_import.h"
#include "profiler_service.grpc.pb.h"
#include "server/merge.h"
#include "server/options_convert.h"
#include "server/path_policy.h"
#include "server/rpc_util.h"
#include "trace/clock.h"

namespace spyglass::server {
namespace {

namespace fs = std::filesystem;

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
  tensorflow::ProfileResponse response;
  Status status;
};

void CallOne(HostCall* call, const tensorflow::ProfileRequest& request, const CaptureOptions& options) {
  auto channel = MakeChannel(call->address);
  if (Status s = Connect(channel.get(), call->address, options.connect_timeout_ms); !s.ok()) {
    call->status = s;
    return;
  }
  auto stub = tensorflow::ProfilerService::NewStub(channel);
  grpc::ClientContext ctx;
  // As the reference client: max(60 s, 2 x duration) + delay.
  int64_t budget = std::max<int64_t>(60000, 2 * static_cast<int64_t>(options.duration_ms)) +
                   static_cast<int64_t>(options.delay_ms);
  ctx.set_deadline(AfterMs(budget));
  grpc::Status g = stub->Profile(&ctx, request, &call->response);
  call->status = FromGrpc(g, call->address);
}

Status WriteBytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) return InternalError("cannot write " + path);
  return Status::Ok();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

int64_t ProcessIdOf(const model::Space& space) {
  if (const model::Plane* host = space.find_plane(model::kHostPlaneName))
    for (const model::Stat& s : host->stats)
      if (host->stat_name(s) == "process_id") return s.kind == model::StatKind::kUint64 ? static_cast<int64_t>(s.u64) : s.i64;
  return 0;
}

}  // namespace

Status Capture(const std::vector<std::string>& addresses, const CaptureOptions& options, const std::string& log_dir,
               CaptureResult* result) {
  *result = CaptureResult{};
  if (Status s = CheckGrpcUsable(); !s.ok()) return s;
  if (addresses.empty()) return InvalidArgumentError("no address to capture");
  for (const std::string& a : addresses)
    if (Status s = CheckAddress(a); !s.ok()) return s;
  if (options.duration_ms == 0) return InvalidArgumentError("the duration must be greater than 0 ms");
  if (options.duration_ms > options.max_duration_ms)
    return InvalidArgumentError("the duration " + std::to_string(options.duration_ms) + " ms is over the limit of " +
                                std::to_string(options.max_duration_ms) + " ms");
  if (!options.override_hostnames.empty() && options.override_hostnames.size() != addresses.size())
    return InvalidArgumentError("override_hostnames must name one host per address (" +
                                std::to_string(addresses.size()) + ")");
  if (log_dir.empty()) return InvalidArgumentError("log_dir is empty");
  if (Status s = profiler::ValidateOptions(options.profile); !s.ok()) return s;

  std::vector<HostCall> calls(addresses.size());
  for (size_t i = 0; i < addresses.size(); ++i) {
    calls[i].address = addresses[i];
    const std::string& host = options.override_hostnames.empty() ? addresses[i] : options.override_hostnames[i];
    if (Status s = HostFileStem(host, &calls[i].stem); !s.ok()) return s;
  }

  // The run directory, made here first: a server on this machine writes into
  // it when it does not support emit_xspace.
  std::error_code ec;
  std::string abs_log_dir = fs::absolute(log_dir, ec).lexically_normal().string();
  if (ec) return InvalidArgumentError("bad log_dir " + log_dir + ": " + ec.message());
  while (abs_log_dir.size() > 1 && abs_log_dir.back() == '/') abs_log_dir.pop_back();
  std::string run_dir;
  if (Status s = exporter::MakeRunDir(abs_log_dir, options.profile.session_id, &run_dir); !s.ok()) return s;
  std::string session_id = fs::path(run_dir).filename().string();
  result->run_dir = run_dir;

  profiler::ProfileOptions opts = options.profile;
  opts.duration_ms = options.duration_ms;
  opts.repository_path = abs_log_dir;
  opts.session_id = session_id;
  opts.start_timestamp_ns = internal::wall_ns() + options.delay_ms * 1000000ull;
  opts.advanced_configuration.erase("override_hostnames");

  if (options.log)
    *options.log << "Starting to trace for " << options.duration_ms << " ms from " << addresses.size()
                 << (addresses.size() == 1 ? " server" : " servers") << "." << std::endl;
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
    req.set_host_name(addresses[i]);
    req.set_emit_xspace(true);
    threads.emplace_back([&calls, &options, i, req = std::move(req)] { CallOne(&calls[i], req, options); });
  }
  for (auto& t : threads) t.join();

  // Write what came back, host by host.
  std::vector<model::Space> spaces;
  std::vector<std::string> failures;
  for (HostCall& c : calls) {
    CaptureHostResult host;
    host.address = c.address;
    std::string xplane = run_dir + "/" + c.stem + ".xplane.pb";
    std::string bytes;
    if (c.status.ok()) {
      if (c.response.has_xspace()) {
        bytes = c.response.xspace().SerializeAsString();
        if (Status s = WriteBytes(xplane, bytes); !s.ok()) c.status = s;
      } else {
        bytes = ReadBytes(xplane);  // an older server wrote it (same machine)
        if (bytes.empty())
          c.status = UnavailableError(c.address + " returned no XSpace and wrote no " + xplane +
                                      " (a server on another machine that does not support emit_xspace)");
      }
      // Tool files some servers return, written only under plain names.
      for (const auto& tool : c.response.tool_data()) {
        if (!exporter::IsPlainComponent(tool.name())) {
          result->warnings.push_back(c.address + ": ignored tool data with a bad name '" + tool.name() + "'");
          continue;
        }
        (void)WriteBytes(run_dir + "/" + c.stem + "." + tool.name(), tool.data());
      }
    }
    if (c.status.ok() && c.response.empty_trace()) {
      host.empty = true;
      result->warnings.push_back("No trace event is collected from " + c.address);
    }
    if (c.status.ok()) {
      model::Space space;
      if (Status s = model::ImportXSpaceBytes(bytes, &space); !s.ok()) {
        c.status = InternalError(c.address + ": " + s.message());
      } else {
        host.xplane_path = xplane;
        host.trace_json_path = run_dir + "/" + c.stem + ".trace.json.gz";
        if (Status s = exporter::WriteTraceJsonGz(space, host.trace_json_path); !s.ok()) return s;
        if (!host.empty) spaces.push_back(std::move(space));
      }
    }
    if (!c.status.ok()) {
      host.error = c.status.message();
      failures.push_back(c.status.ToString());
      result->warnings.push_back("capture from " + c.address + " failed: " + c.status.ToString());
    }
    result->hosts.push_back(std::move(host));
  }
  if (options.log)
    for (const std::string& w : result->warnings) *options.log << "warning: " << w << std::endl;
  if (spaces.empty()) {
    if (failures.size() == 1) {
      Status only = calls.size() == 1 ? calls[0].status : Status();
      if (!only.ok()) return only;
    }
    std::string why;
    for (const std::string& f : failures) why += "\n  " + f;
    return UnavailableError("No trace event was collected" +
                            (why.empty() ? std::string(": the servers returned empty traces") : ":" + why));
  }

  if (options.create_perfetto_trace) {
    exporter::TraceJsonOptions json;
    json.perfetto = true;
    json.gzip_level = 6;
    result->perfetto_trace_path = run_dir + "/perfetto_trace.json.gz";
    if (spaces.size() == 1) {
      if (Status s = exporter::WriteTraceJsonGz(spaces[0], result->perfetto_trace_path, json); !s.ok()) return s;
    } else {
      // All hosts on one time base, each process under its own pid.
      uint64_t start = UINT64_MAX;
      for (const model::Space& s : spaces) start = std::min(start, ProfileStartTime(s) ? ProfileStartTime(s) : start);
      if (start == UINT64_MAX) start = 0;
      model::Space merged;
      for (size_t i = 0; i < spaces.size(); ++i) {
        int64_t pid = ProcessIdOf(spaces[i]);
        MergeChildSpace(std::move(spaces[i]), start, std::to_string(pid ? pid : static_cast<int64_t>(i + 1)),
                        /*require_process_id=*/false, &merged);
      }
      if (Status s = exporter::WriteTraceJsonGz(merged, result->perfetto_trace_path, json); !s.ok()) return s;
    }
  }
  return Status::Ok();
}

}  // namespace spyglass::server
