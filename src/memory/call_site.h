// What a call site is not: the allocator's plumbing and a program's own
// allocation wrappers. Shared by the profile reports (pprof.cc) and the names
// of the memory timeline's sites (timeline.cc).
#pragma once

#include <algorithm>
#include <cctype>
#include <string_view>

namespace spyglass::memory {

namespace call_site_detail {
inline constexpr size_t kMaxScan = 4096;  // a name may be megabytes
}  // namespace call_site_detail

inline bool IsPlumbing(std::string_view fn) {
  static constexpr const char* kPrefixes[] = {
      "operator new", "operator delete", "malloc", "calloc", "realloc", "reallocarray", "posix_memalign",
      "aligned_alloc", "memalign", "valloc", "pvalloc", "__libc_", "std::", "__gnu_cxx::", "__cxx",
      "spyglass::memory::", "void std::", "__new_allocator", "allocator<"};
  for (const char* p : kPrefixes)
    if (fn.rfind(p, 0) == 0) return true;
  // "T* std::..." / "std::vector<...>* ..." return-type prefixed template instances
  fn = fn.substr(0, call_site_detail::kMaxScan);
  size_t sp = fn.find(' ');
  size_t paren = fn.find('(');
  if (sp != std::string_view::npos && sp < paren && fn.substr(sp + 1, 5) == "std::") return true;
  return false;
}

// The unqualified name of a C or C++ function: "ns::Class::f(int) const" -> "f".
inline std::string_view BareName(std::string_view fn) {
  fn = fn.substr(0, call_site_detail::kMaxScan);
  if (size_t paren = fn.find('('); paren != std::string_view::npos) fn = fn.substr(0, paren);
  if (size_t colon = fn.rfind("::"); colon != std::string_view::npos) fn = fn.substr(colon + 2);
  if (size_t sp = fn.rfind(' '); sp != std::string_view::npos) fn = fn.substr(sp + 1);
  return fn;
}

inline bool ContainsNoCase(std::string_view s, std::string_view part) {
  return std::search(s.begin(), s.end(), part.begin(), part.end(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         }) != s.end();
}

// A program's own allocation wrapper (GNU's xmalloc, glib's g_malloc0,
// sqlite3Malloc, CPython's PyMem_Malloc): its callers are the call site.
inline bool IsAllocatorWrapper(std::string_view fn) {
  std::string_view bare = BareName(fn);
  for (std::string_view part : {"malloc", "calloc", "realloc", "memalign", "strdup", "strndup", "memdup"})
    if (ContainsNoCase(bare, part)) return true;
  for (std::string_view exact : {"xzalloc", "xnmalloc", "xcharalloc", "ximalloc", "xizalloc", "g_new", "g_new0",
                                 "PyMem_Malloc", "PyObject_Malloc", "_PyObject_New", "_PyObject_GC_New"})
    if (bare == exact) return true;
  return false;
}

// A Python frame as the heap hook writes one: a function in a .py file.
inline bool IsPythonSource(std::string_view file) { return file.size() >= 3 && file.substr(file.size() - 3) == ".py"; }

// A Python frame, also one of a module frozen into the interpreter
// ("<frozen runpy>": CPython 3.11+ freezes its startup and import modules).
inline bool IsPythonFrame(std::string_view file) { return IsPythonSource(file) || file.rfind("<frozen ", 0) == 0; }

}  // namespace spyglass::memory
