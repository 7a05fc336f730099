// Symbolization of return addresses, at snapshot time only: function names
// (demangled), file and line from DWARF (libdw) with inlined frames, else the
// dynamic symbol table (dladdr).
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

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

std::string Demangle(const char* name);

}  // namespace spyglass::memory::internal
