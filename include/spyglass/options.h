// Options of a profiling session, with the names and defaults of
// jax.profiler.ProfileOptions / tensorflow.ProfileOptions.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <type_traits>
#include <variant>

#include "spyglass/api.h"
#include "spyglass/status.h"

namespace spyglass::profiler {

// A value of ProfileOptions::advanced_configuration: bool, int64 or string,
// as AdvancedConfigValue on the wire.
class AdvancedValue {
 public:
  AdvancedValue(bool v) : v_(v) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  AdvancedValue(T v) : v_(static_cast<int64_t>(v)) {}
  AdvancedValue(const char* v) : v_(std::string(v)) {}
  AdvancedValue(std::string v) : v_(std::move(v)) {}

  const std::variant<bool, int64_t, std::string>& value() const { return v_; }
  bool is_bool() const { return v_.index() == 0; }
  bool is_int() const { return v_.index() == 1; }
  bool is_string() const { return v_.index() == 2; }
  bool as_bool() const { return std::get<bool>(v_); }
  int64_t as_int() const { return std::get<int64_t>(v_); }
  const std::string& as_string() const { return std::get<std::string>(v_); }
  bool operator==(const AdvancedValue&) const = default;

 private:
  std::variant<bool, int64_t, std::string> v_;
};

struct ProfileOptions {
  bool include_dataset_ops = true;
  // TraceMe levels: an annotation of level L is recorded iff L <= this.
  // 0: no host events, 1: user annotations, 2: + runtime, 3: + verbose.
  int host_tracer_level = 2;
  int device_tracer_level = 1;  // 0 off, 1 on
  int python_tracer_level = 0;  // 0 off, 1 on (the Python package defaults to 1, as JAX)
  bool enable_hlo_proto = true;
  uint64_t start_timestamp_ns = 0;  // 0: start now; else wait until this Unix time
  uint64_t duration_ms = 0;         // used by remote captures
  std::string repository_path;
  bool raise_error_on_start_failure = false;
  std::string session_id;  // run directory name; empty: a timestamp
  // Free-form options, validated against the known keys (see
  // src/session/options.cc); an unknown key fails start_trace.
  std::map<std::string, AdvancedValue> advanced_configuration;

  // Bounds of the in-memory event buffers. What does not fit is dropped and
  // counted in the output. Also settable as advanced keys
  // "spyglass_buffer_bytes_per_thread" / "spyglass_buffer_bytes_total".
  uint64_t buffer_bytes_per_thread = 256ull << 20;
  uint64_t buffer_bytes_total = 1ull << 30;

  // Flight recorder (ring-buffer mode), on when ring_buffer_seconds > 0: the
  // session records continuously into at most ring_buffer_bytes of buffers,
  // overwriting its oldest events (the count overwritten is kept and shown),
  // and dump_flight_recorder (profiler.h) writes the last ring_buffer_seconds
  // as a normal run without stopping it; stop_trace writes them too. Also
  // settable as advanced keys "spyglass_ring_buffer_seconds" /
  // "spyglass_ring_buffer_bytes". Other triggers are advanced keys:
  // "spyglass_dump_signal" (e.g. "SIGUSR1"), "spyglass_dump_if_step_slower_than_ms",
  // "spyglass_dump_on_crash" (default true); see docs/tracing.md.
  uint64_t ring_buffer_seconds = 0;
  uint64_t ring_buffer_bytes = 64ull << 20;
};

// Checks levels and advanced_configuration keys and value types.
SPYGLASS_API Status ValidateOptions(const ProfileOptions& options);

// stop_trace with a Perfetto link never blocks longer than this by default.
inline constexpr int kDefaultPerfettoLinkTimeoutS = 300;

struct TraceOptions {
  bool create_perfetto_link = false;
  bool create_perfetto_trace = false;
  ProfileOptions profiler_options = {};
  // How long the Perfetto link server waits for the browser before stop_trace
  // returns DeadlineExceeded (the files are written by then); 0 waits until
  // fetched, as JAX does.
  int perfetto_link_timeout_s = kDefaultPerfettoLinkTimeoutS;
  // Checked every 100 ms while the link waits; returning true ends the wait
  // with Cancelled. No signal handler is installed for the wait.
  std::function<bool()> perfetto_link_cancelled;
};

}  // namespace spyglass::profiler
