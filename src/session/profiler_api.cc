// start_trace / stop_trace / trace: the programmatic session, with the
// semantics of jax.profiler, over session::Session and the exporters.
#include <pthread.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <mutex>
#include <new>

#include "export/export.h"
#include "export/log_dir.h"
#include "session/flight_recorder.h"
#include "sinks/perfetto_link.h"
#include "session/profiler_api_internal.h"
#include "session/session.h"
#include "spyglass/profiler.h"
#include "trace/recorder.h"

namespace spyglass::profiler {
namespace {

constexpr char kAlreadyStarted[] = "Profile has already been started. Only one profile may be run at a time.";

struct ApiState {
  std::mutex mu;
  std::unique_ptr<session::Session> session;
  std::string log_dir;  // empty: keep the trace in memory only
  TraceOptions options;
  // The last stopped session, kept so a failed write can be retried.
  std::shared_ptr<const model::Space> last_space;
  TraceFiles last_files;
  TraceStats last_stats;
};

ApiState& state() {
  static auto* s = new ApiState;
  return *s;
}

// A forked child starts with no session: the parent's session object is
// abandoned there (its destructor would act on the parent's behalf).
void AfterForkChild() {
  ApiState& st = state();
  new (&st.mu) std::mutex;
  (void)st.session.release();
  session::ResetAfterForkChild();
}

[[maybe_unused]] const int g_atfork_registered = pthread_atfork(nullptr, nullptr, AfterForkChild);

Status Export(const model::Space& space, const std::string& log_dir, const TraceOptions& options,
              TraceFiles* files) {
  exporter::RunDir run;
  if (Status s = exporter::MakeRunDir(log_dir, options.profiler_options.session_id, &run); !s.ok()) return s;
  exporter::ExportRequest request{{exporter::Format::kXPlane, exporter::Format::kTraceJson},
                                  exporter::SanitizeHostForFile(session::Hostname()),
                                  {}};
  // Both Perfetto artifacts: the native trace (perfetto_trace.pb, the one for
  // big traces) and JAX's perfetto_trace.json.gz, a hard link to
  // <host>.trace.json.gz: the trace JSON is formatted and written once.
  if (options.create_perfetto_trace || options.create_perfetto_link)
    request.formats.insert(request.formats.end(),
                           {exporter::Format::kPerfettoTraceJson, exporter::Format::kPerfettoTrace});
  exporter::ExportedFiles written;
  if (Status s = exporter::Export(space, run.dir, request, &written); !s.ok()) {
    exporter::RemoveIfEmpty(run);  // a failed dump leaves no empty run behind
    return s;
  }
  *files = TraceFiles{run.dir.path(), written.xplane, written.trace_json, written.perfetto_trace,
                      written.perfetto_trace_json};
  return Status::Ok();
}

Status ServeLinkIfAsked(const TraceOptions& options, const TraceFiles& files) {
  if (!options.create_perfetto_link) return Status::Ok();
  sinks::PerfettoLinkOptions link;
  link.timeout_s = options.perfetto_link_timeout_s;
  link.cancelled = options.perfetto_link_cancelled;
  // JAX's URL (.../perfetto_trace.json.gz), as its users expect.
  return sinks::ServePerfettoTrace(files.perfetto_trace_json_path, link);
}

}  // namespace

Status start_trace(const std::string& log_dir, const TraceOptions& options) {
  ApiState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.session) return FailedPreconditionError(kAlreadyStarted);
  session::ClearMetadata();
  std::unique_ptr<session::Session> s;
  // A remote capture holds the same process-wide lock.
  if (Status status = session::Session::Create(options.profiler_options, kAlreadyStarted, &s); !status.ok())
    return status;
  session::FlightRecorderConfig ring;
  (void)session::ResolveFlightRecorder(options.profiler_options, &ring);  // validated by Create
  if (ring.seconds > 0) {
    if (Status t = session::StartFlightRecorderTriggers(log_dir, ring); !t.ok()) {
      model::Space discarded;
      session::SessionSummary summary;
      (void)s->Stop(&discarded, &summary);
      return t;
    }
  }
  st.session = std::move(s);
  st.log_dir = log_dir;
  st.options = options;
  return Status::Ok();
}

