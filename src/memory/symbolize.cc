#include "memory/symbolize.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_set>

#include "memory/tracker.h"

#ifdef SPYGLASS_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwfl.h>
#endif

namespace spyglass::memory::internal {

std::string Demangle(const char* name) {
  if (name == nullptr) return "";
  if (name[0] == '_' && name[1] == 'Z') {
    int status = 0;
    char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
    if (d && status == 0) {
      std::string out(d);
      std::free(d);
      return out;
    }
    std::free(d);
  }
  return name;
}

namespace {

std::mutex g_mu;
std::unordered_map<uintptr_t, SymLocation>* g_cache = nullptr;

std::string Basename(const char* path) {
  const char* s = std::strrchr(path, '/');
  return s ? s + 1 : path;
}

// Fallback: the dynamic symbol table.
SymLocation ViaDladdr(uintptr_t pc) {
  SymLocation loc;
  Dl_info info{};
  SymFrame f;
  if (dladdr(reinterpret_cast<void*>(pc - 1), &info) != 0) {
    loc.rel_address = pc - reinterpret_cast<uintptr_t>(info.dli_fbase);
    if (info.dli_sname) {
      f.system_name = info.dli_sname;
      f.function = Demangle(info.dli_sname);
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(loc.rel_address));
      f.function = Basename(info.dli_fname ? info.dli_fname : "?") + buf;
      f.system_name = f.function;
    }
    if (info.dli_fname) f.file = info.dli_fname;  // the module, when no source file is known
  } else {
    char buf[64];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(pc));
    f.function = f.system_name = buf;
    loc.rel_address = pc;
  }
  loc.frames.push_back(std::move(f));
  return loc;
}

#ifdef SPYGLASS_HAVE_LIBDW
// libdw is opened on the first symbolization, not linked: the heap hook's
// tracker is loaded into every profiled program, and libdw with libelf, liblzma
// and libbz2 would add four libraries and half a MiB to each from its start
// (BENCHMARKS.md, "Memory"). Only the declarations of its headers are used.
#define SPYGLASS_LIBDW_FUNCTIONS(X)                                                                       \
  X(dwfl_begin) X(dwfl_end) X(dwfl_linux_proc_find_elf) X(dwfl_standard_find_debuginfo)                  \
  X(dwfl_linux_proc_report) X(dwfl_report_end) X(dwfl_addrmodule) X(dwfl_module_info)                     \
  X(dwfl_module_addrdie) X(dwfl_module_getsrc) X(dwfl_lineinfo) X(dwarf_getscopes) X(dwarf_getsrcfiles) \
  X(dwarf_filesrc) X(dwarf_tag) X(dwarf_attr) X(dwarf_attr_integrate) X(dwarf_formstring)                \
  X(dwarf_formudata) X(dwarf_diename) X(dwfl_linux_proc_maps_report) X(dwfl_module_addrname) X(dwarf_child)  \
  X(dwarf_siblingof) X(dwarf_ranges) X(dwarf_haspc) X(dwfl_module_getsymtab) X(dwfl_module_getsym_info)

struct Libdw {
#define SPYGLASS_LIBDW_POINTER(f) decltype(&::f) f = nullptr;
  SPYGLASS_LIBDW_FUNCTIONS(SPYGLASS_LIBDW_POINTER)
#undef SPYGLASS_LIBDW_POINTER
};

// nullptr when libdw.so.1 cannot be opened (then frames are named by dladdr).
const Libdw* LoadLibdw() {
  static const Libdw* dw = []() -> const Libdw* {
    void* h = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) return nullptr;
    static Libdw fns;
    bool ok = true;
#define SPYGLASS_LIBDW_RESOLVE(f) ok = ok && (fns.f = reinterpret_cast<decltype(&::f)>(dlsym(h, #f))) != nullptr;
    SPYGLASS_LIBDW_FUNCTIONS(SPYGLASS_LIBDW_RESOLVE)
#undef SPYGLASS_LIBDW_RESOLVE
    return ok ? &fns : nullptr;
  }();
  return dw;
}

const char* DieLinkageName(const Libdw& dw, Dwarf_Die* die) {
  Dwarf_Attribute attr;
  if (dw.dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) ||
      dw.dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr))
    return dw.dwarf_formstring(&attr);
  return nullptr;
}

std::string DieName(const Libdw& dw, Dwarf_Die* die, std::string* system_name) {
  if (const char* l = DieLinkageName(dw, die)) {
    *system_name = l;
    return Demangle(l);
  }
  const char* n = dw.dwarf_diename(die);
  if (!n) {
    Dwarf_Attribute attr;
    if (dw.dwarf_attr_integrate(die, DW_AT_name, &attr)) n = dw.dwarf_formstring(&attr);
  }
  *system_name = n ? n : "??";
  return *system_name;
}

