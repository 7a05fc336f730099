#include "memory/unwind.h"

#include <dlfcn.h>
#include <execinfo.h>
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

#ifdef SPYGLASS_HAVE_LIBUNWIND
#define UNW_LOCAL_ONLY
#include <libunwind.h>
#endif

namespace spyglass::memory::internal {
std::atomic<int> g_unwinder{-1};
constinit thread_local StackBoundsCache t_bounds __attribute__((tls_model("initial-exec"))) = {0, 0, false};

Unwinder CurrentUnwinderSlow() {
  int u = static_cast<int>(Unwinder::kCfi);
  if (const char* e = getenv("SPYGLASS_UNWINDER")) {
    if (strcmp(e, "fp") == 0) u = static_cast<int>(Unwinder::kFramePointer);
#ifdef SPYGLASS_HAVE_LIBUNWIND
    if (strcmp(e, "libunwind") == 0) u = static_cast<int>(Unwinder::kLibunwind);
#endif
    if (strcmp(e, "glibc") == 0) u = static_cast<int>(Unwinder::kGlibc);
  }
  g_unwinder.store(u, std::memory_order_relaxed);
  return static_cast<Unwinder>(u);
}

void SetUnwinder(Unwinder u) {
#ifndef SPYGLASS_HAVE_LIBUNWIND
  if (u == Unwinder::kLibunwind) u = Unwinder::kGlibc;
#endif
  g_unwinder.store(static_cast<int>(u), std::memory_order_relaxed);
}

StackBounds ThreadStackBoundsSlow() {
  t_bounds.known = true;  // set first: pthread_getattr_np may allocate (and re-enter)
  // For the main thread glibc reads /proc/self/maps (fopen, getline: about 14
  // mallocs and frees): the profiler's own work, neither tracked nor counted.
  const int guard = Guard::BeginOwn();
  pthread_attr_t attr;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    void* addr = nullptr;
    size_t size = 0;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
      t_bounds.lo = reinterpret_cast<uintptr_t>(addr);
      t_bounds.hi = t_bounds.lo + size;
    }
    pthread_attr_destroy(&attr);
  }
  Guard::Restore(guard);
  return {t_bounds.lo, t_bounds.hi};
}

// --- cfi ---------------------------------------------------------------------
CfiEntry g_cfi_table[1 << kCfiTableBits];
std::atomic<uint32_t> g_cfi_epoch{0};
// A slot whose rule was dropped: neither free nor any return address (probes go past it).
constexpr uint64_t kCfiForgotten = 1;

void ForgetCfiRules(uintptr_t lo, uintptr_t hi) {
  for (CfiEntry& e : g_cfi_table) {
    const uint64_t pc = e.pc.load(std::memory_order_relaxed);
    if (pc >= lo && pc < hi && pc != kCfiForgotten) e.pc.store(kCfiForgotten, std::memory_order_release);
  }
  g_cfi_epoch.fetch_add(1, std::memory_order_acq_rel);
}

namespace {

// Reads .eh_frame data, bounded by `end`; `ok` turns false past it or on an
// encoding this reader does not follow.
struct EhReader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;

