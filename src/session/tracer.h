// The one interface every tracer implements (host, Python, device, memory
// timeline, subprocesses), and the one way tracers join a session.
//
// A tracer lives in its own file and registers itself with one line at
// namespace scope there (see src/trace/host_tracer.cc):
//
//   SPYGLASS_REGISTER_TRACER(host, session::kRankHost, MakeHostTracer);
//
// A tracer with options of its own (advanced_configuration keys) registers
// them with it (see src/gpu/gpu_tracer.cc):
//
//   SPYGLASS_REGISTER_TRACER_WITH_OPTIONS(device, session::kRankDevice,
//                                         MakeGpuTracer, GpuOptionSpec());
//
// ValidateOptions and SPYGLASS_OPTIONS's parser then accept those keys with
// their types and run the tracer's validation; the session knows no tracer's
// keys.
//
// A tracer that works only after some setup calls RegisterTracer itself once
// the setup is done (the Python tracer, at module init).
//
// The factory runs at every Session::Create and returns nullptr when the
// session's options turn the tracer off. A session then
//   - starts its tracers in rank order (lower first),
//   - stops them in the reverse order,
//   - calls CollectData in rank order (the host plane exists before tracers
//     that add lines to it), then AddStats on each.
// Registration time does not matter: a tracer registered late (the Python
// extension, at module init) still takes its rank's place in every session
// created after it. Tracers registered while a session runs join the next one.
//
// Linking: the registrar is a static object, run when its library is loaded,
// before the other initializers of that library.
// Every tracer is compiled into the shared libspyglass.so, so all of them run.
// In a STATIC archive the linker drops an object file nothing references, and
// its registrar with it: a tracer moved into one needs a reference from the
// session (or --whole-archive).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/xspace.h"
#include "spyglass/options.h"
#include "spyglass/status.h"

namespace spyglass::session {

// What a session reports about its capture (public: profiler::TraceStats).
struct SessionSummary {
  uint64_t events = 0;
  uint64_t dropped_events = 0;
  uint64_t incomplete_events = 0;
  uint64_t threads = 0;
  uint64_t cpu_samples = 0;
};

// The session's zero, read back to back just before the first tracer starts:
// every tracer counts its times from it, so that all of them (and a merged
// XLA trace) share one time base, however long the tracers before them take
// to start.
struct SessionZero {
  uint64_t wall_ns = 0;  // the Task Environment's profile_start_time
  uint64_t ticks = 0;    // spyglass::internal::now_ticks() at the same moment
  uint64_t mono_ns = 0;  // CLOCK_MONOTONIC then (the CPU sampler's clock)
};

class Session;

class Tracer {
 public:
  virtual ~Tracer() = default;
  // Set by the session before Start.
  const SessionZero& zero() const { return zero_; }
  // An error fails Session::Create only with raise_error_on_start_failure;
  // otherwise the session runs on and Stop/CollectData are still called.
  virtual Status Start() = 0;
  // Called once for every tracer whose Start was called, failed or not; when
  // a Start error fails Create, the tracers after it are neither started nor
  // stopped.
  virtual Status Stop() = 0;
  // Called after Stop, once: writes what the tracer saw into the model.
  virtual Status CollectData(model::Space* space) = 0;
  // Flight recorder, while the tracer runs: writes what it holds of the
  // window [since_ticks, now_ticks] (recorder ticks) into the model and runs
  // on. Tracers that keep no ring add nothing.
  virtual Status Snapshot(model::Space* /*space*/, uint64_t /*since_ticks*/, uint64_t /*now_ticks*/) {
    return Status::Ok();
  }
  // Called after CollectData: adds this tracer's counts to the summary.
  virtual void AddStats(SessionSummary* /*summary*/) const {}

 private:
  friend class Session;
  SessionZero zero_;
};

// Start order (lower first). Gaps leave room for new tracers.
enum TracerRank : int {
  // Remote captures of registered children: started first and stopped last,
  // so that waiting for the children's replies is not recorded on the host.
  kRankSubprocesses = 50,
  kRankHost = 100,             // the recorder behind TraceAnnotation
  kRankPython = 200,           // records into the host recorder: needs it running
  kRankDevice = 300,           // GPU tracers (src/gpu/gpu_tracer.cc)
  kRankMemoryTimeline = 400,   // live-bytes counters on the host plane
};

// The type of an advanced_configuration value.
enum class OptionType { kBool, kInt, kString };
struct OptionKey {
  std::string name;
  OptionType type;
};
// What a tracer adds to option checking: its keys (types checked, negative
// ints refused, by ValidateOptions) and a check of their values (ranges,
// words), called by every ValidateOptions; it names the key it refuses.
struct TracerOptionSpec {
  std::vector<OptionKey> keys;
  std::function<Status(const profiler::ProfileOptions&)> validate;
};

// Makes a tracer for a session's options, or nullptr when they turn it off.
using TracerFactory = std::function<std::unique_ptr<Tracer>(const profiler::ProfileOptions&)>;

// Adds a tracer to every later session. `name` is unique: a second
// registration under the same name is ignored and returns false. Equal ranks
// start in name order.
bool RegisterTracer(const std::string& name, int rank, TracerFactory factory, TracerOptionSpec options = {});

// The keys every registered tracer declared (tracers in rank order).
std::vector<OptionKey> RegisteredOptionKeys();
// Runs every registered tracer's validation; the first error.
Status ValidateTracerOptions(const profiler::ProfileOptions& options);

// One tracer of each registered kind that `options` turn on, in rank order
// (what Session::Create starts).
std::vector<std::unique_ptr<Tracer>> CreateTracers(const profiler::ProfileOptions& options);

// In a forked child: the registry's lock may have been held by a parent thread.
void TracerRegistryAfterForkChild();

// For SPYGLASS_REGISTER_TRACER: an initialization priority (101-65535 are the
// program's; lower runs first, all before the default).
inline constexpr int kTracerRegistrationPriority = 1000;
struct TracerRegistrar {
  TracerRegistrar(const char* name, int rank, TracerFactory factory, TracerOptionSpec options = {}) {
    RegisterTracer(name, rank, std::move(factory), std::move(options));
  }
};

}  // namespace spyglass::session

// Registers a tracer at load time; use once at namespace scope in the
// tracer's .cc. `name` is an identifier (it also names the registrar object).
// The registrars run before any initializer of default priority, whatever the
// link order: a session started at load (src/session/env_init.cc) has every
// tracer of its library.
#define SPYGLASS_REGISTER_TRACER(name, rank, factory)                                                   \
  __attribute__((init_priority(::spyglass::session::kTracerRegistrationPriority))) static ::spyglass::session::TracerRegistrar \
      spyglass_tracer_registrar_##name(#name, rank, factory)

// The same with the tracer's options (a TracerOptionSpec).
#define SPYGLASS_REGISTER_TRACER_WITH_OPTIONS(name, rank, factory, options)                             \
  __attribute__((init_priority(::spyglass::session::kTracerRegistrationPriority))) static ::spyglass::session::TracerRegistrar \
      spyglass_tracer_registrar_##name(#name, rank, factory, options)