int64_t DeclLine(const Libdw& dw, Dwarf_Die* die) {
  Dwarf_Attribute attr;
  Dwarf_Word v = 0;
  if (dw.dwarf_attr_integrate(die, DW_AT_decl_line, &attr) && dw.dwarf_formudata(&attr, &v) == 0)
    return static_cast<int64_t>(v);
  return 0;
}

// Whether a module (libdw's name: the file's path) is glibc's libc.
bool IsLibc(const char* module) {
  if (module == nullptr) return false;
  std::string_view base = module;
  if (size_t slash = base.rfind('/'); slash != std::string_view::npos) base.remove_prefix(slash + 1);
  return base.substr(0, 8) == "libc.so." || base.substr(0, 5) == "libc-";
}

bool IsEntryCode(std::string_view name) {
  for (std::string_view e : {"__libc_start_call_main", "__libc_start_main", "__libc_start_main_impl", "_start",
                             "start_thread", "__clone", "__clone3", "clone", "clone3"})
    if (name == e) return true;
  return false;
}

class DwarfSymbolizer {
 public:
  // `maps`: another (dead) process's /proc/<pid>/maps text; null: this process.
  explicit DwarfSymbolizer(const Libdw* dw, const std::string* maps = nullptr) : dw_(dw) {
    if (!dw_) return;
    callbacks_.find_elf = dw_->dwfl_linux_proc_find_elf;
    callbacks_.find_debuginfo = dw_->dwfl_standard_find_debuginfo;
    callbacks_.debuginfo_path = nullptr;
    dwfl_ = dw_->dwfl_begin(&callbacks_);
    int rc = 0;
    if (dwfl_ && maps) {
      FILE* f = fmemopen(const_cast<char*>(maps->data()), maps->size(), "r");
      rc = f ? dw_->dwfl_linux_proc_maps_report(dwfl_, f) : -1;
      if (f) std::fclose(f);
    } else if (dwfl_) {
      rc = dw_->dwfl_linux_proc_report(dwfl_, getpid());
    }
    if (dwfl_ && rc != 0) {
      dw_->dwfl_end(dwfl_);
      dwfl_ = nullptr;
    }
    if (dwfl_) dw_->dwfl_report_end(dwfl_, nullptr, nullptr);
  }
  ~DwarfSymbolizer() {
    if (dwfl_) dw_->dwfl_end(dwfl_);
  }

