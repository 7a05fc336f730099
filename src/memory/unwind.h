// Stack capture for allocations. Four unwinders, chosen once per process
// (SPYGLASS_UNWINDER=cfi|fp|libunwind|glibc; default cfi, see BENCHMARKS.md
// "Memory", "Real programs"):
//   cfi       DWARF CFI from .eh_frame with a process-wide cache of each return
//             address's rule (CFA = rsp|rbp + k, rbp saved at CFA + k or
//             kept): correct without frame pointers (distributions build
//             without them). A thread's walk reuses its previous walk's
//             outer frames once they meet (CaptureCfiTrail). A frame it
//             cannot unwind (no FDE, a rule it does not follow: an
//             expression, a signal frame; a CFA off the thread's stack) ends
//             the stack and is counted (kCutStacks, "stacks_cut" in the
//             profile's comments); it never becomes a frame. A miss reads
//             .eh_frame in place (_dl_find_object, no lock, no allocation).
//   fp        frame-pointer walk, bounded by the thread's stack. Complete only
//             through code built with -fno-omit-frame-pointer; elsewhere it
//             stops after a frame or strays into junk addresses.
//   libunwind unw_backtrace (DWARF CFI, correct without frame pointers).
//   glibc     backtrace() (libgcc's DWARF unwinder).
// The capture is inlined into the hook so that frame 0 is the hook's caller.
#pragma once

#include <atomic>
#include <cstdint>

#include "memory/tracker.h"

