#include "session/env_start.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string_view>

#include "common/quote.h"
#include "memory/tracker.h"
#include "session/options_text.h"
#include "spyglass/profiler.h"
#include "spyglass/server.h"

namespace spyglass::session {
namespace {

Status Bad(const char* name, std::string_view value, const std::string& what) {
  return InvalidArgumentError(std::string(name) + "=" + QuoteInput(value) + ": " + what);
}

// [ADDRESS:]PORT; ADDRESS may be bracketed ([::]:9999).
Status ParseServer(std::string_view v, StartSettings* out) {
  std::string_view port = v, address;
  if (size_t colon = v.rfind(':'); colon != std::string_view::npos) {
    address = v.substr(0, colon);
    port = v.substr(colon + 1);
    if (address.size() >= 2 && address.front() == '[' && address.back() == ']')
      address = address.substr(1, address.size() - 2);
    if (address.empty()) return Bad(kEnvServerPort, v, "empty address (PORT or ADDRESS:PORT)");
  }
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos ||
      std::atoi(std::string(port).c_str()) > 65535)
    return Bad(kEnvServerPort, v, "not a port from 0 to 65535 (PORT or ADDRESS:PORT; 0 picks a free port)");
  out->server = true;
  out->server_port = std::atoi(std::string(port).c_str());
  if (!address.empty()) out->server_address = std::string(address);
  return Status::Ok();
}

Status ParseSeconds(std::string_view v, StartSettings* out) {
  if (v.empty() || v.size() > 5 || v.find_first_not_of("0123456789") != std::string_view::npos ||
      std::atoi(std::string(v).c_str()) < 1 || std::atoi(std::string(v).c_str()) > 86400)
    return Bad(kEnvFlightRecorder, v, "not a whole number of seconds from 1 to 86400");
  out->flight_recorder_seconds = std::atoi(std::string(v).c_str());
  return Status::Ok();
}

// key=value,key=value (empty items are skipped).
Status ParseOptions(std::string_view v, profiler::ProfileOptions* o) {
  size_t pos = 0;
  while (pos <= v.size()) {
    size_t comma = v.find(',', pos);
    std::string_view item = v.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    pos = comma == std::string_view::npos ? v.size() + 1 : comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0)
      return Bad(kEnvOptions, v, "expected key=value[,key=value...], got " + QuoteInput(item));
    if (Status s = profiler::SetOptionFromText(item.substr(0, eq), item.substr(eq + 1), o); !s.ok())
      return InvalidArgumentError(std::string(kEnvOptions) + ": " + s.message());
  }
  if (Status s = profiler::ValidateOptions(*o); !s.ok())
    return InvalidArgumentError(std::string(kEnvOptions) + ": " + s.message());
  return Status::Ok();
}

struct StartedState {
  std::mutex mu;
  pid_t pid = 0;
  Started started;
  bool quiet = false;  // a descendant of the process that started first: says only errors
};

// The first process to start from the environment names itself here; the
// processes it starts inherit the settings (each records its own run) but
// not a voice: their stderr is their parent's to read (CPython's test_json
// wants its json.tool children silent). `spyglass run` lists every run.
constexpr char kEnvFirstPid[] = "SPYGLASS_ENV_FIRST_PID";
bool StartedByAnAncestor() {
  const char* v = std::getenv(kEnvFirstPid);
  return v != nullptr && *v != '\0' && std::to_string(::getpid()) != v;
}
StartedState& state() {
  static auto* s = new StartedState;  // never destroyed: used at exit
  return *s;
}

// Makes (mode 0700) or checks the directory `path`: it must be a directory,
// not a link, owned by this user, and writable by no one else. Another user's
// directory, or one others may write, is refused: its owner could read the
// dumps (command line included) or move them away.
Status PrivateDir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
    return InternalError("cannot make " + path + ": " + std::strerror(errno));
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return InternalError("cannot open " + path + " (a directory, not a link): " + std::strerror(errno));
  struct stat st {};
  int r = ::fstat(fd, &st);
  ::close(fd);
  if (r != 0) return InternalError("cannot inspect " + path + ": " + std::strerror(errno));
  if (st.st_uid != ::geteuid())
    return FailedPreconditionError(path + " belongs to uid " + std::to_string(st.st_uid) + ", not to this user (uid " +
                                 std::to_string(::geteuid()) + "): refusing to write there; set " + kEnvTraceDir);
  if ((st.st_mode & 022) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return FailedPreconditionError(path + " is writable by other users (mode " + mode + "): refusing to write there; set " +
                                 kEnvTraceDir + " or make it mode 0700");
  }
  return Status::Ok();
}

// The flight recorder's default directory: <tmp>/spyglass-<uid>/flight-recorder,
// both private to this user (the temporary directory is shared).
Status DefaultFlightRecorderDir(std::string* out) {
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  std::string user_dir = (tmp / ("spyglass-" + std::to_string(::geteuid()))).string();
  if (Status s = PrivateDir(user_dir); !s.ok()) return s;
  std::string dir = user_dir + "/flight-recorder";
  if (Status s = PrivateDir(dir); !s.ok()) return s;
  *out = dir;
  return Status::Ok();
}

void Say(const std::string& line) { std::fprintf(stderr, "spyglass: %s\n", line.c_str()); }
// What went well: not said by a descendant (errors always are).
void SayDone(const StartedState& st, const std::string& line) {
  if (!st.quiet) Say(line);
}

}  // namespace