  bool Lookup(uintptr_t pc, SymLocation* loc) {
    if (!dwfl_) return false;
    const Libdw& dw = *dw_;
    Dwarf_Addr addr = pc - 1;
    Dwfl_Module* mod = dw.dwfl_addrmodule(dwfl_, addr);
    if (!mod) return false;
    Dwarf_Addr mod_start = 0;
    const char* mod_name = dw.dwfl_module_info(mod, nullptr, &mod_start, nullptr, nullptr, nullptr, nullptr, nullptr);
    loc->rel_address = pc - mod_start;
    // libc's entry code of processes and threads, the outermost frame of
    // nearly every stack: named from the symbol table. Its DWARF, where
    // installed, is a separate compressed file (Debian's libc6-dbg) that
    // libdw inflates whole, ~200M instructions (~45 ms at every process's
    // exit) for lines no one reads. Only in libc: a symbol lookup scans the
    // module's whole symbol table (libpython's: 5 % of a Python program's run).
    if (const char* sym = IsLibc(mod_name) ? SymbolName(mod, addr) : nullptr; sym && IsEntryCode(sym)) {
      SymFrame f;
      f.function = f.system_name = sym;
      loc->frames.push_back(std::move(f));
      return true;
    }
    // No DWARF for the address (a binary built without -g, crt1's _start):
    // the symbol table's name, which has the static functions that dladdr's
    // dynamic table lacks.
    auto by_symbol = [&] {
      const char* sym = SymbolName(mod, addr);
      if (!sym) return false;
      SymFrame f;
      f.system_name = sym;
      f.function = Demangle(sym);
      loc->frames.push_back(std::move(f));
      return true;
    };
    Dwarf_Addr bias = 0;
    Dwarf_Die* cu = dw.dwfl_module_addrdie(mod, addr, &bias);
    if (!cu) return by_symbol();
    Dwarf_Die* scopes = nullptr;
    int n = Scopes(cu, addr - bias, &scopes);
    if (n <= 0) return by_symbol();
    // Source position of the innermost frame from the line table.
    const char* file = nullptr;
    int line = 0;
    if (Dwfl_Line* l = dw.dwfl_module_getsrc(mod, addr))
      file = dw.dwfl_lineinfo(l, nullptr, &line, nullptr, nullptr, nullptr);
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    dw.dwarf_getsrcfiles(cu, &files, &nfiles);
    std::string cur_file = file ? file : "";
    int64_t cur_line = line;
    for (int i = 0; i < n; ++i) {
      Dwarf_Die* d = &scopes[i];
      int tag = dw.dwarf_tag(d);
      if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) continue;
      SymFrame f;
      f.function = DieName(dw, d, &f.system_name);
      f.file = cur_file;
      f.line = cur_line;
      f.start_line = DeclLine(dw, d);
      loc->frames.push_back(std::move(f));
      if (tag == DW_TAG_subprogram) break;
      // The call site of this inlined body is the position in the enclosing function.
      Dwarf_Attribute attr;
      Dwarf_Word v = 0;
      cur_line = (dw.dwarf_attr(d, DW_AT_call_line, &attr) && dw.dwarf_formudata(&attr, &v) == 0)
                     ? static_cast<int64_t>(v)
                     : 0;
      cur_file.clear();
      if (files && dw.dwarf_attr(d, DW_AT_call_file, &attr) && dw.dwarf_formudata(&attr, &v) == 0 && v < nfiles)
        if (const char* fn = dw.dwarf_filesrc(files, v, nullptr, nullptr)) cur_file = fn;
    }
    std::free(scopes);
    return !loc->frames.empty();
  }

 private:
  // The scopes containing `pc` (dwarf_getscopes' order: innermost first, the
  // function last). dwarf_getscopes reads the whole compilation unit for each
  // address: with the large units of an interpreter (CPython's, built with
  // debug information) that was most of a Python program's exit snapshot.
  // Here each unit's functions are listed once, sorted by address; an
  // address finds its function by binary search, then only that function's
  // blocks and inlined calls are read. An address no listed function
  // contains takes dwarf_getscopes' path. Returns a malloc'd array, as it does.
  struct FunctionRange {
    Dwarf_Addr lo, hi;
    Dwarf_Die die;
  };
  void ListFunctions(Dwarf_Die* parent, std::vector<FunctionRange>* out, int depth) {
    const Libdw& dw = *dw_;
    Dwarf_Die child;
    if (dw.dwarf_child(parent, &child) != 0) return;
    do {
      const int tag = dw.dwarf_tag(&child);
      if (tag == DW_TAG_subprogram) {
        Dwarf_Addr base, lo, hi;
        for (ptrdiff_t off = 0; (off = dw.dwarf_ranges(&child, off, &base, &lo, &hi)) > 0;)
          if (lo < hi) out->push_back({lo, hi, child});
      } else if (depth < 8 && (tag == DW_TAG_namespace || tag == DW_TAG_class_type ||
                               tag == DW_TAG_structure_type || tag == DW_TAG_union_type)) {
        ListFunctions(&child, out, depth + 1);  // C++ definitions nested in their namespace or class
      }
    } while (dw.dwarf_siblingof(&child, &child) == 0);
  }
  int Scopes(Dwarf_Die* cu, Dwarf_Addr pc, Dwarf_Die** scopes) {
    const Libdw& dw = *dw_;
    auto [it, fresh] = functions_.try_emplace(cu->addr);
    std::vector<FunctionRange>& fns = it->second;
    if (fresh) {
      ListFunctions(cu, &fns, 0);
      std::sort(fns.begin(), fns.end(), [](const FunctionRange& a, const FunctionRange& b) { return a.lo < b.lo; });
    }
    auto f = std::upper_bound(fns.begin(), fns.end(), pc, [](Dwarf_Addr a, const FunctionRange& r) { return a < r.lo; });
    if (f == fns.begin() || pc >= std::prev(f)->hi) return dw.dwarf_getscopes(cu, pc, scopes);
    std::vector<Dwarf_Die> chain{std::prev(f)->die};  // outermost first
    Dwarf_Die cur = chain.back();
    for (int level = 0; level < 256; ++level) {  // down through the blocks and inlined calls holding pc
      Dwarf_Die child;
      bool deeper = false;
      if (dw.dwarf_child(&cur, &child) == 0) {
        do {
          const int tag = dw.dwarf_tag(&child);
          if ((tag == DW_TAG_inlined_subroutine || tag == DW_TAG_lexical_block) && dw.dwarf_haspc(&child, pc) > 0) {
            cur = child;
            chain.push_back(child);
            deeper = true;
            break;
          }
        } while (dw.dwarf_siblingof(&child, &child) == 0);
      }
      if (!deeper) break;
    }
    auto* out = static_cast<Dwarf_Die*>(std::malloc(sizeof(Dwarf_Die) * chain.size()));
    if (out == nullptr) return -1;
    std::copy(chain.rbegin(), chain.rend(), out);
    *scopes = out;
    return static_cast<int>(chain.size());
  }

  // The symbol table's name for `addr`, as dwfl_module_addrname gives it
  // (the sized symbol holding it, the global one of aliases; else the
  // nearest sizeless one before it). dwfl_module_addrname scans the whole
  // table at every call: jaxlib's libjax_common.so has 740k symbols and no
  // DWARF, so each of its frames cost milliseconds, and the exit snapshot of
  // a JAX program (thousands of XLA frames, more with XLA's profiler session
  // running) took minutes. Here each module's table is read once, sorted by
  // address, and searched.
  struct SymbolEntry {
    Dwarf_Addr lo;
    GElf_Xword size;
    const char* name;  // in the module's string table: lives as long as dwfl_
    int rank;          // of its binding: global over weak over local
  };
  static int BindingRank(unsigned char info) {
    switch (GELF_ST_BIND(info)) {
      case STB_GLOBAL: return 3;
      case STB_GNU_UNIQUE: return 2;
      case STB_WEAK: return 1;
      default: return 0;
    }
  }
  const char* SymbolName(Dwfl_Module* mod, Dwarf_Addr addr) {
    const Libdw& dw = *dw_;
    auto [it, fresh] = symbols_.try_emplace(mod);
    std::vector<SymbolEntry>& syms = it->second;
    if (fresh) {
      const int n = dw.dwfl_module_getsymtab(mod);
      for (int i = 1; i < n; ++i) {
        GElf_Sym sym;
        GElf_Addr value = 0;
        const char* name = dw.dwfl_module_getsym_info(mod, i, &sym, &value, nullptr, nullptr, nullptr);
        if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF) continue;
        // Code addresses only: data objects and what names no address are left out.
        const int type = GELF_ST_TYPE(sym.st_info);
        if (type == STT_SECTION || type == STT_FILE || type == STT_TLS || type == STT_OBJECT || type == STT_COMMON)
          continue;
        syms.push_back({value, sym.st_size, name, BindingRank(sym.st_info)});
      }
      // By address, and at one address the preferred binding last.
      std::sort(syms.begin(), syms.end(), [](const SymbolEntry& a, const SymbolEntry& b) {
        return a.lo != b.lo ? a.lo < b.lo : a.rank < b.rank;
      });
    }
    auto i = std::upper_bound(syms.begin(), syms.end(), addr,
                              [](Dwarf_Addr a, const SymbolEntry& e) { return a < e.lo; });
    const SymbolEntry* sizeless = nullptr;
    for (int steps = 0; i != syms.begin() && steps < 4096; ++steps) {
      --i;
      if (i->size == 0) {
        if (sizeless == nullptr) sizeless = &*i;
        continue;
      }
      if (addr - i->lo < i->size) return i->name;  // the nearest start, the preferred binding
      // A sized symbol that ends before addr (or another at its address
      // that may be larger): sizeless ones count only past its end.
      if (i != syms.begin() && std::prev(i)->lo == i->lo) continue;
      if (sizeless != nullptr && sizeless->lo < i->lo + i->size) sizeless = nullptr;
      break;
    }
    return sizeless != nullptr ? sizeless->name : nullptr;
  }

  const Libdw* dw_;
  Dwfl_Callbacks callbacks_{};
  Dwfl* dwfl_ = nullptr;
  std::unordered_map<const void*, std::vector<FunctionRange>> functions_;  // by compilation unit
  std::unordered_map<Dwfl_Module*, std::vector<SymbolEntry>> symbols_;  // by module, sorted by address
};
#endif

}  // namespace

