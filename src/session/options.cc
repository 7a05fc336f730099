// Validation of ProfileOptions: levels and advanced_configuration keys.
#include <cerrno>
#include <cstdlib>
#include <string>
#include <string_view>

#include <csignal>
#include <string>

#include "common/quote.h"
#include "session/flight_recorder.h"
#include "session/options_text.h"
#include "session/tracer.h"
#include "spyglass/options.h"
#include "trace/recorder.h"

namespace spyglass::profiler {
namespace {

using ValueType = session::OptionType;

struct KnownKey {
  std::string_view name;
  ValueType type;
};

// advanced_configuration keys known to the JAX/XProf stack (spec PROTOCOL.md
// §3) and the session's own. Tracers register theirs (session/tracer.h).
// Device-specific keys are accepted on every host so that one capture
// request works across a mixed job.
constexpr KnownKey kKnownKeys[] = {
    {"profile_subprocesses", ValueType::kBool},
    {"override_hostname", ValueType::kString},
    {"override_hostnames", ValueType::kString},
    {"tpu_trace_mode", ValueType::kString},
    {"tpu_num_sparse_cores_to_trace", ValueType::kInt},
    {"tpu_num_sparse_core_tiles_to_trace", ValueType::kInt},
    {"tpu_num_chips_to_profile_per_task", ValueType::kInt},
    {"tpu_perf_counters", ValueType::kBool},
    {"tpu_circular_buffer_tracing", ValueType::kBool},
    {"tracemark_lower", ValueType::kInt},
    {"tracemark_upper", ValueType::kInt},
    {"tpu_watched_sync_flag_number", ValueType::kInt},
    {"tpu_watched_sync_flag_mask", ValueType::kInt},
    {"spyglass_buffer_bytes_per_thread", ValueType::kInt},
    {"spyglass_buffer_bytes_total", ValueType::kInt},
    // Flight recorder (options.h, docs/tracing.md).
    {"spyglass_ring_buffer_seconds", ValueType::kInt},
    {"spyglass_ring_buffer_bytes", ValueType::kInt},
    {"spyglass_dump_signal", ValueType::kString},
    {"spyglass_dump_if_step_slower_than_ms", ValueType::kInt},
    {"spyglass_dump_on_crash", ValueType::kBool},
    // A capture request: reply with the running flight recorder's ring.
    {"spyglass_flight_recorder", ValueType::kBool},
};

const char* TypeName(ValueType t) {
  switch (t) {
    case ValueType::kBool: return "bool";
    case ValueType::kInt: return "int";
    case ValueType::kString: return "string";
  }
  return "?";
}

bool Matches(const AdvancedValue& v, ValueType t) {
  return (t == ValueType::kBool && v.is_bool()) || (t == ValueType::kInt && v.is_int()) ||
         (t == ValueType::kString && v.is_string());
}

Status CheckLevel(const char* name, int value, int max) {
  if (value < 0 || value > max)
    return InvalidArgumentError(std::string(name) + " must be between 0 and " + std::to_string(max) + ", got " +
                                std::to_string(value));
  return Status::Ok();
}

// The session's keys, then the registered tracers'.
std::vector<KnownKey> AllKeys(std::vector<session::OptionKey>* storage) {
  *storage = session::RegisteredOptionKeys();
  std::vector<KnownKey> keys(std::begin(kKnownKeys), std::end(kKnownKeys));
  for (const session::OptionKey& k : *storage) keys.push_back({k.name, k.type});
  return keys;
}

bool FindKey(std::string_view key, KnownKey* out) {
  std::vector<session::OptionKey> storage;
  for (const KnownKey& k : AllKeys(&storage))
    if (k.name == key) return *out = KnownKey{{}, k.type}, true;
  return false;
}

std::string KeyList() {
  std::vector<session::OptionKey> storage;
  std::string list;
  for (const KnownKey& k : AllKeys(&storage)) list += (list.empty() ? "" : ", ") + std::string(k.name);
  return list;
}

bool ParseBool(std::string_view v, bool* out) {
  if (v == "1" || v == "true" || v == "True" || v == "yes") return *out = true, true;
  if (v == "0" || v == "false" || v == "False" || v == "no") return *out = false, true;
  return false;
}

bool ParseInt(std::string_view v, int64_t* out) {
  if (v.empty() || v.size() > 19) return false;
  for (char c : v)
    if (c < '0' || c > '9') return false;
  errno = 0;
  long long x = std::strtoll(std::string(v).c_str(), nullptr, 10);
  if (errno != 0) return false;
  *out = x;
  return true;
}

}  // namespace

Status SetOptionFromText(std::string_view key, std::string_view value, ProfileOptions* o) {
  auto bad = [&](const char* what) {
    return InvalidArgumentError("option " + QuoteInput(key) + " takes " + what + ", got " + QuoteInput(value));
  };
  int64_t i = 0;
  bool b = false;
  if (key == "host_tracer_level" || key == "python_tracer_level" || key == "device_tracer_level") {
    if (!ParseInt(value, &i) || i > 3) return bad("a level (0-3)");
    int& field = key == "host_tracer_level"     ? o->host_tracer_level
                 : key == "python_tracer_level" ? o->python_tracer_level
                                                : o->device_tracer_level;
    field = static_cast<int>(i);
    return Status::Ok();
  }
  if (key == "buffer_bytes_per_thread" || key == "buffer_bytes_total") {
    if (!ParseInt(value, &i) || i == 0) return bad("a positive number of bytes");
    (key == "buffer_bytes_total" ? o->buffer_bytes_total : o->buffer_bytes_per_thread) = static_cast<uint64_t>(i);
    return Status::Ok();
  }
  if (key == "session_id") {
    o->session_id = std::string(value);
    return Status::Ok();
  }
  KnownKey k;
  if (!FindKey(key, &k)) {
    std::string list = "host_tracer_level, python_tracer_level, device_tracer_level, session_id, "
                       "buffer_bytes_per_thread, buffer_bytes_total, " + KeyList();
    return InvalidArgumentError("unknown option " + QuoteInput(key) + " (known: " + list + ")");
  }
  switch (k.type) {
    case ValueType::kBool:
      if (!ParseBool(value, &b)) return bad("true or false");
      o->advanced_configuration.insert_or_assign(std::string(key), AdvancedValue(b));
      break;
    case ValueType::kInt:
      if (!ParseInt(value, &i)) return bad("a non-negative integer");
      o->advanced_configuration.insert_or_assign(std::string(key), AdvancedValue(i));
      break;
    case ValueType::kString:
      o->advanced_configuration.insert_or_assign(std::string(key), AdvancedValue(std::string(value)));
      break;
  }
  return Status::Ok();
}

Status ValidateOptions(const ProfileOptions& o) {
  if (Status s = CheckLevel("host_tracer_level", o.host_tracer_level, 3); !s.ok()) return s;
  if (Status s = CheckLevel("device_tracer_level", o.device_tracer_level, 1); !s.ok()) return s;
  if (Status s = CheckLevel("python_tracer_level", o.python_tracer_level, 1); !s.ok()) return s;
  for (const auto& [key, value] : o.advanced_configuration) {
    KnownKey known;
    if (!FindKey(key, &known))
      // A key too long to quote whole is no typo: no list, so that the
      // answer to a hostile request stays short.
      return InvalidArgumentError("unknown advanced_configuration key " + QuoteInput(key) +
                                  (key.size() > kQuotedInputBytes ? std::string()
                                                                  : " (known keys: " + KeyList() + ")"));
    if (!Matches(value, known.type))
      return InvalidArgumentError("advanced_configuration key '" + key + "' takes a " + TypeName(known.type) +
                                  " value");
    if (known.type == ValueType::kInt && value.as_int() < 0)
      return InvalidArgumentError("advanced_configuration key '" + key + "' must not be negative");
    if (key == "tpu_trace_mode") {
      const std::string& m = value.as_string();
      if (m != "TRACE_ONLY_HOST" && m != "TRACE_ONLY_XLA" && m != "TRACE_COMPUTE" && m != "TRACE_COMPUTE_AND_SYNC")
        return InvalidArgumentError("advanced_configuration key 'tpu_trace_mode' must be one of TRACE_ONLY_HOST, "
                                    "TRACE_ONLY_XLA, TRACE_COMPUTE, TRACE_COMPUTE_AND_SYNC; got " + QuoteInput(m));
    }
  }
  if (Status s = session::ValidateTracerOptions(o); !s.ok()) return s;
  if (o.buffer_bytes_per_thread == 0 || o.buffer_bytes_total == 0)
    return InvalidArgumentError("buffer bounds must be positive");
  session::FlightRecorderConfig ring;
  return session::ResolveFlightRecorder(o, &ring);
}

}  // namespace spyglass::profiler

