// Linked with libspyglass and run under the heap hook: the memory API of
// libspyglass must see the blocks the hook recorded (one tracker per process,
// in libspyglass_memory, which both load).
//   hook_shared_tracker <profile path>
// Prints the live allocations the tracker counts; exit status 1 on an error.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "spyglass/memory.h"

__attribute__((noinline)) void* hold_block(size_t n) {
  void* p = std::malloc(n);
  if (p) std::memset(p, 2, n);
  return p;
}

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <profile path>\n", argv[0]);
    return 2;
  }
  void* held[3];
  for (void*& p : held) p = hold_block(333333);
  spyglass::Status s = spyglass::profiler::save_device_memory_profile(argv[1]);
  std::printf("live_allocations=%llu\n",
              static_cast<unsigned long long>(spyglass::memory::tracking_stats().live_allocations));
  for (void* p : held) std::free(p);
  if (!s.ok()) {
    std::fprintf(stderr, "save_device_memory_profile: %s\n", s.message().c_str());
    return 1;
  }
  return 0;
}