std::unordered_map<uintptr_t, SymLocation> Symbolize(const std::vector<uintptr_t>& pcs) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_cache) g_cache = new std::unordered_map<uintptr_t, SymLocation>;
  std::unordered_map<uintptr_t, SymLocation> out;
  std::vector<uintptr_t> todo;
  for (uintptr_t pc : pcs) {
    auto it = g_cache->find(pc);
    if (it != g_cache->end())
      out.emplace(pc, it->second);
    else
      todo.push_back(pc);
  }
  if (todo.empty()) return out;
#ifdef SPYGLASS_HAVE_LIBDW
  // One reporting of the process's modules per snapshot (libraries may have been loaded since).
  DwarfSymbolizer dwarf(LoadLibdw());
#endif
  for (uintptr_t pc : todo) {
    SymLocation loc;
    bool ok = false;
#ifdef SPYGLASS_HAVE_LIBDW
    ok = dwarf.Lookup(pc, &loc);
#endif
    if (!ok) loc = ViaDladdr(pc);
    (*g_cache)[pc] = loc;
    out.emplace(pc, std::move(loc));
  }
  return out;
}

std::unordered_map<uintptr_t, SymLocation> SymbolizeWithMaps(const std::vector<uintptr_t>& pcs,
                                                             const std::string& maps) {
  struct Mapping {
    uintptr_t lo, hi, offset;
    std::string path;
  };
  std::vector<Mapping> mappings;
  size_t pos = 0;
  while (pos < maps.size()) {
    size_t end = maps.find('\n', pos);
    if (end == std::string::npos) end = maps.size();
    std::string line = maps.substr(pos, end - pos);
    pos = end + 1;
    unsigned long long lo = 0, hi = 0, off = 0;
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %*s %llx %*s %*s %n", &lo, &hi, &off, &path_at) < 3 || path_at <= 0)
      continue;
    mappings.push_back({lo, hi, off, line.substr(static_cast<size_t>(path_at))});
  }
  std::unordered_map<uintptr_t, SymLocation> out;
#ifdef SPYGLASS_HAVE_LIBDW
  std::lock_guard<std::mutex> lock(g_mu);  // libdw calls are serialized as Symbolize's
  DwarfSymbolizer dwarf(LoadLibdw(), &maps);
#endif
  for (uintptr_t pc : pcs) {
    SymLocation loc;
    bool ok = false;
#ifdef SPYGLASS_HAVE_LIBDW
    ok = dwarf.Lookup(pc, &loc);
#endif
    if (!ok) {
      // The module and the offset in its file, from the maps.
      loc = SymLocation{};
      SymFrame f;
      char buf[64];
      loc.rel_address = pc;
      std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(pc));
      f.function = buf;
      for (const Mapping& m : mappings)
        if (pc - 1 >= m.lo && pc - 1 < m.hi) {
          loc.rel_address = pc - m.lo + m.offset;
          std::snprintf(buf, sizeof buf, "+0x%llx", static_cast<unsigned long long>(loc.rel_address));
          f.function = (m.path.empty() ? std::string("?") : Basename(m.path.c_str())) + buf;
          f.file = m.path;
          break;
        }
      f.system_name = f.function;
      loc.frames.push_back(std::move(f));
    }
    out.emplace(pc, std::move(loc));
  }
  return out;
}

