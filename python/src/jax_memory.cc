// JAX's device bytes on the memory timeline: while a session runs,
// spyglass.profiler samples what PJRT exposes (profiler.py, _jax_device_bytes)
// on a Python thread of its own and pushes each value here; at the stop they
// become counter events "jax memory <device>" (stat live_bytes) on the
// _counters_ line of /host:CPU, beside the memory tracer's "memory <device>".
//
// The tracer has no thread and never takes the GIL: a Python thread samples
// (_jax_memory_run), so stopping a session cannot wait for the interpreter.
#include "jax_memory.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <atomic>
#include <chrono>
#include <new>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/clock.h"
#include "model/schema.h"
#include "model/xspace.h"
#include "session/tracer.h"
#include "spyglass/internal/recorder.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace spyglass::python {
namespace {

constexpr size_t kMaxSamples = 200000;  // per session: 10 ms apart, over half an hour

struct Sample {
  uint64_t ticks;
  uint32_t device;  // index into Pushed::devices
  int64_t bytes;
};

// What the Python sampler pushed during the running session.
struct Pushed {
  std::mutex mu;
  std::condition_variable opened;  // the sampler thread waits on it between sessions
  bool open = false;
  std::vector<std::string> devices;
  std::vector<Sample> samples;
  uint64_t dropped = 0;
};

Pushed& pushed() {
  static auto* p = new Pushed;  // never destroyed: a late push at exit finds it
  return *p;
}

class JaxMemoryTracer : public session::Tracer {
 public:
  Status Start() override {
    Pushed& p = pushed();
    std::lock_guard<std::mutex> lock(p.mu);
    p.open = true;
    p.devices.clear();
    p.samples.clear();
    p.dropped = 0;
    start_ticks_ = zero().ticks;
    p.opened.notify_all();
    return Status::Ok();
  }
  Status Stop() override {
    Pushed& p = pushed();
    std::lock_guard<std::mutex> lock(p.mu);
    p.open = false;
    p.opened.notify_all();  // the sampler's wait for the end
    devices_.swap(p.devices);
    samples_.swap(p.samples);
    dropped_ = p.dropped;
    return Status::Ok();
  }
  Status CollectData(model::Space* space) override {
    if (samples_.empty()) return Status::Ok();
    spyglass::internal::TickConverter clock = spyglass::internal::TickConverter::Calibrate();
    model::Plane& host = space->plane(model::kHostPlaneName);
    model::Line& line = host.line_with_id(INT64_MAX);  // the memory tracer's counter line
    line.name = line.display_name = std::string(model::kCounterLineName);
    line.timestamp_ns = 0;
    std::vector<uint32_t> md;
    for (const std::string& d : devices_) md.push_back(host.intern_event("jax memory " + d));
    for (const Sample& s : samples_) {
      model::Event e;
      e.offset_ps = s.ticks <= start_ticks_ ? 0 : clock.ns_between(start_ticks_, s.ticks) * 1000;
      e.metadata_id = md[s.device];
      line.add_stat(e, host.int_stat(model::kLiveBytesStat, s.bytes));
      line.events.push_back(e);
    }
    line.sort_events();
    host.stats.push_back(host.uint_stat("jax_memory_samples_dropped", dropped_));
    return Status::Ok();
  }

 private:
  uint64_t start_ticks_ = 0;
  std::vector<std::string> devices_;
  std::vector<Sample> samples_;
  uint64_t dropped_ = 0;
};

std::atomic<bool> g_runner_ready{false}, g_runner_exit{false};

std::mutex& SampleMutex() {
  static auto* m = new std::mutex;  // never destroyed
  return *m;
}

// False when no session runs (the sampler then stops).
bool Push(const std::string& device, int64_t bytes) {
  const uint64_t now = spyglass::internal::now_ticks();
  Pushed& p = pushed();
  std::lock_guard<std::mutex> lock(p.mu);
  if (!p.open) return false;
  if (p.samples.size() >= kMaxSamples) {
    ++p.dropped;
    return true;
  }
  uint32_t index = 0;
  while (index < p.devices.size() && p.devices[index] != device) ++index;
  if (index == p.devices.size()) p.devices.push_back(device);
  p.samples.push_back({now, index, bytes});
  return true;
}

}  // namespace