namespace spyglass::session {
namespace {

// Signals a user may choose for dumps: none that the kernel sends for a
// fault or that stops or kills the process.
int ParseDumpSignal(const std::string& name) {
  if (name == "SIGUSR1") return SIGUSR1;
  if (name == "SIGUSR2") return SIGUSR2;
  if (name == "SIGHUP") return SIGHUP;
  if (name.rfind("SIGRTMIN+", 0) == 0 && name.size() > 9 && name.size() <= 11) {
    int n = 0;
    for (char c : name.substr(9)) {
      if (c < '0' || c > '9') return -1;
      n = n * 10 + (c - '0');
    }
    return SIGRTMIN + n <= SIGRTMAX ? SIGRTMIN + n : -1;
  }
  return -1;
}

}  // namespace

Status ResolveFlightRecorder(const profiler::ProfileOptions& o, FlightRecorderConfig* out) {
  *out = FlightRecorderConfig{};
  auto num = [&](const char* key, uint64_t fallback) {
    auto it = o.advanced_configuration.find(key);
    return it != o.advanced_configuration.end() && it->second.is_int() ? static_cast<uint64_t>(it->second.as_int())
                                                                       : fallback;
  };
  out->seconds = num("spyglass_ring_buffer_seconds", o.ring_buffer_seconds);
  out->bytes = num("spyglass_ring_buffer_bytes", o.ring_buffer_bytes);
  out->slow_step_ms = num("spyglass_dump_if_step_slower_than_ms", 0);
  if (auto it = o.advanced_configuration.find("spyglass_dump_on_crash");
      it != o.advanced_configuration.end() && it->second.is_bool())
    out->dump_on_crash = it->second.as_bool();
  if (auto it = o.advanced_configuration.find("spyglass_dump_signal");
      it != o.advanced_configuration.end() && it->second.is_string() && !it->second.as_string().empty()) {
    out->dump_signal = ParseDumpSignal(it->second.as_string());
    if (out->dump_signal < 0)
      return InvalidArgumentError("advanced_configuration key 'spyglass_dump_signal' must be SIGUSR1, SIGUSR2, "
                                  "SIGHUP or SIGRTMIN+<n>; got " + QuoteInput(it->second.as_string()));
  }
  if (out->seconds == 0) return Status::Ok();
  if (out->seconds > 24 * 3600)
    return InvalidArgumentError("ring_buffer_seconds must be at most 86400 (one day), got " +
                                std::to_string(out->seconds));
  if (out->bytes < 2 * internal::kChunkBytes)
    return InvalidArgumentError("ring_buffer_bytes must be at least " + std::to_string(2 * internal::kChunkBytes) +
                                " (two buffer chunks), got " + std::to_string(out->bytes));
  return Status::Ok();
}

}  // namespace spyglass::session