Status ParseStartSettings(const std::function<const char*(const char*)>& get, StartSettings* out) {
  auto value = [&](const char* name) -> const char* {
    const char* v = get(name);
    return v != nullptr && *v != '\0' ? v : nullptr;
  };
  if (const char* v = value(kEnvOptions)) {
    if (Status s = ParseOptions(v, &out->options); !s.ok()) return s;
  }
  if (const char* v = value(kEnvTraceDir)) {
    std::error_code ec;
    std::filesystem::path p = std::filesystem::absolute(v, ec);  // the program may change directory
    if (ec) return Bad(kEnvTraceDir, v, ec.message());
    out->trace_dir = p.string();
  }
  if (const char* v = value(kEnvServerPort)) {
    if (Status s = ParseServer(v, out); !s.ok()) return s;
  }
  if (const char* v = value(kEnvFlightRecorder)) {
    if (Status s = ParseSeconds(v, out); !s.ok()) return s;
  }
  return Status::Ok();
}

Started StartFromSettings(const StartSettings& s) {
  memory::internal::ScopedUntracked untracked;  // the profiler's allocations are not the program's
  StartedState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  st.pid = getpid();
  st.quiet = StartedByAnAncestor();
  if (!st.quiet && (s.flight_recorder_seconds > 0 || !s.trace_dir.empty() || s.server))
    ::setenv(kEnvFirstPid, std::to_string(st.pid).c_str(), 1);
  // The trace JSON is written once (<host>.trace.json.gz, which Perfetto's UI
  // opens as it is); perfetto_trace.json.gz only where a program asks for it.
  if (s.flight_recorder_seconds > 0) {
    // The flight recorder is a trace in ring-buffer mode: dumps (and the exit)
    // write its last window under the trace dir, by default a temporary one.
    std::string dir = s.trace_dir;
    Status where = dir.empty() ? DefaultFlightRecorderDir(&dir) : Status::Ok();
    profiler::TraceOptions t;
    t.profiler_options = s.options;
    t.profiler_options.ring_buffer_seconds = static_cast<uint64_t>(s.flight_recorder_seconds);
    if (!where.ok()) {
      Say("cannot start the flight recorder (" + std::string(kEnvFlightRecorder) + "): " + where.message());
    } else if (Status r = profiler::start_trace(dir, t); r.ok()) {
      st.started.flight_recorder = true;
      SayDone(st, "flight recorder on, keeping the last " + std::to_string(t.profiler_options.ring_buffer_seconds) +
          " s; dumps go to " + dir + "/plugins/profile/");
    } else {
      Say("cannot start the flight recorder (" + std::string(kEnvFlightRecorder) + "): " + r.message());
    }
  } else if (!s.trace_dir.empty()) {
    profiler::TraceOptions t;
    t.profiler_options = s.options;
    if (Status r = profiler::start_trace(s.trace_dir, t); r.ok())
      st.started.trace = true;
    else
      Say("cannot start the trace (" + std::string(kEnvTraceDir) + "): " + r.message());
  }
  if (s.server) {
    profiler::ServerOptions o;
    o.bind_address = s.server_address;
    if (Status r = profiler::start_server(s.server_port, o); r.ok()) {
      st.started.server_port = profiler::server_port();
      SayDone(st, "profiler server on " + s.server_address + ":" + std::to_string(st.started.server_port) +
          " (spyglass collect " + std::to_string(st.started.server_port) + " <ms>)");
    } else {
      Say("cannot start the profiler server (" + std::string(kEnvServerPort) + "): " + r.message());
    }
  }
  return st.started;
}

void StopStarted() {
  memory::internal::ScopedUntracked untracked;
  StartedState& st = state();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.pid != getpid()) return;  // a forked child: the parent's session and server are not its own
  if (st.started.trace || st.started.flight_recorder) {
    const char* what = st.started.trace ? "trace" : "flight recorder's last window";
    st.started.trace = st.started.flight_recorder = false;
    Status r = profiler::stop_trace();
    std::string dir = profiler::last_trace_files().run_dir;
    if (r.ok()) {
      // What the trace holds, so that an empty one is not a surprise.
      const profiler::TraceStats stats = profiler::last_trace_stats();
      std::string line = std::string(what) + " written to " + dir + " (" + std::to_string(stats.events) +
                         " annotated events on " + std::to_string(stats.threads) + " threads";
      if (stats.dropped_events > 0) line += ", " + std::to_string(stats.dropped_events) + " dropped at the buffer bound";
      if (stats.cpu_samples > 0) line += ", " + std::to_string(stats.cpu_samples) + " CPU samples";
      SayDone(st, line + ")");
      if (stats.events == 0 && stats.cpu_samples == 0)
        SayDone(st, "the program annotated nothing: the trace holds only what TraceAnnotation, StepTraceAnnotation "
            "or the Python tracer record, and live-bytes counters under the heap hook (spyglass run --memory "
            "--trace DIR)");
    }
    else if (r.code() != StatusCode::kFailedPrecondition)  // stopped by the program itself
      Say("cannot write the trace: " + r.message());
  }
  if (st.started.server_port != 0) {
    st.started.server_port = 0;
    (void)profiler::stop_server();
  }
}

Started StartFromEnvironment(const profiler::ProfileOptions& base, bool stop_at_exit) {
  StartSettings s;
  s.options = base;
  if (Status r = ParseStartSettings([](const char* n) { return std::getenv(n); }, &s); !r.ok()) {
    Say(r.message() + "; running without profiling");
    return {};
  }
  if (s.empty()) return {};
  Started started = StartFromSettings(s);
  if (stop_at_exit && (started.trace || started.server_port != 0 || started.flight_recorder)) std::atexit(StopStarted);
  return started;
}

}  // namespace spyglass::session