namespace spyglass::memory::internal {

enum class Unwinder : int { kFramePointer = 0, kLibunwind = 1, kGlibc = 2, kCfi = 3 };
SPYGLASS_MEM_EXPORT extern std::atomic<int> g_unwinder;  // -1 until first read
SPYGLASS_MEM_EXPORT Unwinder CurrentUnwinderSlow();
inline Unwinder CurrentUnwinder() {
  int u = g_unwinder.load(std::memory_order_relaxed);
  if (__builtin_expect(u >= 0, 1)) return static_cast<Unwinder>(u);
  return CurrentUnwinderSlow();
}
SPYGLASS_MEM_EXPORT void SetUnwinder(Unwinder u);

struct StackBounds {
  uintptr_t lo, hi;
};
struct StackBoundsCache {
  uintptr_t lo, hi;
  bool known;
};
SPYGLASS_MEM_EXPORT extern constinit thread_local StackBoundsCache t_bounds __attribute__((tls_model("initial-exec")));
SPYGLASS_MEM_EXPORT StackBounds ThreadStackBoundsSlow();
// The calling thread's stack (cached per thread; {0,0} when unknown).
inline StackBounds ThreadStackBounds() {
  if (__builtin_expect(t_bounds.known, 1)) return {t_bounds.lo, t_bounds.hi};
  return ThreadStackBoundsSlow();
}

// DWARF-based captures (out of line); `skip` frames of their own dropped.
SPYGLASS_MEM_EXPORT int CaptureLibunwind(uintptr_t* out, int max, int skip);
SPYGLASS_MEM_EXPORT int CaptureGlibc(uintptr_t* out, int max, int skip);

// Walks frame pointers starting at `fp` (the hook's own frame).
__attribute__((always_inline, no_sanitize_address)) inline int CaptureFramePointers(void* fp, uintptr_t* out,
                                                                                       int max) {
  StackBounds b = ThreadStackBounds();
  uintptr_t p = reinterpret_cast<uintptr_t>(fp);
  if (b.hi == 0) return 0;
  int n = 0;
  while (n < max) {
    if (p < b.lo || p + 16 > b.hi || (p & 7) != 0) break;
    const uintptr_t* f = reinterpret_cast<const uintptr_t*>(p);
    uintptr_t ret = f[1];
    if (ret < 4096) break;
    out[n++] = ret;
    uintptr_t next = f[0];
    if (next <= p) break;
    p = next;
  }
  return n;
}

// The same walk into `last[0..max)`, which holds the thread's previous stack
// (`last_depth` frames; entries never below 4096: ~0 at first): a frame is
// stored only where it differs, and *same is true when the whole stack is
// the previous one, so that the caller reuses that stack's site without
// hashing it or looking it up (a loop allocating from one place walks the
// same stack again and again). A frame equal to the previous one is a valid
// return address already; the frame pointers only rise, so after the first
// one only the top bound is tested. x86-64 reads a misaligned frame pointer
// (garbage, like any other) without a fault.
__attribute__((always_inline, no_sanitize_address)) inline int CaptureFramePointersCompared(
    void* fp, uintptr_t* last, int max, int last_depth, bool* same) {
  StackBounds b = ThreadStackBounds();
  uintptr_t p = reinterpret_cast<uintptr_t>(fp);
  bool diff = false;
  int n = 0;
  if (b.hi - b.lo >= 16 && p - b.lo <= b.hi - b.lo - 16 && max > 0) {
    const uintptr_t top = b.hi - 16;  // a frame at p reads p[0] and p[1]
    while (true) {
#if !defined(__x86_64__)
      if ((p & 7) != 0) break;
#endif
      const uintptr_t* f = reinterpret_cast<const uintptr_t*>(p);
      uintptr_t ret = f[1];
      if (__builtin_expect(ret != last[n], 0)) {
        if (ret < 4096) break;
        last[n] = ret;
        diff = true;
      }
      ++n;
      uintptr_t next = f[0];
      if (next <= p || next > top || n == max) break;
      p = next;
    }
  }
  *same = !diff && n == last_depth;
  return n;
}


// --- cfi: DWARF CFI walk with a cache of rules -------------------------------
// A return address's rule, packed in 64 bits (0: none yet):
//   bits 0-1  kind: 1 step with the rule, 2 the outermost frame (the return
//             address is undefined there: _start, a thread's clone), 3 cannot
//             be unwound (no FDE, an expression, a signal frame, ...)
//   bit 2     the CFA is rbp + k (else rsp + k)
//   bit 3     rbp is saved at CFA + rbp_off (else the caller's rbp is rbp)
//   bits 16-31 rbp_off (int16), bits 32-63 k (int32)
// The return address is always at CFA - 8 (other rules are kind 3).
enum CfiKind : uint64_t { kCfiStep = 1, kCfiOutermost = 2, kCfiCannot = 3 };
inline constexpr int kCfiTableBits = 16;
struct CfiEntry {
  std::atomic<uint64_t> pc;
  std::atomic<uint64_t> rule;
};
SPYGLASS_MEM_EXPORT extern CfiEntry g_cfi_table[1 << kCfiTableBits];
// The rule of return address `ra` from .eh_frame, cached (out of line: a miss).
SPYGLASS_MEM_EXPORT uint64_t CfiRuleSlow(uintptr_t ra);
// A module at [lo, hi) was unloaded (dlclose): its rules are dropped (another
// may be mapped there next) and g_cfi_epoch moves on, so that no thread
// reuses a walk made before.
SPYGLASS_MEM_EXPORT void ForgetCfiRules(uintptr_t lo, uintptr_t hi);
SPYGLASS_MEM_EXPORT extern std::atomic<uint32_t> g_cfi_epoch;
inline uint64_t CfiRule(uintptr_t ra) {
  uint64_t i = (ra * 0x9E3779B97F4A7C15ull) >> (64 - kCfiTableBits);
  // One probe in the common case: the entry is there, or the slot is free.
  const CfiEntry& e = g_cfi_table[i];
  if (__builtin_expect(e.pc.load(std::memory_order_acquire) == ra, 1)) {
    uint64_t r = e.rule.load(std::memory_order_acquire);
    if (__builtin_expect(r != 0, 1)) return r;
  }
  return CfiRuleSlow(ra);
}

// One step of the CFI walk: from the state (ra, sp, rbp) of a frame (sp: its
// rsp, the CFA of the frame below) to its caller's. Every read is inside
// `b` (the thread's stack, or a copy of its top: UnwindCopiedStack), above
// sp, through `load` (a word at an address of the thread's stack). Returns
// the rule's kind (kCfiStep: moved; a CFA off `b` reads as kCfiCannot);
// *slot: where the caller's rbp was read (0: kept).
// `r`: the rule of *ra.
template <class Load>
__attribute__((always_inline, no_sanitize_address)) inline uint64_t CfiStepLoad(uint64_t r, StackBounds b,
                                                                                 uintptr_t* ra, uintptr_t* sp,
                                                                                 uintptr_t* rbp, uintptr_t* slot,
                                                                                 Load load) {
  const uint64_t kind = r & 3;
  if (__builtin_expect(kind != kCfiStep, 0)) return kind;
  const uintptr_t cfa = ((r & 4) ? *rbp : *sp) + static_cast<intptr_t>(static_cast<int32_t>(r >> 32));
  // The CFA rises above the frame's own rsp and stays on the stack.
  if (__builtin_expect(cfa < *sp + 8 || cfa > b.hi, 0)) return kCfiCannot;
  *slot = 0;
  if (r & 8) {
    const uintptr_t at = cfa + static_cast<intptr_t>(static_cast<int16_t>(r >> 16));
    if (__builtin_expect(at < b.lo || at > b.hi - 8, 0)) return kCfiCannot;
    *rbp = load(at);
    *slot = at;
  }
  *ra = load(cfa - 8);
  *sp = cfa;
  return kCfiStep;
}
// The live walk: the thread reads its own stack.
struct DirectLoad {
  __attribute__((always_inline, no_sanitize_address)) uintptr_t operator()(uintptr_t at) const {
    return *reinterpret_cast<const uintptr_t*>(at);
  }
};
__attribute__((always_inline, no_sanitize_address)) inline uint64_t CfiStepWith(uint64_t r, StackBounds b,
                                                                                 uintptr_t* ra, uintptr_t* sp,
                                                                                 uintptr_t* rbp, uintptr_t* slot) {
  return CfiStepLoad(r, b, ra, sp, rbp, slot, DirectLoad{});
}
__attribute__((always_inline, no_sanitize_address)) inline uint64_t CfiStep(StackBounds b, uintptr_t* ra,
                                                                             uintptr_t* sp, uintptr_t* rbp,
                                                                             uintptr_t* slot) {
  return CfiStepWith(CfiRule(*ra), b, ra, sp, rbp, slot);
}

// Walks from `fp`, the frame of a function built with frame pointers (the
// hook): its return address is the first frame, its CFA fp + 16 and its
// caller's rbp fp[0]; from there each frame's CFI rule. A frame it cannot
// unwind ends the stack (kept: it is a return address read where the rules
// said) and is counted.
__attribute__((always_inline, no_sanitize_address)) inline int CaptureCfi(void* fp, uintptr_t* out, int max) {
  StackBounds b = ThreadStackBounds();
  uintptr_t sp = reinterpret_cast<uintptr_t>(fp);
  int n = 0;
  uint64_t kind = kCfiCannot;
  if (b.hi - b.lo >= 16 && sp - b.lo <= b.hi - b.lo - 16 && (sp & 7) == 0 && max > 0) {
    const uintptr_t* f = reinterpret_cast<const uintptr_t*>(sp);
    uintptr_t rbp = f[0], ra = f[1], slot = 0;
    sp += 16;
    kind = kCfiStep;
    while (ra >= 4096) {  // 0: the end of a chain that says so
      out[n++] = ra;
      if (n == max) break;
      kind = CfiStep(b, &ra, &sp, &rbp, &slot);
      if (kind != kCfiStep) break;
    }
  }
  if (__builtin_expect(kind == kCfiCannot, 0)) Count(kCutStacks);
  return n;
}

// The walk of one thread's previous allocation, for the next one: each
// frame's state. Two allocations in a row share their outer frames (main, the
// loop that allocates...) at the same stack addresses; once the walk reaches
// a state (ra, sp, rbp) the previous one had, the rest would repeat its steps
// (a step depends on nothing else), so it only checks that the words those
// steps read still hold the same values: no rule lookups, loads that do not
// wait on each other.
inline constexpr int kCfiTrailFrames = 64;
struct CfiTrail {
  uintptr_t ra[kCfiTrailFrames];    // the frames
  uintptr_t sp[kCfiTrailFrames];    // rsp in ra[i]'s function (ascending)
  uintptr_t rbp[kCfiTrailFrames];   // rbp there
  uintptr_t slot[kCfiTrailFrames];  // where rbp[i] was read (0: rbp[i - 1] kept)
  uint64_t rule[kCfiTrailFrames];   // ra[i]'s rule, where the walk looked it up (else 0)
  uint32_t epoch;                   // g_cfi_epoch when walked
  int depth;
  int end;  // the kind that ended it (kCfiOutermost also for a 0 return address), or 0: `max` frames
};

// CaptureCfi into `cur`, reusing `prev` (the thread's previous walk, same
// `max` <= kCfiTrailFrames). *same: the stack is prev's; *hash: its
// StackHashStep chain (the steps overlap the walk's loads). A frame at the
// same depth as in prev with the same return address takes prev's rule (the
// innermost frames, the allocator's wrappers, are the same from anywhere):
// no table lookup.
__attribute__((always_inline, no_sanitize_address)) inline int CaptureCfiTrail(void* fp, CfiTrail* cur,
                                                                                 const CfiTrail* prev, int max,
                                                                                 bool* same, uint64_t* hash) {
  StackBounds b = ThreadStackBounds();
  uintptr_t sp = reinterpret_cast<uintptr_t>(fp);
  uint64_t h = kStackHashSeed;
  int n = 0;
  int end = kCfiCannot;
  bool joined_whole = false;
  if (b.hi - b.lo >= 16 && sp - b.lo <= b.hi - b.lo - 16 && (sp & 7) == 0 && max > 0) {
    const uintptr_t* f = reinterpret_cast<const uintptr_t*>(sp);
    uintptr_t rbp = f[0], ra = f[1], slot = 0;
    sp += 16;
    const uint32_t epoch = g_cfi_epoch.load(std::memory_order_acquire);
    cur->epoch = epoch;
    const int pd = prev->epoch == epoch ? prev->depth : 0;  // a module unloaded since: nothing reused
    int j = 0;  // prev's first frame at or above sp
    while (true) {
      if (ra < 4096) {
        end = kCfiOutermost;
        break;
      }
      cur->ra[n] = ra, cur->sp[n] = sp, cur->rbp[n] = rbp, cur->slot[n] = slot, cur->rule[n] = 0;
      h = StackHashStep(h, ra, n);
      if (++n == max) {
        end = 0;
        break;
      }
      while (j < pd && prev->sp[j] < sp) ++j;
      if (j < pd && prev->sp[j] == sp && prev->ra[j] == ra && prev->rbp[j] == rbp) {
        // prev's state: replay its steps while the words they read are unchanged.
        const bool from_start = n == 1 && j == 0;
        int i = j + 1;
        for (; i < pd && n < max; ++i) {
          const uintptr_t nsp = prev->sp[i], nslot = prev->slot[i];
          const uintptr_t nra = reinterpret_cast<const uintptr_t*>(nsp)[-1];
          const uintptr_t nrbp = nslot ? *reinterpret_cast<const uintptr_t*>(nslot) : rbp;
          rbp = nrbp;
          if (nra != prev->ra[i] || nrbp != prev->rbp[i]) break;
          cur->ra[n] = nra, cur->sp[n] = nsp, cur->rbp[n] = nrbp, cur->slot[n] = nslot, cur->rule[n] = prev->rule[i];
          h = StackHashStep(h, nra, n);
          ++n;
        }
        if (i < pd && n < max) {  // diverged at prev's frame i: its state is the walk's now
          ra = reinterpret_cast<const uintptr_t*>(prev->sp[i])[-1];
          sp = prev->sp[i], slot = prev->slot[i];
          j = i + 1;
          continue;
        }
        if (n == max) {
          end = 0;
          joined_whole = from_start && i == pd && prev->end == 0;
          break;
        }
        if (prev->end != 0) {  // prev's walk ended after its frame pd - 1: so does this one
          end = prev->end;
          joined_whole = from_start;
          break;
        }
        // prev stopped at its max, this walk has room: on from its last frame.
        ra = prev->ra[pd - 1], sp = prev->sp[pd - 1];
        j = pd;
      }
      const int at = n - 1;  // the frame being stepped from
      uint64_t rule = at < pd && prev->ra[at] == ra ? prev->rule[at] : 0;
      if (rule == 0) rule = CfiRule(ra);
      cur->rule[at] = rule;
      const uint64_t kind = CfiStepWith(rule, b, &ra, &sp, &rbp, &slot);
      if (kind != kCfiStep) {
        end = static_cast<int>(kind);
        break;
      }
    }
  }
  if (__builtin_expect(end == kCfiCannot, 0)) Count(kCutStacks);
  cur->depth = n;
  cur->end = end;
  *same = joined_whole && n == prev->depth;
  *hash = h;
  return n;
}

// The same walk over a copy of another thread's stack, off that thread (the
// CPU sampler, src/sampling/): `ip`, `sp`, `bp` are its registers when it
// was stopped, `stack` the `size` bytes it had from sp up. The first frame is
// `ip + 1` (written as a return address, so that symbolizing "the call at
// pc - 1" lands on ip itself), its rule the one at ip; then each caller's
// return address, as CaptureCfi. *end says why it stopped: 0 `max` frames,
// kCfiOutermost the end of the thread's stack, kCfiCannot a frame the rules
// cannot unwind, kCopyExhausted a frame above the copy. Lock-free, no
// allocation; the rule cache is the heap profiler's.
inline constexpr int kCopyExhausted = 4;
SPYGLASS_MEM_EXPORT int UnwindCopiedStack(uintptr_t ip, uintptr_t sp, uintptr_t bp, const uint8_t* stack, size_t size,
                                          uintptr_t* out, int max, int* end);

}  // namespace spyglass::memory::internal

// Captures the stack of the caller of the function this is expanded in.
#define SPYGLASS_CAPTURE_STACK(out, max)                                                         \
  (::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kCfi           \
       ? ::spyglass::memory::internal::CaptureCfi(__builtin_frame_address(0), (out), (max))            \
   : ::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kFramePointer \
       ? ::spyglass::memory::internal::CaptureFramePointers(__builtin_frame_address(0), (out), (max)) \
       : ::spyglass::memory::internal::CurrentUnwinder() == ::spyglass::memory::internal::Unwinder::kLibunwind \
             ? ::spyglass::memory::internal::CaptureLibunwind((out), (max), 2)                    \
             : ::spyglass::memory::internal::CaptureGlibc((out), (max), 2))
