// The capture side of the CPU sampler: perf_event_open software clock
// events, one per thread of the process, each with its own small mmap ring
// that the kernel fills with the thread's user registers and the top of its
// user stack at each sample (PERF_SAMPLE_REGS_USER | PERF_SAMPLE_STACK_USER).
// One reader thread drains the rings, unwinds each copied stack with the heap
// profiler's CFI unwinder (memory/unwind.h, UnwindCopiedStack) and interns
// the stacks. Nothing runs in the sampled threads: no signal, no handler.
//
// Threads: those in /proc/self/task at Start, and the ones created later,
// found by the reader, which lists /proc/self/task again when the thread
// count changed (checked every kRescanIntervalMs) and every kFullRescanMs (a
// per-thread ring cannot be inherited: the kernel refuses to mmap an
// inherited per-task event; a thread that lives shorter than the interval
// may be missed).
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "sampling/python_stacks.h"
#include "spyglass/status.h"

namespace spyglass::sampling {

inline constexpr int kMaxDepth = 128;               // frames kept of a stack (deeper: truncated, counted)
inline constexpr uint32_t kStackCopyBytes = 8192;    // user stack copied per sample (perf's default too)
inline constexpr size_t kMaxSamples = size_t{4} << 20;  // samples held per session (more: dropped, counted)
inline constexpr int kRescanIntervalMs = 50;   // how often the thread count is checked (a reader wake-up: ~50 us here)
inline constexpr int kFullRescanMs = 500;       // how often /proc/self/task is listed regardless

enum class SampleMode { kCpu, kWall };

// Copies up to n bytes of this process's memory at `src` (process_vm_readv,
// or /proc/self/mem where seccomp refuses it): a short count at an unmapped
// page, never a fault. Async-signal-safe (system calls only).
ssize_t CopyOwnMemory(void* dst, uint64_t src, size_t n);

struct CpuSample {
  uint64_t time_ns;    // CLOCK_MONOTONIC
  uint64_t period_ns;  // the time the sample stands for
  uint32_t tid;
  uint32_t stack;  // index into CpuCapture::stacks
};

// What a session's sampling saw.
struct CpuCapture {
  std::vector<CpuSample> samples;
  // Interned stacks: return-address form (memory/unwind.h), innermost first;
  // the first entry is the interrupted pc + 1. truncated[i]: stack i lost
  // its outer frames (depth cap, stack copy, a frame the rules cannot unwind).
  std::vector<std::vector<uintptr_t>> stacks;
  std::vector<uint8_t> truncated;
  std::map<uint32_t, std::string> thread_names;  // tid -> comm
  uint64_t lost = 0;             // samples the kernel could not write (ring full)
  uint64_t dropped = 0;          // over kMaxSamples
  uint64_t truncated_samples = 0;
  uint64_t threads_unsampled = 0;  // threads whose event or ring could not be set up
  uint64_t off_cpu_samples = 0;    // wall mode: samples of threads blocked in the kernel (a part of samples)
  uint64_t period_ns = 0;
  uint64_t unwind_ns = 0;      // the reader's time unwinding and interning (all samples)
  uint64_t reader_cpu_ns = 0;  // the reader thread's CPU time in all (draining, unwinding, rescans)
  std::string mechanism;  // one line: what samples and why
};

class CpuSampler {
 public:
  CpuSampler(uint64_t hz, SampleMode mode);
  ~CpuSampler();
  // Opens the events of every thread and starts the reader. An error: nothing
  // is sampled (perf events refused: seccomp, perf_event_paranoid=3).
  Status Start();
  // Stops sampling, drains what the rings hold; idempotent.
  void Stop();
  // After Stop: what was captured (moved out).
  CpuCapture Take();
  // After Start in wall mode: why threads off the CPU are not sampled (empty when they are).
  const std::string& wall_mode_problem() const { return wall_why_; }

