// A program that knows nothing of Spyglass, for the heap hook's hostile cases
// (memory_hostile_test.sh):
//   heap_hostile realloc          failed realloc/reallocarray keep the old block
//   heap_hostile sample T N       T threads keep N blocks each of known sizes;
//                                 prints the exact total and, for the interval in
//                                 $SPYGLASS_HEAP_SAMPLE_BYTES, the estimate's sigma
//   heap_hostile apis             every allocation function, all recorded
//                                 (SPYGLASS_HEAP_SAMPLE_BYTES=1): kept_apis keeps
//                                 7 x 3000 B + 1 MiB, freed_apis frees all with free()
//   heap_hostile small T          T threads keep one 16-byte block each
//   heap_hostile fork N           N children that exit(0) (destructors run)
//   heap_hostile daemon           fork; the parent exits, the child exits later
//   heap_hostile dlopen LIB       keeps a block allocated by LIB, dlcloses LIB
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

static void* volatile g_sink;
static size_t volatile g_huge = SIZE_MAX / 2;  // > PTRDIFF_MAX: glibc refuses it (ENOMEM)

__attribute__((noinline)) void* keep_block() {
  void* p = std::malloc(200);
  void* q = std::realloc(p, g_huge);
  if (q != nullptr || errno != ENOMEM) std::printf("realloc of %zu bytes did not fail\n", g_huge);
  return p;  // still ours
}

__attribute__((noinline)) void* keep_block_array() {
  void* p = std::malloc(300);
  if (reallocarray(p, g_huge / 4, 4) != nullptr) std::printf("reallocarray (ENOMEM) did not fail\n");
  if (reallocarray(p, g_huge, 4) != nullptr) std::printf("reallocarray (overflow) did not fail\n");
  return p;
}

__attribute__((noinline)) void* grow_block() {
  void* p = std::malloc(100);
  return std::realloc(p, 5000);
}

__attribute__((noinline)) void* shrink_block() {
  void* p = std::malloc(4000);
  return std::realloc(p, 1000);  // usually in place
}

// ---- every allocation function, then free() ----------------------------------
static bool g_apis_ok = true;
static void Expect(bool ok, const char* what) {
  if (!ok) std::printf("apis: %s\n", what);
  g_apis_ok = g_apis_ok && ok;
}
static bool Zero(const void* p, size_t n) {
  for (size_t i = 0; i < n; ++i)
    if (static_cast<const unsigned char*>(p)[i]) return false;
  return true;
}
static bool Aligned(const void* p, size_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }

// Allocates 7 x 3000 B and 1 MiB (calloc'ed: zero) with each function;
// writes them; into out[0..8).
__attribute__((noinline)) void apis(void** out) {
  out[0] = std::malloc(3000);
  out[1] = std::calloc(3, 1000);
  Expect(out[1] && Zero(out[1], 3000), "calloc(3, 1000) not zeroed");
  void* r = std::malloc(100);
  void* blocker = std::malloc(100);  // realloc has to move r
  std::memset(r, 7, 100);
  out[2] = std::realloc(r, 3000);
  Expect(out[2] && static_cast<unsigned char*>(out[2])[99] == 7, "realloc lost the contents");
  std::free(blocker);
  out[3] = std::aligned_alloc(64, 3000);
  Expect(out[3] && Aligned(out[3], 64), "aligned_alloc(64) not aligned");
  Expect(posix_memalign(&out[4], 256, 3000) == 0 && Aligned(out[4], 256), "posix_memalign(256) not aligned");
  out[5] = memalign(32, 3000);
  Expect(out[5] && Aligned(out[5], 32), "memalign(32) not aligned");
  out[6] = new (std::nothrow) char[3000];
  out[7] = std::calloc(1, 1 << 20);
  Expect(out[7] && Zero(out[7], 1 << 20), "calloc(1 MiB) not zeroed");
  for (int i = 0; i < 8; ++i) {
    Expect(out[i] != nullptr, "an allocation failed");
    if (out[i]) std::memset(out[i], 1, i == 7 ? 1 << 20 : 3000);
  }
}
__attribute__((noinline)) void kept_apis(void** out) { apis(out); }
__attribute__((noinline)) void freed_apis() {
  void* b[8];
  apis(b);
  for (int i = 0; i < 8; ++i)
    if (i == 6)
      delete[] static_cast<char*>(b[i]);
    else
      std::free(b[i]);
}

// ---- sampling ----------------------------------------------------------------
static int g_blocks = 0;
static void** g_kept = nullptr;

static size_t BlockSize(int thread, int i) {
  return 16 + (static_cast<uint64_t>(i) * 2654435761u + static_cast<uint64_t>(thread) * 40503u) % 2033;
}

