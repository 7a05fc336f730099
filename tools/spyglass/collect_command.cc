// `spyglass collect <port | host:port[,host:port...]> <duration_ms>`: remote
// capture with the arguments of `python -m jax.collect_profile`. A thin layer
// over server::Capture (src/server/client.h).
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "sinks/perfetto_link.h"
#include "server/client.h"

namespace spyglass::cli {
namespace {

// Replies are bounded by gRPC below 2 GiB.
constexpr int64_t kMaxReplyMb = 2047;

struct CollectArgs {
  std::string target;
  int64_t duration_ms = 0;
  std::string log_dir;
  std::string host = "127.0.0.1";
  int host_tracer_level = 2;
  int device_tracer_level = 1;
  int python_tracer_level = 1;
  bool no_perfetto_link = false;
  int64_t delay_ms = 0;
  std::string session_id;
  std::string override_hostnames;
  int connect_timeout_ms = 10000;
  int64_t max_duration_ms = 3600000;
  int64_t max_reply_mb = 1024;
  bool flight_recorder = false;
  bool duration_given = false;
};

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t i = 0;
  while (true) {
    size_t j = s.find(sep, i);
    out.push_back(s.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j + 1;
  }
  return out;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// A value as jax.collect_profile reads it: true/t/yes/y, false/f/no/n, an
// integer (0x.. accepted), else a string.
profiler::AdvancedValue ParseValue(const std::string& v) {
  std::string l = Lower(v);
  if (l == "true" || l == "t" || l == "yes" || l == "y") return true;
  if (l == "false" || l == "f" || l == "no" || l == "n") return false;
  errno = 0;
  char* end = nullptr;
  long long i = std::strtoll(v.c_str(), &end, 0);
  if (!v.empty() && errno == 0 && end && *end == '\0') return static_cast<int64_t>(i);
  return v;
}

// Extra "--key=value", "--key value" and "--key" flags -> advanced options.
Status ParseExtras(const std::vector<std::string>& extras, profiler::ProfileOptions* o) {
  for (size_t i = 0; i < extras.size(); ++i) {
    const std::string& a = extras[i];
    if (a.rfind("--", 0) != 0 || a.size() == 2)
      return InvalidArgumentError("Unknown positional argument encountered: " + a);
    std::string key = a.substr(2), value = "true";
    if (size_t eq = key.find('='); eq != std::string::npos) {
      value = key.substr(eq + 1);
      key = key.substr(0, eq);
    } else if (i + 1 < extras.size() && extras[i + 1].rfind("--", 0) != 0) {
      value = extras[++i];
    }
    o->advanced_configuration.insert_or_assign(key, ParseValue(value));
  }
  return Status::Ok();
}

int RunCollect(const CollectArgs& a, const std::vector<std::string>& extras, const std::function<bool()>& cancelled) {
  server::CaptureOptions opt;
  opt.log = &std::cerr;
  if (a.flight_recorder) {
    // The server replies with its ring at once: a duration would be ignored.
    if (a.duration_given) {
      std::cerr << "spyglass collect: --flight-recorder fetches the last seconds the ring holds and takes no "
                   "duration (got "
                << a.duration_ms << " ms)\n";
      return 2;
    }
  } else if (a.duration_ms <= 0) {
    std::cerr << "spyglass collect: the duration must be a positive number of milliseconds, got " << a.duration_ms
              << "\n";
    return 2;
  }
  if (a.delay_ms < 0 || a.max_duration_ms <= 0) {
    std::cerr << "spyglass collect: --delay_ms and --max_duration_ms must not be negative\n";
    return 2;
  }
  if (a.max_reply_mb < 1 || a.max_reply_mb > kMaxReplyMb) {
    std::cerr << "spyglass collect: --max_reply_mb must be 1 to " << kMaxReplyMb << " (gRPC's limit), got "
              << a.max_reply_mb << "\n";
    return 2;
  }
  opt.max_reply_bytes = static_cast<uint64_t>(a.max_reply_mb) << 20;
  if (static_cast<uint64_t>(a.delay_ms) > opt.max_delay_ms) {
    std::cerr << "spyglass collect: --delay_ms must be at most " << opt.max_delay_ms << " (one hour), got "
              << a.delay_ms << "\n";
    return 2;
  }
  opt.duration_ms = a.flight_recorder ? 1 : static_cast<uint64_t>(a.duration_ms);
  opt.max_duration_ms = static_cast<uint64_t>(a.max_duration_ms);
  opt.delay_ms = static_cast<uint64_t>(a.delay_ms);
  opt.connect_timeout_ms = a.connect_timeout_ms;
  opt.profile.host_tracer_level = a.host_tracer_level;
  opt.profile.device_tracer_level = a.device_tracer_level;
  opt.profile.python_tracer_level = a.python_tracer_level;
  opt.profile.session_id = a.session_id;
  // Registered subprocesses of the target are captured too (JAX servers need it asked).
  opt.profile.advanced_configuration.insert_or_assign("profile_subprocesses", true);
  if (Status s = ParseExtras(extras, &opt.profile); !s.ok()) {
    std::cerr << "spyglass collect: " << s.message() << "\n";
    return 2;
  }
  if (a.flight_recorder) opt.profile.advanced_configuration.insert_or_assign("spyglass_flight_recorder", true);
  if (!a.override_hostnames.empty()) opt.override_hostnames = Split(a.override_hostnames, ',');
  opt.create_perfetto_trace = !a.no_perfetto_link;

  std::vector<std::string> addresses;
  for (std::string t : Split(a.target, ',')) {
    if (t.rfind("grpc://", 0) == 0) t = t.substr(7);
    if (!t.empty() && t.find_first_not_of("0123456789") == std::string::npos) t = a.host + ":" + t;
    addresses.push_back(t);
  }
  std::string log_dir = a.log_dir;
  bool temp_log_dir = log_dir.empty();
  if (temp_log_dir) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spyglass-collect-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) {
      std::cerr << "spyglass collect: cannot make a temporary log dir\n";
      return 1;
    }
    log_dir = tmpl;
  }
  server::CaptureResult result;
  Status s = server::Capture(addresses, opt, log_dir, &result);
  if (!s.ok()) {
    if (temp_log_dir) ::rmdir(log_dir.c_str());  // nothing in it (Capture removes its empty directories)
    std::cerr << "spyglass collect: " << s.ToString() << "\n";
    return 1;
  }
  std::cout << "Dumped profiling information in: " << log_dir << "\n";
  std::cout << "Trace written to " << result.run_dir << "\n";
  for (const auto& h : result.hosts)
    if (!h.xplane_path.empty())
      std::cout << "  " << h.xplane_path << "\n" << (h.trace_json_path.empty() ? "" : "  " + h.trace_json_path + "\n");
  std::cout.flush();
  // JAX's URL (.../perfetto_trace.json.gz); the native trace where no trace
  // JSON was written (a host's would have been too large).
  const std::string& served =
      result.perfetto_trace_json_path.empty() ? result.perfetto_trace_path : result.perfetto_trace_json_path;
  if (!a.no_perfetto_link && !served.empty()) {
    sinks::PerfettoLinkOptions link;
    link.cancelled = cancelled;
    if (Status ls = sinks::ServePerfettoTrace(served, link); !ls.ok()) {
      std::cerr << "spyglass collect: perfetto link: " << ls.ToString() << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace

namespace {

constexpr char kCollectHelp[] =
    "Capture a running program's profiler server (Spyglass start_server or jax.profiler.start_server)\n"
    "for DURATION_MS and write <log_dir>/plugins/profile/<run>/<host>.xplane.pb and .trace.json.gz.\n"
    "With --flight-recorder, fetch the last seconds a running flight recorder holds instead (no duration).\n"
    "Extra --key=value flags are sent as advanced options.";

// The options and action of `collect`, on the CLI's subcommand or on the
// app of `python -m spyglass.collect_profile`.
void DefineCollect(CLI::App* c, std::function<bool()> cancelled) {
  auto args = std::make_shared<CollectArgs>();
  c->add_option("target", args->target, "PORT, or HOST:PORT[,HOST:PORT...] to capture several at once")->required();
  c->add_option("duration_ms", args->duration_ms, "capture duration in milliseconds (not with --flight-recorder)");
  c->add_flag("--flight-recorder,--flight_recorder", args->flight_recorder,
              "reply with the target's flight recorder ring (its last seconds) at once, instead of recording");
  c->add_option("--log_dir", args->log_dir, "output log dir (default: a new temporary directory)");
  c->add_option("--host", args->host, "host of a bare PORT target (default 127.0.0.1)");
  c->add_option("--host_tracer_level", args->host_tracer_level, "host tracer level (default 2)");
  c->add_option("--device_tracer_level", args->device_tracer_level, "device tracer level (default 1)");
  c->add_option("--python_tracer_level", args->python_tracer_level, "python tracer level (default 1)");
  c->add_flag("--no_perfetto_link", args->no_perfetto_link, "do not serve the trace for ui.perfetto.dev");
  c->add_option("--delay_ms", args->delay_ms, "start every server this many ms from now (at most one hour)");
  c->add_option("--session_id", args->session_id, "run directory name (default: a timestamp)");
  c->add_option("--override_hostnames", args->override_hostnames, "comma list: a file name per address");
  c->add_option("--connect_timeout_ms", args->connect_timeout_ms, "give up on a server not reached by then (10000)");
  c->add_option("--max_duration_ms", args->max_duration_ms, "longest capture accepted (default one hour)");
  c->add_option("--max_reply_mb", args->max_reply_mb,
                "largest reply accepted from one server, in MiB (default 1024; the client needs about twice it)");
  c->allow_extras();
  c->callback([c, args, cancelled] {
    args->duration_given = c->count("duration_ms") > 0;
    int rc = RunCollect(*args, c->remaining(), cancelled);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace

void AddCollectCommand(CLI::App& app, std::function<bool()> cancelled) {
  DefineCollect(app.add_subcommand("collect", kCollectHelp), std::move(cancelled));
}

int RunCollectCommand(const std::string& program, const std::vector<std::string>& args,
                      std::function<bool()> cancelled) {
  CLI::App app{kCollectHelp, program};
  DefineCollect(&app, std::move(cancelled));
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them last first
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return ExitStatus(app, e);
  }
  return 0;
}

int ExitStatus(CLI::App& app, const CLI::ParseError& e) {
  int code = app.exit(e);
  if (dynamic_cast<const CLI::RuntimeError*>(&e) != nullptr) return code;
  return code == 0 ? 0 : 2;
}

}  // namespace spyglass::cli
