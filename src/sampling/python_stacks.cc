#include "sampling/python_stacks.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string_view>

#include "memory/python_frames.h"
#include "memory/tracker.h"
#include "sampling/cpu_sampler.h"

namespace spyglass::sampling {
namespace {

namespace pf = memory::python_frames;
using pf::At;

constexpr int kMaxPythonFrames = 64;
constexpr uint32_t kSlots = 1024;  // threads recorded per session (more: their samples stay native)
constexpr uint32_t kEntries = 64;  // per thread: 16 ms at 4 kHz; the reader drains every few ms
constexpr uint64_t kMaxRecords = size_t{4} << 20;

struct Entry {
  uint64_t time_ns;
  uint32_t n;
  uintptr_t frames[kMaxPythonFrames];
};
struct Slot {
  std::atomic<uint32_t> tid;
  std::atomic<uint64_t> head;  // entries written (the handler's)
  Entry entries[kEntries];
};

// What the handler reads; set by Enable before any event signals.
struct Handler {
  std::atomic<bool> on{false};
  Slot* slots = nullptr;  // kSlots, mmap'd once, touched as used
  pf::RawLayout layout{};
  const void* code_type = nullptr;
  const void* str_type = nullptr;
  int co_name = -1, co_filename = -1;  // offsets in PyCodeObject
  int ascii_data = -1;                 // offset of a compact ASCII string's characters
  void* (*this_thread_state)() = nullptr;
  int (*addr2line)(const void*, int) = nullptr;
};
Handler g;

// Where the reader finds a blocked thread's state (set by Enable, GIL held).
struct ThreadList {
  const void* interp = nullptr;  // the main interpreter
  int head = -1;                 // offset of its first thread state (threads.head, 3.10's tstate_head)
  int next = -1;                 // PyThreadState.next
  int native_tid = -1;           // PyThreadState.native_thread_id (3.11+), or -1
  int thread_id = -1;            // PyThreadState.thread_id: the pthread_t
  int pthread_tid = -1;          // 3.10: glibc's struct pthread's tid, at pthread_t
};
ThreadList g_threads;
uintptr_t g_eval_lo = 0, g_eval_hi = 0;
CodeLayout g_code;  // blocked threads' code objects, read through copies

// PyCodeObject.co_firstlineno (checked at Enable against PyCode_Addr2Line(code, -1)).
int FirstLineOffset(unsigned minor) {
  switch (minor) {
    case 10: return 40;
    case 11: return 72;
    case 12:
    case 13: return 68;
    default: return -1;
  }
}
constexpr int kBytesSize = 16, kBytesData = 32;  // PyBytesObject: ob_size, ob_sval (3.10-3.13)

using CopyFn = PythonStacks::CopyFn;

bool CopyExact(CopyFn copy, void* dst, const void* src, size_t n) {
  return src != nullptr && copy(dst, reinterpret_cast<uint64_t>(src), n) == static_cast<long>(n);
}

// A str's characters through copies, cut at `cap`; its length, or -1.
long CopyStr(const CodeLayout& L, CopyFn copy, const void* s, char* out, size_t cap) {
  unsigned char head[40];  // ob_refcnt, ob_type, length, hash, state
  if (!CopyExact(copy, head, s, sizeof head) || At<const void*>(head, sizeof(intptr_t)) != L.str_type) return -1;
  const int64_t len = At<int64_t>(head, 2 * sizeof(intptr_t));
  const uint32_t state = At<uint32_t>(head, 4 * sizeof(intptr_t));
  const bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  const char* chars = nullptr;
  int64_t n = -1;
  if (compact && ascii) {
    chars = static_cast<const char*>(s) + L.ascii_data;
    n = len;
  } else if (compact) {  // PyCompactUnicodeObject: utf8_length, utf8 right after the ASCII header
    unsigned char utf8[16];
    if (!CopyExact(copy, utf8, static_cast<const char*>(s) + L.ascii_data, sizeof utf8)) return -1;
    n = At<int64_t>(utf8, 0);
    chars = At<const char*>(utf8, 8);
  }
  if (chars == nullptr || n < 0) {
    static constexpr char kNonAscii[] = "<non-ascii>";
    std::memcpy(out, kNonAscii, std::min(cap, sizeof kNonAscii - 1));
    return static_cast<long>(std::min(cap, sizeof kNonAscii - 1));
  }
  const size_t take = std::min(cap, static_cast<size_t>(n));
  if (take > 0 && !CopyExact(copy, out, chars, take)) return -1;
  return static_cast<long>(take);
}

// 3.10: (byte delta, line delta) pairs, -128: no line (Objects/lnotab_notes.txt).
int LineOf310(const uint8_t* t, size_t n, int line, int lasti) {
  int ar_line = -1;
  int64_t start = 0, end = 0;
  size_t i = 0;
  while (end <= lasti) {
    do {  // ranges of no bytes are skipped
      if (i + 2 > n) return -1;
      start = end;
      end += t[i];
      const int delta = static_cast<int8_t>(t[i + 1]);
      i += 2;
      if (delta == -128) {
        ar_line = -1;
      } else {
        line += delta;
        ar_line = line;
      }
    } while (start == end);
  }
  return ar_line;
}

// 3.11+: the location table (Objects/locations.md): entries of one byte
// (bit 7 set; code in bits 3-6; code units - 1 in bits 0-2) and their data.
int LineOf311(const uint8_t* t, size_t n, int line, int lasti) {
  int ar_line = -1;
  int64_t end = 0;
  size_t i = 0;
  while (end <= lasti) {
    if (i >= n) return -1;
    const uint8_t b = t[i];
    const int code = (b >> 3) & 15;
    int delta = 0;
    if (code == 13 || code == 14) {  // no columns, long form: a signed varint of the line delta
      uint32_t v = 0;
      int shift = 0;
      for (size_t j = i + 1; j < n && shift < 32; ++j, shift += 6) {
        v |= static_cast<uint32_t>(t[j] & 63) << shift;
        if (!(t[j] & 64)) break;
      }
      delta = (v & 1) ? -static_cast<int>(v >> 1) : static_cast<int>(v >> 1);
    } else if (code >= 10 && code <= 12) {  // one line form: the delta is in the code
      delta = code - 10;
    }
    line += delta;
    ar_line = code == 15 ? -1 : line;
    end += ((b & 7) + 1) * 2;
    do ++i;
    while (i < n && (t[i] & 128) == 0);
  }
  return ar_line;
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

Slot* SlotOf(uint32_t tid) {
  for (uint32_t i = 0; i < kSlots; ++i) {
    Slot& s = g.slots[(tid + i) % kSlots];
    const uint32_t t = s.tid.load(std::memory_order_acquire);
    if (t == tid) return &s;
    if (t == 0) return nullptr;
  }
  return nullptr;
}

// A str's characters in place: compact ASCII ones (what names and paths
// nearly always are), or a compact one whose UTF-8 form was already made.
std::string_view StrOf(const void* s) {
  if (s == nullptr || At<const void*>(s, sizeof(intptr_t)) != g.str_type) return "<unknown>";
  const int64_t len = At<int64_t>(s, 2 * sizeof(intptr_t));
  const uint32_t state = At<uint32_t>(s, 4 * sizeof(intptr_t));
  const bool compact = (state >> 5) & 1, ascii = (state >> 6) & 1;
  if (len < 0) return "<unknown>";
  if (compact && ascii) return {static_cast<const char*>(s) + g.ascii_data, static_cast<size_t>(len)};
  if (compact) {  // PyCompactUnicodeObject: utf8_length, utf8 right after the ASCII header
    const int64_t n = At<int64_t>(s, g.ascii_data);
    const char* utf8 = At<const char*>(s, g.ascii_data + 8);
    if (utf8 != nullptr && n >= 0) return {utf8, static_cast<size_t>(n)};
  }
  return "<non-ascii>";
}

uintptr_t FrameOf(const void* code, int lasti) {
  const uint32_t fn = memory::internal::InternFunction(StrOf(At<const void*>(code, g.co_name)),
                                                      StrOf(At<const void*>(code, g.co_filename)));
  return memory::internal::SymbolicFrame(fn, g.addr2line(code, lasti));
}

// A frame of a blocked thread, its code object read through copies.
uintptr_t FrameOfCopied(CopyFn copy, const void* code, int lasti, CodeText* text) {
  if (!ReadCodeCopied(g_code, copy, code, lasti, text))
    return memory::internal::SymbolicFrame(memory::internal::InternFunction("<unknown>", ""), 0);
  const uint32_t fn = memory::internal::InternFunction(std::string_view(text->name, text->name_len),
                                                      std::string_view(text->file, text->file_len));
  return memory::internal::SymbolicFrame(fn, text->line);
}

void OnSample(int, siginfo_t*, void*) {
  if (!g.on.load(std::memory_order_acquire)) return;
  const int saved_errno = errno;
  const uint64_t now = MonotonicNs();
  if (Slot* s = SlotOf(static_cast<uint32_t>(syscall(SYS_gettid)))) {
    // The thread's own state, GIL held or not: its frames change only when it runs, and it is here.
    if (const void* ts = g.this_thread_state()) {
      const uint64_t h = s->head.load(std::memory_order_relaxed);
      Entry& e = s->entries[h % kEntries];
      uint32_t n = 0;
      pf::WalkRaw(ts, g.layout, g.code_type, kMaxPythonFrames, [&](const void* code, int lasti) {
        e.frames[n++] = FrameOf(code, lasti);
        return true;
      });
      e.n = n;
      e.time_ns = now;
      s->head.store(h + 1, std::memory_order_release);
    }
  }
  errno = saved_errno;
}

template <typename F>
bool Find(F* out, const char* name) {
  *out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

// libpython's functions for the checks at Enable (GIL held).
struct Api {
  int (*is_initialized)();
  int (*gil_ensure)();
  void (*gil_release)(int);
  void* (*interp_head)();
  void* (*thread_head)(void*);
  void* (*thread_next)(void*);
  void* (*get_frame)(void*);
  void* (*frame_back)(void*);
  void* (*frame_code)(void*);
  int (*frame_line)(void*);
  void* (*getattr)(void*, const char*);
  const char* (*utf8)(void*, ssize_t*);
  void (*decref)(void*);
  void (*err_clear)();
};

bool ResolveApi(Api* a) {
  return Find(&a->is_initialized, "Py_IsInitialized") && Find(&a->gil_ensure, "PyGILState_Ensure") &&
         Find(&a->gil_release, "PyGILState_Release") && Find(&a->interp_head, "PyInterpreterState_Head") &&
         Find(&a->thread_head, "PyInterpreterState_ThreadHead") && Find(&a->thread_next, "PyThreadState_Next") &&
         Find(&a->get_frame, "PyThreadState_GetFrame") && Find(&a->frame_back, "PyFrame_GetBack") &&
         Find(&a->frame_code, "PyFrame_GetCode") && Find(&a->frame_line, "PyFrame_GetLineNumber") &&
         Find(&a->getattr, "PyObject_GetAttrString") && Find(&a->utf8, "PyUnicode_AsUTF8AndSize") &&
         Find(&a->decref, "Py_DecRef") && Find(&a->err_clear, "PyErr_Clear") &&
         Find(&g.this_thread_state, "PyGILState_GetThisThreadState") && Find(&g.addr2line, "PyCode_Addr2Line");
}

// The offset of the pointer `field` in `obj`'s first bytes, or -1.
int OffsetOf(const void* obj, const void* field) {
  for (int off = 2 * static_cast<int>(sizeof(intptr_t)); off < 512; off += sizeof(intptr_t))
    if (At<const void*>(obj, off) == field) return off;
  return -1;
}

// With the GIL: each thread's frames read through the public API and in
// place must agree (code objects, lines), and the code objects' names must be
// found. Sets the name offsets. Returns the frames compared (0: none to compare).
int CheckLayout(const Api& a, std::string* why) {
  int compared = 0;
  for (void* interp = a.interp_head(); interp != nullptr && compared == 0; interp = nullptr) {
    for (void* ts = a.thread_head(interp); ts != nullptr; ts = a.thread_next(ts)) {
      std::vector<std::pair<const void*, int>> raw;
      pf::WalkRaw(ts, g.layout, g.code_type, kMaxPythonFrames, [&](const void* code, int lasti) {
        raw.emplace_back(code, g.addr2line(code, lasti));
        return true;
      });
      size_t i = 0;
      bool same = true;
      void* f = a.get_frame(ts);  // new reference
      while (f != nullptr && i < kMaxPythonFrames) {
        void* code = a.frame_code(f);
        if (i >= raw.size() || raw[i].first != code || raw[i].second != a.frame_line(f)) same = false;
        if (same && (g.co_name < 0 || g.co_filename < 0)) {
          void* name = a.getattr(code, "co_name");
          void* file = a.getattr(code, "co_filename");
          if (name && file) {
            g.co_name = OffsetOf(code, name);
            g.co_filename = OffsetOf(code, file);
            ssize_t n = 0;
            const char* chars = a.utf8(name, &n);
            g.str_type = At<const void*>(name, sizeof(intptr_t));
            const uint32_t state = At<uint32_t>(name, 4 * sizeof(intptr_t));
            if (chars && ((state >> 5) & 3) == 3)  // compact and ASCII: the characters follow the header
              g.ascii_data = static_cast<int>(chars - static_cast<const char*>(name));
          } else {
            a.err_clear();
          }
          if (name) a.decref(name);
          if (file) a.decref(file);
        } else if (same) {  // every code object agrees on the offsets
          void* name = a.getattr(code, "co_name");
          if (name == nullptr || At<const void*>(code, g.co_name) != name) same = false;
          if (name) a.decref(name);
          else a.err_clear();
        }
        a.decref(code);
        void* back = a.frame_back(f);
        a.decref(f);
        f = back;
        ++i;
      }
      if (f != nullptr) a.decref(f);
      if (!same || i != raw.size()) {
        *why = "Python frames are off: this CPython's frames do not read as its public API reads them";
        return -1;
      }
      compared += static_cast<int>(i);
    }
  }
  if (compared > 0 && (g.co_name < 0 || g.co_filename < 0 || g.ascii_data < 0 || g.ascii_data > 128)) {
    *why = "Python frames are off: the names of this CPython's code objects were not found";
    return -1;
  }
  return compared;
}

void FindEvalLoop() {
  void* sym = dlsym(RTLD_DEFAULT, "_PyEval_EvalFrameDefault");
  Dl_info info{};
  ElfW(Sym)* ent = nullptr;
  if (sym == nullptr || dladdr1(sym, &info, reinterpret_cast<void**>(&ent), RTLD_DL_SYMENT) == 0 || ent == nullptr)
    return;
  g_eval_lo = reinterpret_cast<uintptr_t>(sym);
  g_eval_hi = g_eval_lo + ent->st_size;
}

// A realtime signal nobody handles, ours from then on (the same one for
// every later session); 0 if none is free.
int ChooseSignal() {
  static int chosen = 0;
  if (chosen != 0) return chosen;
  for (int sig = SIGRTMIN + 4; sig <= SIGRTMAX - 4; ++sig) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL || (old.sa_flags & SA_SIGINFO)) continue;
    struct sigaction sa {};
    sa.sa_sigaction = OnSample;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigfillset(&sa.sa_mask);  // nothing nests inside the handler
    if (sigaction(sig, &sa, nullptr) != 0) continue;
    chosen = sig;
    break;
  }
  return chosen;
}


// The offset of `value` among the first `bytes` of `obj`, in steps of
// sizeof(T), from `from`; or -1.
template <typename T>
int FindValue(const void* obj, T value, int from, int bytes) {
  for (int off = from; off + static_cast<int>(sizeof(T)) <= bytes; off += sizeof(T))
    if (At<T>(obj, off) == value) return off;
  return -1;
}

// With the GIL: the offsets the reader walks the thread list by, checked on
// this thread's own state and on the list as the API walks it.
bool FindThreadList(const Api& a, unsigned minor) {
  ThreadList t;
  t.interp = a.interp_head();
  const void* self = g.this_thread_state();
  if (t.interp == nullptr || self == nullptr) return false;
  void* first = a.thread_head(const_cast<void*>(t.interp));
  // threads.head: at 8 (3.10), 16 (3.11), 72 (3.12), 7344 (3.13, after the eval state's arrays).
  t.head = FindValue<const void*>(t.interp, first, 0, 16384);
  t.next = 8;  // after prev, in 3.10-3.13
  for (void* ts = first; ts != nullptr; ts = a.thread_next(ts))
    if (At<const void*>(ts, t.next) != a.thread_next(ts)) return false;
  const uint64_t me = static_cast<uint64_t>(syscall(SYS_gettid));
  t.thread_id = FindValue<uint64_t>(self, static_cast<uint64_t>(pthread_self()), 16, 1024);
  if (t.head < 0 || t.thread_id < 0) return false;
  if (minor >= 11) {  // native_thread_id follows thread_id
    if (At<uint64_t>(self, t.thread_id + 8) != me) return false;
    t.native_tid = t.thread_id + 8;
  } else {  // glibc keeps the thread's tid in its struct pthread, at pthread_t
    t.pthread_tid = FindValue<int32_t>(reinterpret_cast<const void*>(pthread_self()), static_cast<int32_t>(me), 0, 2048);
    if (t.pthread_tid < 0) return false;
  }
  g_threads = t;
  return true;
}

// With the GIL (every thread's frames hold still): the copied reads of the
// threads' frames must give what the in-place ones give (names, files,
// lines); sets g_code's other offsets.
bool CheckCopiedReads(const Api& a, unsigned minor) {
  CodeLayout L;
  L.code_type = g.code_type;
  L.str_type = g.str_type;
  L.co_name = g.co_name;
  L.co_filename = g.co_filename;
  L.ascii_data = g.ascii_data;
  L.co_firstlineno = FirstLineOffset(minor);
  L.table_310 = minor == 10;
  int checked = 0;
  bool same = L.co_firstlineno >= 0;
  auto in_place = [](void* dst, uint64_t src, size_t n) -> long {
    std::memcpy(dst, reinterpret_cast<const void*>(src), n);
    return static_cast<long>(n);
  };
  auto text = std::make_unique<CodeText>();
  void* interp = a.interp_head();
  for (void* ts = interp != nullptr ? a.thread_head(interp) : nullptr; ts != nullptr && same; ts = a.thread_next(ts))
    pf::WalkRaw(ts, g.layout, g.code_type, kMaxPythonFrames, [&](const void* code, int lasti) {
      if (L.co_linetable < 0) {
        void* table = a.getattr(const_cast<void*>(code), "co_linetable");
        if (table == nullptr) {
          a.err_clear();
          same = false;
          return false;
        }
        L.co_linetable = OffsetOf(code, table);
        L.bytes_type = At<const void*>(table, sizeof(intptr_t));
        a.decref(table);
      }
      if (At<int32_t>(code, L.co_firstlineno) != g.addr2line(code, -1)) same = false;
      const std::string_view name = StrOf(At<const void*>(code, g.co_name));
      const std::string_view file = StrOf(At<const void*>(code, g.co_filename));
      if (!L.ready() || !ReadCodeCopied(L, in_place, code, lasti, text.get()) ||
          std::string_view(text->name, text->name_len) != name.substr(0, CodeText::kMaxName) ||
          std::string_view(text->file, text->file_len) != file.substr(0, CodeText::kMaxFile) ||
          (text->line != g.addr2line(code, lasti) && !text->table_cut))
        same = false;
      ++checked;
      return same;
    });
  if (!same || checked == 0) return false;
  g_code = L;
  return true;
}

}  // namespace

bool ReadCodeCopied(const CodeLayout& L, long (*copy)(void*, uint64_t, size_t), const void* code, int lasti,
                    CodeText* out) {
  out->name_len = out->file_len = 0;
  out->line = -1;
  out->table_cut = false;
  unsigned char head[256];
  const int need = std::max({L.co_name, L.co_filename, L.co_linetable}) + static_cast<int>(sizeof(void*));
  if (!L.ready() || need > static_cast<int>(sizeof head) || L.co_firstlineno + 4 > need ||
      !CopyExact(copy, head, code, static_cast<size_t>(need)) || At<const void*>(head, sizeof(intptr_t)) != L.code_type)
    return false;
  const long name = CopyStr(L, copy, At<const void*>(head, L.co_name), out->name, CodeText::kMaxName);
  const long file = CopyStr(L, copy, At<const void*>(head, L.co_filename), out->file, CodeText::kMaxFile);
  if (name < 0 || file < 0) return false;
  out->name_len = static_cast<size_t>(name);
  out->file_len = static_cast<size_t>(file);
  const int first = At<int32_t>(head, L.co_firstlineno);
  if (lasti < 0) {
    out->line = first;
    return true;
  }
  // The line table: a bytes object; a longer one than the buffer is cut (its later lines: -1).
  const void* table = At<const void*>(head, L.co_linetable);
  unsigned char bytes_head[kBytesData];
  if (!CopyExact(copy, bytes_head, table, sizeof bytes_head) ||
      At<const void*>(bytes_head, sizeof(intptr_t)) != L.bytes_type)
    return true;
  const int64_t size = At<int64_t>(bytes_head, kBytesSize);
  if (size <= 0) return true;
  const size_t n = std::min(static_cast<size_t>(size), CodeText::kMaxLineTable);
  out->table_cut = n < static_cast<size_t>(size);
  if (!CopyExact(copy, out->table, static_cast<const char*>(table) + kBytesData, n)) return true;
  out->line = L.table_310 ? LineOf310(out->table, n, first, lasti) : LineOf311(out->table, n, first, lasti);
  return true;
}

bool PythonStacks::Enable(std::string* why, bool with_signal) {
  blocked_ready_ = false;
  Api a{};
  const unsigned long* version = nullptr;
  if (!Find(&a.is_initialized, "Py_IsInitialized")) return false;  // not a Python program
  if (!a.is_initialized()) {
    *why = "Python frames are off: the interpreter was not initialized when sampling started";
    return false;
  }
  if (!ResolveApi(&a) || !Find(&g.code_type, "PyCode_Type")) {
    *why = "Python frames are off: this Python lacks functions they need (CPython 3.10-3.13)";
    return false;
  }
  // Py_Version is 3.11+; Py_GetVersion's text ("3.10.13 (main, ...") everywhere.
  unsigned major = 0, minor = 0;
  if (Find(&version, "Py_Version")) {
    major = static_cast<unsigned>(*version >> 24);
    minor = static_cast<unsigned>((*version >> 16) & 0xff);
  } else if (const char* (*get_version)() = nullptr; Find(&get_version, "Py_GetVersion")) {
    std::sscanf(get_version(), "%u.%u", &major, &minor);
  }
  const pf::RawLayout* layout = major == 3 ? pf::LayoutOf(minor) : nullptr;
  if (layout == nullptr || dlsym(RTLD_DEFAULT, "_Py_MergeZeroLocalRefcount") != nullptr) {
    *why = "Python frames are off: they are read on CPython 3.10-3.13 with the GIL only";
    return false;
  }
  g.layout = *layout;
  g.co_name = g.co_filename = g.ascii_data = -1;
  const int gil = a.gil_ensure();
  const int compared = CheckLayout(a, why);
  // Off-CPU frames need both the thread list and the copied reads of code objects.
  const bool list_found = compared > 0 && FindThreadList(a, minor) && CheckCopiedReads(a, minor);
  a.gil_release(gil);
  if (compared <= 0) {
    if (compared == 0) *why = "Python frames are off: no Python frame to check this CPython's layout on";
    return false;
  }
  blocked_ready_ = list_found;
  if (list_found && code_text_ == nullptr) code_text_ = std::make_unique<CodeText>();
  FindEvalLoop();
  if (!with_signal) return true;
  if (g.slots == nullptr) {
    void* m = mmap(nullptr, sizeof(Slot) * kSlots, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (m == MAP_FAILED) {
      *why = "Python frames are off: no memory for their rings";
      return false;
    }
    g.slots = static_cast<Slot*>(m);
  }
  for (uint32_t i = 0; i < kSlots; ++i) {
    g.slots[i].tid.store(0, std::memory_order_relaxed);
    g.slots[i].head.store(0, std::memory_order_relaxed);
  }
  tails_.assign(kSlots, 0);
  records_.clear();
  stacks_.clear();
  stack_ids_.clear();
  lost_ = 0;
  signo_ = ChooseSignal();
  if (signo_ == 0) {
    *why = "Python frames are off: every realtime signal is the program's";
    return false;
  }
  g.on.store(true, std::memory_order_release);
  return true;
}

bool PythonStacks::Arm(int fd, uint32_t tid) {
  if (signo_ == 0 || g.slots == nullptr) return false;
  Slot* slot = nullptr;
  for (uint32_t i = 0; i < kSlots && slot == nullptr; ++i) {
    Slot& s = g.slots[(tid + i) % kSlots];
    uint32_t expected = 0;
    if (s.tid.load(std::memory_order_acquire) == tid ||
        s.tid.compare_exchange_strong(expected, tid, std::memory_order_acq_rel))
      slot = &s;
  }
  if (slot == nullptr) return false;
  f_owner_ex owner{F_OWNER_TID, static_cast<pid_t>(tid)};
  return fcntl(fd, F_SETOWN_EX, &owner) == 0 && fcntl(fd, F_SETSIG, signo_) == 0 &&
         fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_ASYNC) == 0;
}

void PythonStacks::Drain() {
  if (g.slots == nullptr || tails_.empty()) return;
  Entry copy;
  for (uint32_t i = 0; i < kSlots; ++i) {
    Slot& s = g.slots[i];
    const uint32_t tid = s.tid.load(std::memory_order_acquire);
    if (tid == 0) continue;
    const uint64_t head = s.head.load(std::memory_order_acquire);
    uint64_t& tail = tails_[i];
    if (head - tail > kEntries) {
      lost_ += head - tail - kEntries;
      tail = head - kEntries;
    }
    for (; tail < head; ++tail) {
      std::memcpy(&copy, &s.entries[tail % kEntries], sizeof copy);
      // Overwritten while copied: the handler went round the ring.
      if (s.head.load(std::memory_order_acquire) - tail >= kEntries) {
        ++lost_;
        continue;
      }
      if (records_.size() >= kMaxRecords) continue;
      std::vector<uintptr_t> frames(copy.frames, copy.frames + std::min<uint32_t>(copy.n, kMaxPythonFrames));
      auto [it, fresh] = stack_ids_.emplace(frames, static_cast<uint32_t>(stacks_.size()));
      if (fresh) stacks_.push_back(std::move(frames));
      records_.push_back({copy.time_ns, tid, it->second});
    }
  }
}

int PythonStacks::ReadBlocked(uint32_t tid, CopyFn copy, const void** code, int* lasti, int max) const {
  if (!blocked_ready_) return 0;
  const ThreadList& t = g_threads;
  auto load = [copy](void* dst, const void* src, size_t n) {
    return copy(dst, reinterpret_cast<uint64_t>(src), n) == static_cast<long>(n);
  };
  auto word = [&](const void* base, int offset, auto* v) {
    return load(static_cast<void*>(v), static_cast<const char*>(base) + offset, sizeof *v);
  };
  // The list may change meanwhile (a thread starts or ends): every read is a
  // copy, and the hops are bounded.
  const void* ts = nullptr;
  if (!word(t.interp, t.head, &ts)) return 0;
  for (int hops = 0; ts != nullptr; ++hops) {
    if (hops >= 4096) return 0;
    uint64_t id = 0;
    if (t.native_tid >= 0) {
      if (word(ts, t.native_tid, &id) && id == tid) break;
    } else {
      const void* pthread = nullptr;
      int32_t its_tid = 0;
      if (word(ts, t.thread_id, &pthread) && pthread != nullptr && word(pthread, t.pthread_tid, &its_tid) &&
          static_cast<uint32_t>(its_tid) == tid)
        break;
    }
    if (!word(ts, t.next, &ts)) return 0;
  }
  if (ts == nullptr) return 0;
  int n = 0;
  pf::WalkRawWith(load, ts, g.layout, g.code_type, max, [&](const void* c, int l) {
    code[n] = c;
    lasti[n++] = l;
    return true;
  });
  return n;
}

int PythonStacks::SpliceBlocked(CopyFn copy, const void* const* code, const int* lasti, int np, const uintptr_t* native, int n,
                                uintptr_t* out, int max) const {
  uintptr_t py[kMaxBlockedFrames];
  np = std::min(np, kMaxBlockedFrames);
  for (int i = 0; i < np; ++i) py[i] = FrameOfCopied(copy, code[i], lasti[i], code_text_.get());
  auto is_eval = [](uintptr_t ret) { return ret - 1 >= g_eval_lo && ret - 1 < g_eval_hi; };
  return pf::SpliceAtEvalFrames(native, n, py, np, out, max, is_eval);
}

void PythonStacks::Disable() { g.on.store(false, std::memory_order_release); }

void PythonStacks::Merge(CpuCapture* cap) {
  if (records_.empty()) return;
  std::stable_sort(records_.begin(), records_.end(), [](const Record& a, const Record& b) {
    return a.tid != b.tid ? a.tid < b.tid : a.time_ns < b.time_ns;
  });
  std::stable_sort(cap->samples.begin(), cap->samples.end(), [](const CpuSample& a, const CpuSample& b) {
    return a.tid != b.tid ? a.tid < b.tid : a.time_ns < b.time_ns;
  });
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> merged;  // (native stack, Python stack) -> stack
  std::map<std::vector<uintptr_t>, uint32_t> interned;
  auto is_eval = [](uintptr_t ret) { return ret - 1 >= g_eval_lo && ret - 1 < g_eval_hi; };
  size_t r = 0;
  for (size_t i = 0; i < cap->samples.size(); ++i) {
    CpuSample& s = cap->samples[i];
    while (r < records_.size() && (records_[r].tid < s.tid || (records_[r].tid == s.tid && records_[r].time_ns < s.time_ns)))
      ++r;
    if (r == records_.size() || records_[r].tid != s.tid) continue;
    const bool has_next = i + 1 < cap->samples.size() && cap->samples[i + 1].tid == s.tid;
    const uint64_t limit = has_next ? cap->samples[i + 1].time_ns : s.time_ns + 100000000ull;
    if (records_[r].time_ns >= limit) continue;  // this sample's signal was not handled (blocked, lost)
    const auto& py = stacks_[records_[r].stack];
    ++r;
    if (py.empty()) continue;
    auto key = std::make_pair(s.stack, records_[r - 1].stack);
    auto it = merged.find(key);
    if (it == merged.end()) {
      const auto& native = cap->stacks[s.stack];
      uintptr_t out[kMaxDepth + kMaxPythonFrames];
      const int n = pf::SpliceAtEvalFrames(native.data(), static_cast<int>(native.size()), py.data(),
                                           static_cast<int>(py.size()), out, kMaxDepth + kMaxPythonFrames, is_eval);
      std::vector<uintptr_t> frames(out, out + n);
      const uint8_t truncated = cap->truncated[s.stack];
      frames.push_back(truncated);  // the key tells truncated stacks apart, as the sampler's does
      auto [jt, fresh] = interned.emplace(frames, static_cast<uint32_t>(cap->stacks.size()));
      if (fresh) {
        frames.pop_back();
        cap->stacks.push_back(std::move(frames));
        cap->truncated.push_back(truncated);
      }
      it = merged.emplace(key, jt->second).first;
    }
    s.stack = it->second;
  }
}

}  // namespace spyglass::sampling