__attribute__((noinline)) void alloc_blocks(int thread) {
  for (int i = 0; i < g_blocks; ++i) g_kept[static_cast<size_t>(thread) * g_blocks + i] = std::malloc(BlockSize(thread, i));
}

static void* SampleThread(void* arg) {
  alloc_blocks(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
  return nullptr;
}

__attribute__((noinline)) void one_small_block(int thread) { g_kept[thread] = std::malloc(16); }

static void* SmallThread(void* arg) {
  one_small_block(static_cast<int>(reinterpret_cast<intptr_t>(arg)));
  return nullptr;
}

static int RunThreads(int threads, void* (*fn)(void*)) {
  for (int t = 0; t < threads; ++t) {
    pthread_t th;
    // One at a time: each thread's sampling state is fresh.
    if (pthread_create(&th, nullptr, fn, reinterpret_cast<void*>(static_cast<intptr_t>(t))) != 0) return 1;
    pthread_join(th, nullptr);
  }
  return 0;
}

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "realloc") {
    g_sink = keep_block();
    g_sink = keep_block_array();
    g_sink = grow_block();
    g_sink = shrink_block();
    std::printf("realloc: done\n");
    return 0;
  }
  if (mode == "apis") {
    static void* kept[8];
    kept_apis(kept);
    for (int i = 0; i < 20; ++i) freed_apis();
    std::printf(g_apis_ok ? "apis: done\n" : "apis: FAILED\n");
    return g_apis_ok ? 0 : 1;
  }
  if (mode == "sample" && argc > 3) {
    int threads = std::atoi(argv[2]);
    g_blocks = std::atoi(argv[3]);
    g_kept = static_cast<void**>(std::calloc(static_cast<size_t>(threads) * g_blocks, sizeof(void*)));
    if (RunThreads(threads, SampleThread) != 0) return 1;
    // Each block of size s is sampled with p = 1 - exp(-s/I) and then weighs
    // s/p: its variance is s^2 (1-p)/p.
    const char* iv = std::getenv("SPYGLASS_HEAP_SAMPLE_BYTES");
    double interval = iv ? std::atof(iv) : 0, exact = 0, var = 0;
    for (int t = 0; t < threads; ++t)
      for (int i = 0; i < g_blocks; ++i) {
        double s = static_cast<double>(BlockSize(t, i));
        exact += s;
        if (interval > 0) {
          double p = -std::expm1(-s / interval);
          var += s * s * (1 - p) / p;
        }
      }
    std::printf("exact_bytes=%.0f sigma_bytes=%.0f\n", exact, std::sqrt(var));
    return 0;
  }
  if (mode == "small" && argc > 2) {
    int threads = std::atoi(argv[2]);
    g_kept = static_cast<void**>(std::calloc(threads, sizeof(void*)));
    if (RunThreads(threads, SmallThread) != 0) return 1;
    std::printf("small: done\n");
    return 0;
  }
  if (mode == "fork" && argc > 2) {
    int n = std::atoi(argv[2]);
    for (int i = 0; i < n; ++i) {
      pid_t pid = fork();
      if (pid < 0) return 1;
      if (pid == 0) {
        g_sink = std::malloc(64);
        std::exit(0);  // atexit handlers and destructors run, as in most programs
      }
      int st = 0;
      if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return 1;
    }
    std::printf("fork: %d children ok\n", n);
    return 0;
  }
  if (mode == "daemon") {
    // fork, the parent exits at once, the child goes on and exits normally.
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid > 0) {
      std::printf("daemon: %d\n", pid);
      std::fflush(stdout);
      _exit(0);
    }
    for (int i = 0; i < 1000 && getppid() == parent; ++i) usleep(10000);
    g_sink = std::malloc(64);
    std::exit(0);
  }
  if (mode == "dlopen" && argc > 2) {
    void* h = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      std::printf("dlopen: %s\n", dlerror());
      return 1;
    }
    auto fn = reinterpret_cast<void* (*)(size_t)>(dlsym(h, "spyglass_test_lib_alloc"));
    if (!fn) return 1;
    g_sink = fn(12345);
    // A second handle: the first dlclose does not unload the library.
    void* h2 = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
    if (!h2 || dlclose(h2) != 0 || !dlopen(argv[2], RTLD_NOW | RTLD_NOLOAD)) return 1;
    if (dlclose(h) != 0) return 1;  // (the NOLOAD probe took a reference too)
    if (dlclose(h) != 0) return 1;
    // Unloaded for real (not kept by a NODELETE flag): the test relies on it.
    void* again = dlopen(argv[2], RTLD_NOW | RTLD_NOLOAD);
    std::printf("dlopen: done (%s)\n", again ? "still loaded" : "unloaded");
    return 0;
  }
  std::fprintf(stderr, "usage: heap_hostile realloc|sample T N|small T|fork N|dlopen LIB\n");
  return 2;
}
