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
//
// Off-CPU (wall mode) samples get their Python frames without a signal (it
// would make the blocked call return EINTR): the reader finds the blocked
// thread's PyThreadState in the interpreter's thread list (native_thread_id
// on 3.11+; on 3.10 thread_id, a pthread_t, whose tid glibc keeps in it) and
// walks its frames with fault-tolerant copies of the process's own memory,
// taking no lock and not the GIL: a thread blocked in the kernel runs no
// Python, so its frame chain holds still (one waiting for the GIL is in
// take_gil, blocked on a futex). Their code objects too are read through
// copies (ReadCodeCopied): the thread may wake and free them meanwhile.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace spyglass::sampling {

struct CpuCapture;

// Where a code object keeps what a frame shows (CPython 3.10-3.13, found and
// checked at Enable), for reads through copies.
struct CodeLayout {
  const void* code_type = nullptr;   // &PyCode_Type
  const void* str_type = nullptr;    // &PyUnicode_Type
  const void* bytes_type = nullptr;  // &PyBytes_Type
  int co_name = -1, co_filename = -1, co_linetable = -1, co_firstlineno = -1;  // offsets in PyCodeObject
  int ascii_data = -1;  // offset of a compact ASCII string's characters
  bool table_310 = false;  // co_linetable: 3.10's (byte delta, line delta) pairs; else 3.11+'s location table
  bool ready() const {
    return code_type && str_type && bytes_type && co_name >= 0 && co_filename >= 0 && co_linetable >= 0 &&
           co_firstlineno >= 0 && ascii_data >= 0;
  }
};

// A code object's function, file and line, copied out of it.
struct CodeText {
  static constexpr size_t kMaxName = 256, kMaxFile = 1024, kMaxLineTable = 16384;  // longer: cut
  char name[kMaxName];
  char file[kMaxFile];
  size_t name_len = 0, file_len = 0;
  int line = -1;  // -1: not found (past a line table cut at kMaxLineTable, or unreadable)
  bool table_cut = false;  // the line table was longer than kMaxLineTable
  uint8_t table[kMaxLineTable];
};

// Reads code object `code`'s name, file and the line of byte offset `lasti`
// (-1: the first line) through `copy` only (a fault-tolerant copy of this
// process's memory: a short count, never a fault), each read bounded. False
// when the code object or its name or file cannot be read or are not what
// they should be (freed, unmapped): no read in place, so a code object freed
// meanwhile gives garbage or false, never a fault.
bool ReadCodeCopied(const CodeLayout& layout, long (*copy)(void* dst, uint64_t src, size_t n), const void* code,
                    int lasti, CodeText* out);

class PythonStacks {
 public:
  // Whether this process runs a CPython whose frames can be read; false
  // without a line when it runs none, else `why` says what is missing.
  // `with_signal` false: only blocked threads' frames will be read (no
  // signal taken, no rings; Arm then fails).
  bool Enable(std::string* why, bool with_signal = true);
  // The reader (wall mode): whether blocked threads' frames can be read.
  bool blocked_ready() const { return blocked_ready_; }
  // The reader: the Python frames of thread `tid`, blocked in the kernel, as
  // (code object, lasti) pairs into `code`/`lasti` (innermost first, room for
  // `max`), every read through `copy` (a fault-tolerant copy of this
  // process's memory: a short count, never a fault). 0: not a Python thread,
  // or nothing could be read.
  using CopyFn = long (*)(void* dst, uint64_t src, size_t n);
  int ReadBlocked(uint32_t tid, CopyFn copy, const void** code, int* lasti, int max) const;
  // Their frames (symbolic, interned; each code object read through `copy`,
  // as the thread may have woken and freed them: an unreadable one is
  // `<unknown>`) spliced among the native ones (return addresses, innermost
  // first) into `out` (room for `max`); returns its depth.
  int SpliceBlocked(CopyFn copy, const void* const* code, const int* lasti, int np, const uintptr_t* native, int n,
                    uintptr_t* out, int max) const;
  static constexpr int kMaxBlockedFrames = 64;
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
  bool blocked_ready_ = false;
  std::unique_ptr<CodeText> code_text_;  // the reader's buffer for a blocked frame's code object
  std::vector<uint64_t> tails_;  // per slot: the next entry to read
  std::vector<Record> records_;
  std::vector<std::vector<uintptr_t>> stacks_;
  std::map<std::vector<uintptr_t>, uint32_t> stack_ids_;  // interned: stacks_'s index
  uint64_t lost_ = 0;  // entries overwritten before they were read
};

}  // namespace spyglass::sampling
