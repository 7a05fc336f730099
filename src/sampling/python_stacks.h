// Python frames in the CPU sampler's samples.
//
// The kernel takes a sample's native stack; the Python frames of the moment
// live in the interpreter's memory of the sampled thread and are gone by the
// time the reader thread reads the sample. So they are captured at sample
// time, on the sampled thread: each thread's perf event also delivers a
// realtime signal to that thread at every sample (F_SETOWN_EX F_OWNER_TID,
// F_SETSIG, O_ASYNC). The kernel takes samples only while the thread runs in
// user space, and the signal is delivered on that same return to user space:
// no system call of the program is interrupted by it (and the handler is
// SA_RESTART all the same). The handler reads the thread's frames in place
// (memory/python_frames.h: no call into Python, no allocation, no lock; the
// names interned in the memory tracker's lock-free function table) into a
// bounded ring of the thread's own, stamped with CLOCK_MONOTONIC. The reader
// drains those rings with the perf rings; at the end each sample takes the
// first record of its thread stamped at or after its time and before the
// thread's next sample, and its Python frames are spliced among its native
// ones at the eval loop's frames, as the heap hook does.
//
// CPython 3.10-3.13 with the GIL (not the free-threaded build); the layouts
// are checked at Enable against the public C API on a live stack, with the
// GIL taken. A thread without a thread state (not Python's) records nothing.
// The handler stays installed after the session (a no-op then): a signal
// still queued for a thread must not meet the default action (termination).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace spyglass::sampling {

struct CpuCapture;

class PythonStacks {
 public:
  // Whether this process runs a CPython whose frames can be read; false
  // without a line when it runs none, else `why` says what is missing.
  bool Enable(std::string* why);
  // Thread `tid`'s perf event `fd` signals it at each sample from now on.
  bool Arm(int fd, uint32_t tid);
  // The reader: moves what the threads recorded out of their rings.
  void Drain();
  // Stops recording (events may still be open).
  void Disable();
  // The Python frames into the capture's stacks (after Disable and the last Drain).
  void Merge(CpuCapture* cap);
  int signal_number() const { return signo_; }
  uint64_t records() const { return records_.size(); }
  uint64_t lost() const { return lost_; }

 private:
  struct Record {
    uint64_t time_ns;
    uint32_t tid;
    uint32_t stack;  // into stacks_
  };
  int signo_ = 0;
  std::vector<uint64_t> tails_;  // per slot: the next entry to read
  std::vector<Record> records_;
  std::vector<std::vector<uintptr_t>> stacks_;
  std::map<std::vector<uintptr_t>, uint32_t> stack_ids_;  // interned: stacks_'s index
  uint64_t lost_ = 0;  // entries overwritten before they were read
};

}  // namespace spyglass::sampling
