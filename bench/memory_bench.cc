// Malloc-heavy workloads for BENCHMARKS.md "Memory". They know nothing of
// Spyglass: run them plain, under LD_PRELOAD=libspyglass_heap.so, heaptrack,
// or gperftools' heap profiler.
//
//   memory_bench [OPS=5000000] [LIVE=100000]
//     OPS malloc/free pairs of mixed sizes (16 B - 512 B, 1 in 64 up to
//     8 KiB) through 8 call sites at stack depths 4-12, with a live set of
//     LIVE blocks.
//   memory_bench chain [OPS=2000000] [LIVE=0]
//     issue 10's workload: OPS malloc/free pairs of pseudo-random sizes
//     16-528 B, each malloc called through a 16-frame chain (frame pointers).
//     LIVE=0: each block is freed at once (churn, no live set); else a live
//     set of LIVE blocks, each iteration frees a random live one and
//     allocates its replacement.
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

// The chain: Chain<16> calls Chain<15> ... calls Chain<1>, which mallocs; 16
// distinct return addresses (one stack), each frame with a frame pointer.
template <int N>
__attribute__((noinline)) void* Chain(size_t n) {
  void* p;
  if constexpr (N == 1) {
    p = std::malloc(n);
    static_cast<char*>(p)[0] = 1;
  } else {
    p = Chain<N - 1>(n);
  }
  asm volatile("" ::: "memory");  // no tail call: the frame stays
  return p;
}

static int RunChain(long ops, long live) {
  std::vector<void*> slots(static_cast<size_t>(live > 0 ? live : 1), nullptr);
  for (long i = 0; i < live; ++i) slots[static_cast<size_t>(i)] = Chain<16>(16 + Next() % 513);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t checksum = 0;
  for (long i = 0; i < ops; ++i) {
    uint64_t r = Next();
    size_t n = 16 + (r >> 32) % 513;
    if (live == 0) {
      void* p = Chain<16>(n);
      checksum += reinterpret_cast<uintptr_t>(p) & 0xff;
      std::free(p);
    } else {
      size_t slot = r % static_cast<uint64_t>(live);
      std::free(slots[slot]);
      slots[slot] = Chain<16>(n);
      checksum += reinterpret_cast<uintptr_t>(slots[slot]) & 0xff;
    }
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (live > 0)
    for (void* p : slots) std::free(p);
  std::printf("memory_bench chain: %ld malloc/free pairs, live set %ld: %.3f s (%.1f ns/pair) [%llu]\n", ops, live,
              s, 1e9 * s / static_cast<double>(ops), static_cast<unsigned long long>(checksum));
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::strcmp(argv[1], "chain") == 0)
    return RunChain(argc > 2 ? std::atol(argv[2]) : 2000000, argc > 3 ? std::atol(argv[3]) : 0);
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