  bool Has(size_t n) {
    if (!ok || static_cast<size_t>(end - p) < n) ok = false;
    return ok;
  }
  template <typename T>
  T Fixed() {
    T v{};
    if (Has(sizeof(T))) memcpy(&v, p, sizeof(T));
    if (ok) p += sizeof(T);
    return v;
  }
  uint64_t Uleb() {
    uint64_t v = 0;
    for (int shift = 0; Has(1); shift += 7) {
      uint8_t byte = *p++;
      if (shift < 64) v |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if (!(byte & 0x80)) return v;
    }
    return 0;
  }
  int64_t Sleb() {
    int64_t v = 0;
    int shift = 0;
    uint8_t byte = 0;
    do {
      if (!Has(1)) return 0;
      byte = *p++;
      if (shift < 64) v |= static_cast<int64_t>(static_cast<uint64_t>(byte & 0x7f) << shift);
      shift += 7;
    } while (byte & 0x80);
    if (shift < 64 && (byte & 0x40)) v |= -(int64_t{1} << shift);
    return v;
  }
  // A DW_EH_PE_* encoded pointer; `datarel` is the base of DW_EH_PE_datarel.
  uintptr_t Pointer(uint8_t enc, uintptr_t datarel = 0) {
    if (enc == 0xff) return 0;  // DW_EH_PE_omit
    const uintptr_t here = reinterpret_cast<uintptr_t>(p);
    uintptr_t v = 0;
    switch (enc & 0x0f) {
      case 0x00: v = Fixed<uint64_t>(); break;
      case 0x01: v = Uleb(); break;
      case 0x02: v = Fixed<uint16_t>(); break;
      case 0x03: v = Fixed<uint32_t>(); break;
      case 0x04: v = Fixed<uint64_t>(); break;
      case 0x09: v = static_cast<uintptr_t>(Sleb()); break;
      case 0x0a: v = static_cast<uintptr_t>(static_cast<intptr_t>(Fixed<int16_t>())); break;
      case 0x0b: v = static_cast<uintptr_t>(static_cast<intptr_t>(Fixed<int32_t>())); break;
      case 0x0c: v = Fixed<uint64_t>(); break;
      default: ok = false; return 0;
    }
    switch (enc & 0x70) {
      case 0x00: break;
      case 0x10: v += here; break;     // pcrel
      case 0x30: v += datarel; break;  // datarel
      default: ok = false; return 0;   // textrel, funcrel, aligned: not in .eh_frame on x86-64
    }
    if (enc & 0x80) ok = false;  // indirect: only personality routines use it (skipped, not read)
    return v;
  }
};

// The rule of the registers that matter, as DWARF CFA instructions build it.
enum RegRule : uint8_t { kSame, kOffset, kUndefined, kOther };
struct CfiRow {
  int cfa_reg = 7;  // rsp
  int64_t cfa_off = 8;
  bool cfa_expr = false;
  RegRule rbp = kSame, ra = kSame;
  int64_t rbp_off = 0, ra_off = 0;
};
constexpr int kRegRbp = 6, kRegRsp = 7, kRegRa = 16;

void SetRule(CfiRow& row, uint64_t reg, RegRule rule, int64_t off) {
  if (reg == kRegRbp) row.rbp = rule, row.rbp_off = off;
  if (reg == kRegRa) row.ra = rule, row.ra_off = off;
  // rsp is the CFA by definition; other registers do not matter here.
}
void Restore(CfiRow& row, const CfiRow& initial, uint64_t reg) {
  if (reg == kRegRbp) row.rbp = initial.rbp, row.rbp_off = initial.rbp_off;
  if (reg == kRegRa) row.ra = initial.ra, row.ra_off = initial.ra_off;
}

