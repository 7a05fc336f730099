/* A program with a known memory history (issue 10's exact-numbers test):
 *   transient(): 300,000 B allocated and freed first (below the peak);
 *   leak():      3 blocks of 1,111 + 2,222 + 3,333 B, never freed;
 *   peak():      10 blocks of 100,000 B: the peak is 1,006,666 B live;
 *   then the 10 blocks are freed, and after(): 200,000 B allocated and freed.
 * Peak profile: peak() 10 x 100,000 and leak() 3 blocks, 6,666 B. Exit
 * profile: leak()'s 3 blocks only. No stdio (its buffer would be a 4th block).
 *
 * `peak_exact plateau`: small blocks freed and replaced, so that frees are
 * still waiting in the hook (tracker.cc, RemoveSoon) when the live bytes are
 * back at their high-water mark: plateau() allocates 200 blocks of 500 B
 * (100,000 B live), then 5,000 times frees one and allocates another of
 * 500 B (live stays 100,000 B), then frees 100 (the last of them still
 * waiting at exit). Peak: plateau() 200 x 500 B = 100,000 B; exit: 100 x
 * 500 B = 50,000 B. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void* volatile g_keep[16];

__attribute__((noinline)) static void* transient(size_t n) { return malloc(n); }
__attribute__((noinline)) static void* leak(size_t n) { return malloc(n); }
__attribute__((noinline)) static void* peak(size_t n) { return malloc(n); }
__attribute__((noinline)) static void* after(size_t n) { return malloc(n); }
__attribute__((noinline)) static void* plateau(size_t n) { return malloc(n); }

static void* g_blocks[200];

static int Plateau(void) {
  for (int i = 0; i < 200; ++i) g_blocks[i] = plateau(500);
  for (int i = 0; i < 5000; ++i) {
    int k = (i * 37) % 200;
    free(g_blocks[k]);
    g_blocks[k] = plateau(500);
  }
  for (int i = 0; i < 100; ++i) free(g_blocks[i]);
  static const char done[] = "peak_exact: plateau done\n";
  return write(1, done, sizeof done - 1) < 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && strcmp(argv[1], "plateau") == 0) return Plateau();
  void* t = transient(300000);
  memset(t, 1, 300000);
  free(t);
  g_keep[10] = leak(1111);
  g_keep[11] = leak(2222);
  g_keep[12] = leak(3333);
  for (int i = 0; i < 10; ++i) {
    g_keep[i] = peak(100000);
    memset(g_keep[i], 2, 100000);
  }
  for (int i = 0; i < 10; ++i) free(g_keep[i]);
  void* a = after(200000);
  memset(a, 3, 200000);
  free(a);
  static const char done[] = "peak_exact: done\n";
  if (write(1, done, sizeof done - 1) < 0) return 1;
  return 0;
}
