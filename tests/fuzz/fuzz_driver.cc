// A deterministic, seeded mutation fuzzer for targets written against the
// libFuzzer entry point, built with the project's own compiler (g++ has no
// libFuzzer). It runs the seeds, then mutated inputs until the time budget is
// spent, and stops with a non-zero status on the first crash, abort or uncaught
// exception, leaving the input that caused it in ./fuzz-crash-<target>.bin.
//
//   <target> [--seconds N] [--seed S] [--max-len N] SEED_FILE_OR_DIR...
//
// SPYGLASS_FUZZ_SECONDS overrides the default budget (60 s); the address space
// is capped (SPYGLASS_FUZZ_AS_MB, default 4096) so that an input that makes the
// target allocate without bound fails as a crash instead of filling the machine.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;
using Bytes = std::vector<uint8_t>;

const char* g_name = "target";
const Bytes* g_current = nullptr;  // the input being run, written out on a crash

// Writes the current input with async-signal-safe calls only.
void SaveCurrent() {
  if (!g_current) return;
  char path[256];
  snprintf(path, sizeof path, "fuzz-crash-%s.bin", g_name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  size_t done = 0;
  while (done < g_current->size()) {
    ssize_t n = write(fd, g_current->data() + done, g_current->size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  close(fd);
  const char msg[] = "\nfuzz: the input that crashed the target is in ./fuzz-crash-<target>.bin\n";
  (void)!write(2, msg, sizeof msg - 1);
}

void OnCrash(int sig) {
  SaveCurrent();
  signal(sig, SIG_DFL);
  raise(sig);
}

void OnTerminate() {
  const char msg[] = "fuzz: uncaught exception out of the target\n";
  (void)!write(2, msg, sizeof msg - 1);
  SaveCurrent();
  std::abort();
}

Bytes ReadFile(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return Bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void AddSeeds(const fs::path& p, std::vector<Bytes>* seeds) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(p, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());  // deterministic order
    for (const auto& f : files) seeds->push_back(ReadFile(f));
  } else if (fs::is_regular_file(p, ec)) {
    seeds->push_back(ReadFile(p));
  } else {
    std::fprintf(stderr, "fuzz: no seed file or directory %s\n", p.c_str());
    std::exit(2);
  }
}

// Values that often hit edge cases in length and integer fields.
constexpr uint8_t kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0xfe, 0x10, 0x40, 0x20};

void Mutate(Bytes* b, const std::vector<Bytes>& seeds, std::mt19937_64& rng, size_t max_len) {
  auto pick = [&](size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng() % n); };
  int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 8) {
      case 0:  // flip a bit
        if (!b->empty()) (*b)[pick(b->size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // set a byte to an interesting value
        if (!b->empty()) (*b)[pick(b->size())] = kInteresting[rng() % sizeof kInteresting];
        break;
      case 2:  // random byte
        if (!b->empty()) (*b)[pick(b->size())] = static_cast<uint8_t>(rng());
        break;
      case 3: {  // insert random bytes
        size_t at = pick(b->size() + 1), n = 1 + pick(16);
        Bytes ins(n);
        for (auto& x : ins) x = static_cast<uint8_t>(rng());
        b->insert(b->begin() + static_cast<long>(at), ins.begin(), ins.end());
        break;
      }
      case 4: {  // erase a range
        if (b->empty()) break;
        size_t at = pick(b->size()), n = 1 + pick(std::min<size_t>(b->size() - at, 32));
        b->erase(b->begin() + static_cast<long>(at), b->begin() + static_cast<long>(at + n));
        break;
      }
      case 5: {  // duplicate a range (repeated fields, nested messages)
        if (b->empty()) break;
        size_t at = pick(b->size()), n = 1 + pick(std::min<size_t>(b->size() - at, 64));
        Bytes copy(b->begin() + static_cast<long>(at), b->begin() + static_cast<long>(at + n));
        size_t to = pick(b->size() + 1);
        b->insert(b->begin() + static_cast<long>(to), copy.begin(), copy.end());
        break;
      }
      case 6: {  // splice in part of another seed
        const Bytes& o = seeds[pick(seeds.size())];
        if (o.empty()) break;
        size_t from = pick(o.size()), n = 1 + pick(o.size() - from);
        size_t at = pick(b->size() + 1);
        b->insert(b->begin() + static_cast<long>(at), o.begin() + static_cast<long>(from),
                  o.begin() + static_cast<long>(from + n));
        break;
      }
      case 7:  // truncate
        if (!b->empty()) b->resize(pick(b->size()));
        break;
    }
  }
  if (b->size() > max_len) b->resize(max_len);
}

}  // namespace

int main(int argc, char** argv) {
  std::string self = fs::path(argv[0]).filename().string();
  static std::string name = self;
  g_name = name.c_str();
  double seconds = 60;
  if (const char* e = std::getenv("SPYGLASS_FUZZ_SECONDS")) seconds = std::atof(e);
  uint64_t seed = 1;
  size_t max_len = 1 << 20;
  std::vector<Bytes> seeds;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--max-len" && i + 1 < argc) max_len = std::strtoull(argv[++i], nullptr, 10);
    else AddSeeds(a, &seeds);
  }
  if (seeds.empty()) seeds.push_back({});

  uint64_t as_mb = 4096;
  if (const char* e = std::getenv("SPYGLASS_FUZZ_AS_MB")) as_mb = std::strtoull(e, nullptr, 10);
  if (as_mb > 0) {
    struct rlimit rl{as_mb << 20, as_mb << 20};
    setrlimit(RLIMIT_AS, &rl);
  }
  for (int sig : {SIGSEGV, SIGBUS, SIGABRT, SIGFPE, SIGILL}) signal(sig, OnCrash);
  std::set_terminate(OnTerminate);

  auto run = [](const Bytes& b) {
    g_current = &b;
    LLVMFuzzerTestOneInput(b.data(), b.size());
    g_current = nullptr;
  };
  for (const Bytes& s : seeds) run(s);

  std::mt19937_64 rng(seed);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = seeds.size();
  Bytes input;
  while (std::chrono::steady_clock::now() < deadline) {
    for (int i = 0; i < 64; ++i, ++runs) {
      input = seeds[rng() % seeds.size()];
      Mutate(&input, seeds, rng, max_len);
      run(input);
    }
  }
  std::printf("fuzz %s: %llu inputs in %.0f s (seed %llu), no crash\n", g_name, static_cast<unsigned long long>(runs),
              seconds, static_cast<unsigned long long>(seed));
  return 0;
}