// Runs CFA instructions [r.p, r.end) until the location passes `pc` (the CIE's
// initial instructions: pc = ~0, run them all). false: one it does not know.
bool RunCfa(EhReader r, uintptr_t loc, uintptr_t pc, uint64_t code_align, int64_t data_align, uint8_t fde_enc,
            const CfiRow& initial, CfiRow& row) {
  CfiRow stack[8];
  int depth = 0;
  while (r.ok && r.p < r.end) {
    const uint8_t op = *r.p++;
    const uint8_t low = op & 0x3f;
    switch (op >> 6) {
      case 1:  // DW_CFA_advance_loc
        loc += low * code_align;
        if (loc > pc) return true;
        continue;
      case 2:  // DW_CFA_offset
        SetRule(row, low, kOffset, static_cast<int64_t>(r.Uleb()) * data_align);
        continue;
      case 3:  // DW_CFA_restore
        Restore(row, initial, low);
        continue;
    }
    uint64_t reg = 0;
    switch (op) {
      case 0x00: break;                                   // nop
      case 0x01: loc = r.Pointer(fde_enc); if (loc > pc) return true; break;  // set_loc
      case 0x02: loc += r.Fixed<uint8_t>() * code_align; if (loc > pc) return true; break;
      case 0x03: loc += r.Fixed<uint16_t>() * code_align; if (loc > pc) return true; break;
      case 0x04: loc += r.Fixed<uint32_t>() * code_align; if (loc > pc) return true; break;
      case 0x05: reg = r.Uleb(); SetRule(row, reg, kOffset, static_cast<int64_t>(r.Uleb()) * data_align); break;
      case 0x06: Restore(row, initial, r.Uleb()); break;
      case 0x07: SetRule(row, r.Uleb(), kUndefined, 0); break;
      case 0x08: SetRule(row, r.Uleb(), kSame, 0); break;
      case 0x09: reg = r.Uleb(); r.Uleb(); SetRule(row, reg, kOther, 0); break;  // register
      case 0x0a:  // remember_state
        if (depth == 8) return false;
        stack[depth++] = row;
        break;
      case 0x0b:  // restore_state: the CFA rule too (as GCC's epilogues expect)
        if (depth == 0) return false;
        row = stack[--depth];
        break;
      case 0x0c: row.cfa_reg = static_cast<int>(r.Uleb()); row.cfa_off = static_cast<int64_t>(r.Uleb()); row.cfa_expr = false; break;
      case 0x0d: row.cfa_reg = static_cast<int>(r.Uleb()); row.cfa_expr = false; break;
      case 0x0e: row.cfa_off = static_cast<int64_t>(r.Uleb()); break;
      case 0x0f: {  // def_cfa_expression
        uint64_t len = r.Uleb();
        if (!r.Has(len)) return false;
        r.p += len;
        row.cfa_expr = true;
        break;
      }
      case 0x10:    // expression
      case 0x16: {  // val_expression
        reg = r.Uleb();
        uint64_t len = r.Uleb();
        if (!r.Has(len)) return false;
        r.p += len;
        SetRule(row, reg, kOther, 0);
        break;
      }
      case 0x11: reg = r.Uleb(); SetRule(row, reg, kOffset, r.Sleb() * data_align); break;
      case 0x12: row.cfa_reg = static_cast<int>(r.Uleb()); row.cfa_off = r.Sleb() * data_align; row.cfa_expr = false; break;
      case 0x13: row.cfa_off = r.Sleb() * data_align; break;
      case 0x14: reg = r.Uleb(); r.Uleb(); SetRule(row, reg, kOther, 0); break;  // val_offset
      case 0x15: reg = r.Uleb(); r.Sleb(); SetRule(row, reg, kOther, 0); break;
      case 0x2e: r.Uleb(); break;  // GNU_args_size
      case 0x2f: reg = r.Uleb(); SetRule(row, reg, kOffset, -static_cast<int64_t>(r.Uleb()) * data_align); break;
      default: return false;
    }
  }
  return r.ok;
}

constexpr uint64_t kRuleCannot = kCfiCannot;

// The FDE of `pc` through .eh_frame_hdr's sorted table; nullptr if none.
const uint8_t* FindFde(const uint8_t* hdr, uintptr_t pc) {
  EhReader r{hdr, hdr + 64 * 1024 * 1024};
  if (r.Fixed<uint8_t>() != 1) return nullptr;
  const uint8_t eh_frame_enc = r.Fixed<uint8_t>();
  const uint8_t count_enc = r.Fixed<uint8_t>();
  const uint8_t table_enc = r.Fixed<uint8_t>();
  r.Pointer(eh_frame_enc);
  const uint64_t count = r.Pointer(count_enc);
  // The binary search table: datarel sdata4 pairs (what every linker writes).
  if (!r.ok || table_enc != 0x3b || count == 0) return nullptr;
  const int32_t* table = reinterpret_cast<const int32_t*>(r.p);
  const uintptr_t base = reinterpret_cast<uintptr_t>(hdr);
  uint64_t lo = 0, hi = count;  // the last entry whose start is <= pc
  while (hi - lo > 1) {
    uint64_t mid = lo + (hi - lo) / 2;
    if (base + static_cast<intptr_t>(table[2 * mid]) <= pc) lo = mid;
    else hi = mid;
  }
  if (base + static_cast<intptr_t>(table[2 * lo]) > pc) return nullptr;
  return reinterpret_cast<const uint8_t*>(base + static_cast<intptr_t>(table[2 * lo + 1]));
}

