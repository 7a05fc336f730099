// Symbolization of return addresses, at snapshot time only: function names
// (demangled), file and line from DWARF (libdw) with inlined frames, else the
// dynamic symbol table (dladdr).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "memory/pprof.h"

namespace spyglass::memory::internal {

struct SymFrame {
  std::string function;     // demangled
  std::string system_name;  // mangled (or the same)
  std::string file;
  int64_t line = 0;
  int64_t start_line = 0;
};

struct SymLocation {
  uint64_t rel_address = 0;     // address relative to its module (stable across runs)
  std::vector<SymFrame> frames;  // innermost (inlined) first
};

// Symbolizes return addresses (the call instruction is at pc - 1).
// Thread-safe (serialized); results are cached per address.
std::unordered_map<uintptr_t, SymLocation> Symbolize(const std::vector<uintptr_t>& pcs);

// The same for the return addresses of another process, now gone, whose
// /proc/<pid>/maps text is `maps` (its modules are read from disk). Not cached.
std::unordered_map<uintptr_t, SymLocation> SymbolizeWithMaps(const std::vector<uintptr_t>& pcs,
                                                             const std::string& maps);

std::string Demangle(const char* name);

// A profile's function and location tables, as the snapshot writers build
// them: one function per (name, system name, file), one location per frame
// word. Ids are 1-based, as pprof's.
class LocationTable {
 public:
  explicit LocationTable(ProfileData* data) : data_(data) {}
  uint64_t Function(const std::string& name, const std::string& system_name, const std::string& file,
                    int64_t start_line) {
    auto [it, inserted] = fn_ids_.emplace(name + '\0' + system_name + '\0' + file, data_->functions.size() + 1);
    if (inserted) data_->functions.push_back({name, system_name, file, start_line});
    return it->second;
  }
  // A symbolized return address: its inlined frames, innermost first.
  uint64_t Native(const SymLocation& sl) {
    ProfileLocation loc;
    loc.address = sl.rel_address;
    for (const SymFrame& f : sl.frames)
      loc.lines.push_back({Function(f.function, f.system_name, f.file, f.start_line), f.line});
    data_->locations.push_back(std::move(loc));
    return data_->locations.size();
  }
  // A symbolic frame, as JAX's Python frames: no address, one line.
  uint64_t Symbolic(uint64_t function_id, int64_t line) {
    data_->locations.push_back({0, {{function_id, line}}});
    return data_->locations.size();
  }

 private:
  ProfileData* data_;
  std::unordered_map<std::string, uint64_t> fn_ids_;
};

// Unloaded modules (dlclose): their return addresses would no longer
// symbolize. Before a module at [lo, hi) is unloaded, NamesBeforeUnload
// symbolizes the addresses into it that live blocks' stacks hold (to symbolic frames: the
// innermost function, its file and line); once it is gone, AfterUnload puts
// them into those stacks and forgets the cached names of [lo, hi) (another
// module may be loaded there next). Call both with ScopedUntracked.
struct ModuleNames {
  uintptr_t lo = 0, hi = 0;
  std::unordered_map<uintptr_t, uintptr_t> symbolic;  // return address -> symbolic frame
};
__attribute__((visibility("default"))) ModuleNames NamesBeforeUnload(uintptr_t lo, uintptr_t hi);
__attribute__((visibility("default"))) void AfterUnload(const ModuleNames& names);

}  // namespace spyglass::memory::internal
