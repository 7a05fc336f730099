// A library that heap_hostile dlopens, allocates through, then dlcloses.
#include <cstdlib>

extern "C" {

__attribute__((noinline)) void* lib_make_buffer(size_t n) {
  void* p = std::malloc(n);
  __asm__ volatile("" ::: "memory");  // not a tail call: lib_make_buffer stays on the stack
  return p;
}

__attribute__((visibility("default"))) void* spyglass_test_lib_alloc(size_t n) { return lib_make_buffer(n); }

}  // extern "C"