// The packed rule (unwind.h) at `pc`, an address inside a call instruction.
uint64_t ComputeRule(uintptr_t pc) {
  dl_find_object obj{};
  if (_dl_find_object(reinterpret_cast<void*>(pc), &obj) != 0 || obj.dlfo_eh_frame == nullptr) return kRuleCannot;
  const uint8_t* fde = FindFde(static_cast<const uint8_t*>(obj.dlfo_eh_frame), pc);
  if (fde == nullptr) return kRuleCannot;
  // FDE: length, CIE pointer (back from this field), pc_begin, pc_range, [augmentation], instructions.
  EhReader f{fde, fde + 8};
  const uint32_t fde_len = f.Fixed<uint32_t>();
  if (!f.ok || fde_len == 0 || fde_len == 0xffffffffu) return kRuleCannot;
  f.end = fde + 4 + fde_len;
  const uint8_t* cie_field = f.p;
  const uint32_t cie_off = f.Fixed<uint32_t>();
  if (!f.ok || cie_off == 0) return kRuleCannot;
  const uint8_t* cie = cie_field - cie_off;
  EhReader c{cie, cie + 8};
  const uint32_t cie_len = c.Fixed<uint32_t>();
  if (!c.ok || cie_len == 0 || cie_len == 0xffffffffu) return kRuleCannot;
  c.end = cie + 4 + cie_len;
  if (c.Fixed<uint32_t>() != 0) return kRuleCannot;  // not a CIE
  const uint8_t version = c.Fixed<uint8_t>();
  if (version != 1 && version != 3) return kRuleCannot;
  const char* aug = reinterpret_cast<const char*>(c.p);
  size_t aug_len = strnlen(aug, static_cast<size_t>(c.end - c.p));
  if (!c.Has(aug_len + 1)) return kRuleCannot;
  c.p += aug_len + 1;
  const uint64_t code_align = c.Uleb();
  const int64_t data_align = c.Sleb();
  const uint64_t ra_reg = version == 1 ? c.Fixed<uint8_t>() : c.Uleb();
  uint8_t fde_enc = 0;
  bool has_z = aug_len > 0 && aug[0] == 'z';
  if (aug_len > 0 && !has_z) return kRuleCannot;
  if (has_z) {
    const uint64_t len = c.Uleb();
    const uint8_t* data_end = c.p + len;
    for (size_t i = 1; i < aug_len && c.ok; ++i) {
      switch (aug[i]) {
        case 'R': fde_enc = c.Fixed<uint8_t>(); break;
        case 'L': c.Fixed<uint8_t>(); break;
        case 'P': {
          uint8_t enc = c.Fixed<uint8_t>();
          c.Pointer(enc & 0x7f);  // skipped: indirect or not, its size is the same
          break;
        }
        case 'S': return kRuleCannot;  // a signal frame: its caller's registers are in a ucontext
        default: i = aug_len; break;   // unknown: the length says where the data ends
      }
    }
    if (!c.ok || data_end > c.end) return kRuleCannot;
    c.p = data_end;
  }
  if (!c.ok || ra_reg != kRegRa) return kRuleCannot;
  const uintptr_t pc_begin = f.Pointer(fde_enc);
  const uintptr_t pc_range = f.Pointer(fde_enc & 0x0f);
  if (!f.ok || pc < pc_begin || pc - pc_begin >= pc_range) return kRuleCannot;
  if (has_z) {
    const uint64_t len = f.Uleb();
    if (!f.Has(len)) return kRuleCannot;
    f.p += len;
  }
  CfiRow row;
  if (!RunCfa(c, 0, ~uintptr_t{0}, code_align, data_align, fde_enc, row, row)) return kRuleCannot;
  const CfiRow initial = row;
  if (!RunCfa(f, pc_begin, pc, code_align, data_align, fde_enc, initial, row)) return kRuleCannot;
  if (row.ra == kUndefined) return kCfiOutermost;
  if (row.cfa_expr || (row.cfa_reg != kRegRsp && row.cfa_reg != kRegRbp) || row.ra != kOffset || row.ra_off != -8 ||
      row.cfa_off < INT32_MIN || row.cfa_off > INT32_MAX)
    return kRuleCannot;
  uint64_t rule = kCfiStep | (static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(row.cfa_off))) << 32);
  if (row.cfa_reg == kRegRbp) rule |= 4;
  if (row.rbp == kOffset) {
    if (row.rbp_off < INT16_MIN || row.rbp_off > INT16_MAX) return kRuleCannot;
    rule |= 8 | (static_cast<uint64_t>(static_cast<uint16_t>(static_cast<int16_t>(row.rbp_off))) << 16);
  } else if (row.rbp != kSame) {
    return kRuleCannot;  // rbp in another register or an expression
  }
  return rule;
}

}  // namespace

