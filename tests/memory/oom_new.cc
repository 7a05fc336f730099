// A C++ program that runs out of memory through operator new: it keeps 1 MiB
// arrays (grab_array) until new throws std::bad_alloc, which it leaves
// uncaught (std::terminate, SIGABRT), as most programs do. For
// memory_process_test.sh under ulimit -v.
#include <cstdio>
#include <vector>

static std::vector<char*>* g_keep = new std::vector<char*>;

__attribute__((noinline)) void grab_array() { g_keep->push_back(new char[1 << 20]); }

int main() {
  g_keep->reserve(1 << 16);
  std::printf("oom_new: start\n");
  std::fflush(stdout);
  for (int i = 0; i < (1 << 16); ++i) grab_array();
  std::printf("oom_new: never ran out\n");
  return 0;
}