namespace {

// stop_trace's body; `write` false keeps the trace in memory whatever the
// log dir (session::StopTraceInMemory).
Status StopTrace(bool write) {
  ApiState& st = state();
  TraceOptions options;
  TraceFiles files;
  // Before the lock: the dump thread it joins may be waiting for it.
  session::StopFlightRecorderTriggers();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.session) return FailedPreconditionError("No profile started");
    auto space = std::make_shared<model::Space>();
    session::SessionSummary summary;
    Status collect = st.session->Stop(space.get(), &summary);
    st.session.reset();
    session::ClearMetadata();
    st.last_space = space;
    st.last_stats = TraceStats{summary.events, summary.dropped_events, summary.incomplete_events, summary.threads,
                               summary.cpu_samples};
    options = st.options;
    if (st.log_dir.empty() || !write) {  // in memory only (jax.profiler.trace(None))
      st.last_files = {};
      return collect;
    }
    if (Status s = Export(*space, st.log_dir, options, &files); !s.ok())
      return InternalError(s.message() + " (the trace is kept in memory: call export_last_trace with another log_dir)");
    st.last_files = files;
    if (!collect.ok()) return collect;
  }
  // Outside the lock: the link server blocks until the browser fetched it.
  return ServeLinkIfAsked(options, files);
}

}  // namespace

Status stop_trace() { return StopTrace(/*write=*/true); }

Status export_last_trace(const std::string& log_dir, const TraceOptions& options) {
  ApiState& st = state();
  TraceFiles files;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.last_space) return FailedPreconditionError("no stopped trace to export");
    if (Status s = Export(*st.last_space, log_dir, options, &files); !s.ok()) return s;
    st.last_files = files;
  }
  return ServeLinkIfAsked(options, files);
}

Status dump_flight_recorder(const std::string& log_dir) {
  ApiState& st = state();
  std::string dir;
  TraceOptions options;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (!st.session || !session::FlightRecorderActive())
      return FailedPreconditionError("no flight recorder runs in this process (start_trace with "
                                     "ProfileOptions::ring_buffer_seconds > 0)");
    dir = log_dir.empty() ? st.log_dir : log_dir;
    options = st.options;
  }
  // Outside the lock: the recorder runs on, and stop_trace may come (then
  // the snapshot fails cleanly).
  model::Space space;
  if (Status s = session::Session::SnapshotFlightRecorder(&space); !s.ok()) return s;
  options.profiler_options.session_id.clear();  // every dump is a run of its own
  options.create_perfetto_link = false;
  TraceFiles files;
  if (Status s = Export(space, dir, options, &files); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(st.mu);
  st.last_files = files;
  return Status::Ok();
}

bool flight_recorder_active() { return session::FlightRecorderActive(); }

TraceFiles last_trace_files() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().last_files;
}

TraceStats last_trace_stats() {
  std::lock_guard<std::mutex> lock(state().mu);
  return state().last_stats;
}

TraceScope::TraceScope(const std::string& log_dir, const TraceOptions& options)
    : start_status_(start_trace(log_dir, options)), running_(start_status_.ok()) {}

TraceScope::~TraceScope() {
  if (!running_) return;
  Status s = stop();
  if (!s.ok()) std::fprintf(stderr, "spyglass: stop_trace failed: %s\n", s.ToString().c_str());
}

Status TraceScope::stop() {
  if (!running_) return FailedPreconditionError("trace scope is not running");
  running_ = false;
  return stop_trace();
}

void set_thread_name(std::string_view name) { internal::recorder_set_thread_name(std::string(name)); }

void set_process_name(std::string_view name) { session::SetProcessName(std::string(name)); }

void set_metadata(const std::string& key, const std::string& value) { session::SetMetadata(key, value); }
void clear_metadata() { session::ClearMetadata(); }

}  // namespace spyglass::profiler

namespace spyglass::session {

std::shared_ptr<const model::Space> LastTraceSpace() {
  profiler::ApiState& st = profiler::state();
  std::lock_guard<std::mutex> lock(st.mu);
  return st.last_space;
}

Status StopTraceInMemory() { return profiler::StopTrace(/*write=*/false); }

Status ExportSpace(const model::Space& space, const std::string& log_dir, const profiler::TraceOptions& options) {
  profiler::TraceFiles files;
  if (Status s = profiler::Export(space, log_dir, options, &files); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(profiler::state().mu);
    profiler::state().last_files = files;
  }
  return profiler::ServeLinkIfAsked(options, files);
}

}  // namespace spyglass::session