ModuleNames NamesBeforeUnload(uintptr_t lo, uintptr_t hi) {
  ModuleNames names;
  names.lo = lo;
  names.hi = hi;
  // Only stacks of live blocks can appear in a later profile.
  std::unordered_set<uint32_t> sites;
  ForEachLive([&](const LiveRecord& r) { sites.insert(r.site); });
  std::vector<uintptr_t> pcs;
  for (uint32_t id : sites)
    if (const Site* s = GetSite(id))
      for (uint32_t i = 0; i < s->depth; ++i) {
        uintptr_t pc = s->frames[i];
        if (!IsSymbolicFrame(pc) && pc >= lo && pc < hi && names.symbolic.emplace(pc, 0).second) pcs.push_back(pc);
      }
  if (pcs.empty()) return names;
  for (const auto& [pc, loc] : Symbolize(pcs)) {
    if (loc.frames.empty()) continue;
    const SymFrame& f = loc.frames.front();  // innermost: the one frame a stack word can hold
    if (uint32_t id = InternFunction(f.function, f.file)) names.symbolic[pc] = SymbolicFrame(id, f.line);
  }
  return names;
}

void AfterUnload(const ModuleNames& names) {
  if (!names.symbolic.empty()) {
    RewriteSiteFrames(names.lo, names.hi, [&](uintptr_t pc) {
      auto it = names.symbolic.find(pc);
      return it == names.symbolic.end() ? uintptr_t{0} : it->second;
    });
  }
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_cache) return;
  for (auto it = g_cache->begin(); it != g_cache->end();)
    it = (it->first >= names.lo && it->first < names.hi) ? g_cache->erase(it) : std::next(it);
}

}  // namespace spyglass::memory::internal