void BindJaxMemory(nb::module_& m) {
  // Sessions of every kind (start_trace, a remote capture, the environment)
  // get the tracer; it records only what the Python sampler pushes.
  session::RegisterTracer("jax_memory", session::kRankMemoryTimeline + 10,
                          [](const profiler::ProfileOptions&) -> std::unique_ptr<session::Tracer> {
                            return std::make_unique<JaxMemoryTracer>();
                          });
  m.def("_jax_memory_push", [](const std::vector<std::pair<std::string, int64_t>>& values) {
    bool open = true;
    for (const auto& [device, bytes] : values) open = Push(device, bytes) && open;
    return open;
  }, "values"_a, "Records JAX's live bytes per device now; False when no session runs.");
  // The sampler thread's body: waits for a session without the GIL, then
  // calls step() (Python, marked untraced) with the sample lock held, pauses
  // as long as it returns (seconds; None: no more for this session), and so
  // on until the session ends. step() is entered from here, never from a
  // Python frame of this thread, and the sample lock keeps sessions started
  // and stopped from Python (_jax_memory_lock) from beginning or ending while
  // it runs: the Python tracer sees each step whole, as untraced, or not at
  // all. Returns when _jax_memory_runner_exit() is called (at exit).
  m.def("_jax_memory_run", [](nb::callable step) {
    Pushed& p = pushed();
    g_runner_ready.store(true);
    auto wait_until = [&](auto pred, double timeout_s) {
      nb::gil_scoped_release release;
      std::unique_lock<std::mutex> lock(p.mu);
      if (timeout_s < 0) {
        p.opened.wait(lock, pred);
      } else {
        p.opened.wait_for(lock, std::chrono::duration<double>(timeout_s), pred);
      }
    };
    auto exiting = [] { return g_runner_exit.load(); };
    for (;;) {
      wait_until([&] { return p.open || exiting(); }, -1);
      if (exiting()) return;
      for (;;) {
        std::unique_lock<std::mutex> sample(SampleMutex(), std::defer_lock);
        {
          nb::gil_scoped_release release;  // another thread may hold it while it starts a session
          sample.lock();
        }
        double pause = -1;
        try {
          nb::object r = step();
          if (!r.is_none()) pause = nb::cast<double>(r);
        } catch (nb::python_error& e) {
          e.restore();  // step() catches its own errors: this one ends the session's sampling, quietly
          PyErr_Clear();
        } catch (const std::exception&) {
        }
        sample.unlock();
        if (pause < 0) break;
        wait_until([&] { return !p.open || exiting(); }, pause);
        if (exiting()) return;
        if (!p.open) break;
      }
      wait_until([&] { return !p.open || exiting(); }, -1);  // not again for this session
      if (exiting()) return;
    }
  }, "step"_a);
  m.def("_jax_memory_runner_ready", [] { return g_runner_ready.load(); });
  m.def("_jax_memory_runner_exit", [] {
    g_runner_exit.store(true);
    Pushed& p = pushed();
    std::lock_guard<std::mutex> lock(p.mu);
    p.opened.notify_all();
  });
  // Held by start()/stop() of profiler.py around the core's start and stop.
  m.def("_jax_memory_lock", [] {
    nb::gil_scoped_release release;  // the sampler may hold it while it waits for the GIL
    SampleMutex().lock();
  });
  m.def("_jax_memory_unlock", [] { SampleMutex().unlock(); });
  m.def("_jax_memory_after_fork_child", [] {
    // The runner thread is gone; a lock it held stays held in the child.
    new (&SampleMutex()) std::mutex;
    Pushed& p = pushed();
    new (&p.mu) std::mutex;
    new (&p.opened) std::condition_variable;
    p.open = false;
    g_runner_ready.store(false);
    g_runner_exit.store(false);
  });
  m.def("_jax_memory_open", [] {
    Pushed& p = pushed();
    std::lock_guard<std::mutex> lock(p.mu);
    return p.open;
  });
}

}  // namespace spyglass::python