 private:
  struct Ring;
  bool OpenThread(uint32_t tid, int* err);
  // The fallback where perf events are refused: a POSIX timer per thread on
  // its CPU clock, whose signal's handler copies the thread's registers and
  // stack top into a bounded slot table that the reader drains.
  bool OpenTimer(uint32_t tid, int* err);
  bool OpenAny(uint32_t tid, int* err) {
    if (mode_ == SampleMode::kWall) TrackOffCpu(tid);
    return use_timer_ ? OpenTimer(tid, err) : OpenThread(tid, err);
  }
  // Returns the slots drained; `all`: walk the table even if nothing new was counted (at Stop).
  size_t DrainTimerSlots(bool all);
  uint64_t timer_ready_seen_ = 0;
  bool timer_busy_ = false;
  // The timer fallback arms its CPU-clock timers at this period or below (see ExpandTimerObservations).
  static constexpr uint64_t kTimerArmNs = 500000;
  uint64_t timer_period_ns() const { return std::min(period_ns_, kTimerArmNs); }
  // The timer's observations become samples at Stop, each weighing its
  // thread's mean number of periods per observation (see DrainTimerSlots).
  void ExpandTimerObservations();
  // Wall mode: the reader, about every period of wall time, reads each
  // thread's /proc/self/task/<tid>/syscall and schedstat; a thread blocked in
  // the kernel shows its user sp and pc there, its stack is copied with
  // process_vm_readv and unwound. No signal: the blocked system call is left
  // alone. At a look that finds it blocked, its time blocked since the last
  // such look (wall - on a CPU - waiting for one: schedstat's figures are
  // exact for a thread that is not running) becomes samples of that stack.
  void TrackOffCpu(uint32_t tid);
  void SampleOffCpu(uint64_t now_ns);
  void ReaderLoop();
  void Rescan();
  void DrainAll();
  void Drain(Ring& r);
  void HandleSample(const uint8_t* rec, size_t size);
  uint32_t Intern(const uintptr_t* frames, int n, bool truncated);

  uint64_t hz_;
  SampleMode mode_;
  uint64_t period_ns_ = 0;
  std::vector<std::unique_ptr<Ring>> rings_;  // the reader's only, after Start
  std::unordered_map<uint32_t, bool> known_tids_;
  std::thread reader_;
  std::atomic<bool> stop_{false};
  int wake_fd_ = -1;
  uint32_t reader_tid_ = 0;
  bool started_ = false, stopped_ = false;
  CpuCapture cap_;
  std::unordered_map<std::string, uint32_t> stack_ids_;  // frames as bytes -> index
  std::vector<uint8_t> scratch_;
  PythonStacks python_;  // Python frames at sample time (python_stacks.h)
  bool python_on_ = false;
  bool python_blocked_ = false;  // wall mode: off-CPU samples get Python frames (python_.ReadBlocked)
  bool use_timer_ = false;
  std::vector<std::pair<uint32_t, void*>> timers_;  // tid, timer_t
  struct TimerObservation {
    uint64_t time_ns;
    uint32_t tid, stack, periods;
  };
  std::vector<TimerObservation> timer_obs_;
  uint64_t timer_obs_periods_ = 0;  // the samples they will become (bounded with cap_.samples)
  struct OffCpuThread {
    uint32_t tid;
    int fd;                // /proc/self/task/<tid>/syscall, kept open (re-read from offset 0)
    int sched_fd;          // /proc/self/task/<tid>/schedstat: ns on a CPU, ns waiting for one
    std::string last;      // the syscall text of the last blocked look
    uint32_t last_stack;   // that look's stack: a thread still blocked in the same call keeps it
    bool blocked = false;  // at the last look
    bool have_base = false;
    uint64_t wall_ns = 0, run_ns = 0, wait_ns = 0;  // at the first look
    uint64_t counted_ns = 0;  // blocked time since then already turned into samples (or owed)
    uint64_t owed_ns = 0;     // blocked time not yet a whole sample
  };
  std::vector<OffCpuThread> off_threads_;
  std::vector<CpuSample> off_samples_;  // appended to cap_.samples at Stop, after Python frames are merged
  uint64_t next_off_ns_ = 0, jitter_state_ = 0x9e3779b97f4a7c15ull;
  bool wall_on_ = false;
  std::string wall_why_;  // why off-CPU samples are not taken, when they are not
};

// Reads /proc/sys/kernel/perf_event_max_sample_rate (100000 when unreadable).
uint64_t MaxSampleRate();

}  // namespace spyglass::sampling
