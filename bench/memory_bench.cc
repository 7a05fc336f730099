// A malloc-heavy workload for BENCHMARKS.md "Memory": OPS malloc/free pairs of
// mixed sizes (16 B - 512 B, 1 in 64 up to 8 KiB) through 8 call sites at
// stack depths 4-12, with a live set of LIVE blocks. Knows nothing of
// Spyglass: run it plain, under LD_PRELOAD=libspyglass_heap.so, heaptrack, or
// gperftools' heap profiler.
//   memory_bench [OPS=5000000] [LIVE=100000]
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static uint64_t g_rng = 88172645463325252ull;
static inline uint64_t Next() {
  g_rng ^= g_rng << 13;
  g_rng ^= g_rng >> 7;
  g_rng ^= g_rng << 17;
  return g_rng;
}

__attribute__((noinline)) void* Leaf(int site, size_t n) {
  void* p = std::malloc(n);
  static_cast<char*>(p)[0] = static_cast<char>(site);
  return p;
}
__attribute__((noinline)) void* Descend(int site, int depth, size_t n) {
  void* p = depth == 0 ? Leaf(site, n) : Descend(site, depth - 1, n);
  asm volatile("" ::: "memory");
  return p;
}

int main(int argc, char** argv) {
  long ops = argc > 1 ? std::atol(argv[1]) : 5000000;
  long live = argc > 2 ? std::atol(argv[2]) : 100000;
  std::vector<void*> slots(static_cast<size_t>(live), nullptr);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t checksum = 0;
  for (long i = 0; i < ops; ++i) {
    uint64_t r = Next();
    size_t slot = r % static_cast<uint64_t>(live);
    std::free(slots[slot]);
    size_t n = (r >> 20) % 64 == 0 ? 512 + (r >> 32) % 7680 : 16 + (r >> 32) % 496;
    int site = static_cast<int>((r >> 40) % 8);
    slots[slot] = Descend(site, 3 + site, n);
    checksum += reinterpret_cast<uintptr_t>(slots[slot]) & 0xff;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (void* p : slots) std::free(p);
  std::printf("memory_bench: %ld malloc/free pairs, live set %ld: %.3f s (%.1f ns/pair) [%llu]\n", ops, live, s,
              1e9 * s / static_cast<double>(ops), static_cast<unsigned long long>(checksum));
  return 0;
}