// A miss: the rule from .eh_frame (ra - 1: inside the call, which may be the
// function's last instruction), then cached. The table is insert-only: a free
// slot is claimed by its pc, the rule follows; a reader that finds the pc
// without its rule yet computes it again. A full neighbourhood: not cached.
uint64_t CfiRuleSlow(uintptr_t ra) {
  constexpr uint64_t kMask = (1u << kCfiTableBits) - 1;
  const uint64_t home = (ra * 0x9E3779B97F4A7C15ull) >> (64 - kCfiTableBits);
  for (uint64_t probe = 0; probe < 16; ++probe) {
    CfiEntry& e = g_cfi_table[(home + probe) & kMask];
    uint64_t pc = e.pc.load(std::memory_order_acquire);
    if (pc == ra) {
      if (uint64_t r = e.rule.load(std::memory_order_acquire)) return r;
      return ComputeRule(ra - 1);
    }
    if (pc == 0) {
      if (e.pc.compare_exchange_strong(pc, ra, std::memory_order_acq_rel)) {
        uint64_t r = ComputeRule(ra - 1);
        e.rule.store(r, std::memory_order_release);
        return r;
      }
      if (pc == ra) return ComputeRule(ra - 1);  // another thread is filling it
    }
  }
  return ComputeRule(ra - 1);
}

int UnwindCopiedStack(uintptr_t ip, uintptr_t sp, uintptr_t bp, const uint8_t* stack, size_t size, uintptr_t* out,
                      int max, int* end) {
  *end = 0;
  if (max <= 0) return 0;
  size &= ~size_t{7};
  const StackBounds b{sp, sp + size};
  // A word of the thread's stack at `at` (inside b: CfiStepLoad checked).
  auto load = [stack, sp](uintptr_t at) {
    uintptr_t v;
    memcpy(&v, stack + (at - sp), sizeof v);
    return v;
  };
  int n = 0;
  uintptr_t ra = ip, rbp = bp, slot = 0;
  // The interrupted frame's rule is the one at ip: CfiRule(x) is the rule at x - 1.
  uint64_t rule = CfiRule(ip + 1);
  out[n++] = ip + 1;
  while (true) {
    if (n == max) return n;
    const uint64_t kind = CfiStepLoad(rule, b, &ra, &sp, &rbp, &slot, load);
    if (kind != kCfiStep) {
      // A rule that would step, refused: its frame lies above the copy, or the rules are wrong.
      const uintptr_t cfa = ((rule & 4) ? rbp : sp) + static_cast<intptr_t>(static_cast<int32_t>(rule >> 32));
      const bool above = (rule & 3) == kCfiStep && cfa > b.hi;
      *end = above ? kCopyExhausted : static_cast<int>(kind);
      return n;
    }
    if (ra < 4096) {  // 0: the end of a chain that says so
      *end = kCfiOutermost;
      return n;
    }
    out[n++] = ra;
    rule = CfiRule(ra);
  }
}

__attribute__((noinline)) int CaptureLibunwind(uintptr_t* out, int max, int skip) {
#ifdef SPYGLASS_HAVE_LIBUNWIND
  void* buf[kMaxFrames + 4];
  int want = max + skip < kMaxFrames + 4 ? max + skip : kMaxFrames + 4;
  int n = unw_backtrace(buf, want);
  int k = 0;
  for (int i = skip; i < n; ++i) out[k++] = reinterpret_cast<uintptr_t>(buf[i]);
  return k;
#else
  return CaptureGlibc(out, max, skip);
#endif
}

__attribute__((noinline)) int CaptureGlibc(uintptr_t* out, int max, int skip) {
  void* buf[kMaxFrames + 4];
  int want = max + skip < kMaxFrames + 4 ? max + skip : kMaxFrames + 4;
  int n = backtrace(buf, want);
  int k = 0;
  for (int i = skip; i < n; ++i) out[k++] = reinterpret_cast<uintptr_t>(buf[i]);
  return k;
}

}  // namespace spyglass::memory::internal
