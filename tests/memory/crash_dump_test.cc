// The dump of a dying process (memory/crash_dump.h): written from the tracker
// without allocating, read back into a pprof profile with the same numbers,
// and hostile dumps (truncated, corrupted, lying lengths) refused cleanly.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <string>

#include "memory/crash_dump.h"
#include "memory/pprof.h"
#include "memory/tracker.h"
#include "memory/unwind.h"
#include "spyglass/memory.h"
#include "test_util.h"

namespace mem = spyglass::memory;
namespace in = spyglass::memory::internal;

namespace {

const void* P(uintptr_t i) { return reinterpret_cast<const void*>((uintptr_t{0x5151} << 32) + i * 64); }

__attribute__((noinline)) void KeepDumpBlocks() {
  for (int i = 0; i < 3; ++i) mem::record_allocation(P(i), 1000, "cpu:0", "heap");
  mem::record_allocation(P(10), 777, "gpu:0", "buffer");
  asm volatile("" ::: "memory");
}

// As the heap hook does: the stack from the hooked function's caller on.
__attribute__((noinline)) int CaptureFromCaller(uintptr_t* frames, int max) {
  int n = in::CaptureFramePointers(__builtin_frame_address(0), frames, max);
  asm volatile("" ::: "memory");
  return n;
}
__attribute__((noinline)) int AllocateTooMuch(uintptr_t* frames, int max) {
  int n = CaptureFromCaller(frames, max);
  asm volatile("" ::: "memory");
  return n;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// One dump per process: written once, then read by every test.
const std::string& Dump() {
  static const std::string raw = [] {
    std::string dir = spyglass::testing::MakeTempDir("crash-dump");
    int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT_GE(fd, 0);
    EXPECT_TRUE(in::PrepareCrashDump(fd));
    KeepDumpBlocks();
    uintptr_t frames[64];
    in::FailedAllocation failed{123456, frames, AllocateTooMuch(frames, 64)};
    EXPECT_FALSE(in::CrashDumpWritten());
    EXPECT_TRUE(in::WriteCrashDump(in::DumpReason::kOutOfMemory, 0, &failed));
    EXPECT_TRUE(in::CrashDumpWritten());
    EXPECT_FALSE(in::WriteCrashDump(in::DumpReason::kSignal, 11, nullptr));  // once per process
    char name[160];
    in::FormatProfileName(name, sizeof name, "oom", ".raw");
    std::string raw = ReadFile(dir + "/" + name);
    EXPECT_FALSE(raw.empty()) << dir << "/" << name;
    for (int i = 0; i < 3; ++i) mem::record_free(P(i));
    mem::record_free(P(10));
    return raw;
  }();
  return raw;
}

TEST(CrashDump, NameIsPidAndProgram) {
  char name[160];
  size_t n = in::FormatProfileName(name, sizeof name, "exit", ".prof");
  EXPECT_EQ(std::string(name, n), "memory." + std::to_string(getpid()) + ".crash_dump_test.exit.prof");
  char tiny[8];
  EXPECT_EQ(in::FormatProfileName(tiny, sizeof tiny, "exit", ".prof"), 7u);  // cut, NUL-terminated
  EXPECT_EQ(std::string(tiny), "memory.");
}

TEST(CrashDump, ReadBackHasTheLiveSetAndTheFailedAllocation) {
  std::string gz;
  in::DumpSummary sum;
  ASSERT_TRUE(in::ConvertCrashDump(Dump(), &gz, &sum).ok());
  EXPECT_EQ(sum.pid, static_cast<uint32_t>(getpid()));
  EXPECT_EQ(sum.comm, "crash_dump_test");
  EXPECT_EQ(sum.reason, in::DumpReason::kOutOfMemory);
  EXPECT_EQ(sum.failed_bytes, 123456u);
  EXPECT_NE(sum.failed_site.find("AllocateTooMuch"), std::string::npos) << sum.failed_site;
  EXPECT_EQ(sum.skipped_shards, 0u);
  mem::PprofProfile p;
  ASSERT_TRUE(mem::ParsePprof(gz, &p).ok());
  int64_t keep_bytes = 0, keep_count = 0, gpu_bytes = 0, failed = 0;
  for (const mem::PprofSample& s : p.samples) {
    bool keep = false;
    for (const mem::PprofFrame& f : s.frames) keep |= f.function.find("KeepDumpBlocks") != std::string::npos;
    if (s.labels.at("kind") == "failed") {
      ++failed;
      EXPECT_EQ(s.values[p.bytes_index], 0);
      EXPECT_EQ(s.values[p.count_index], 1);
      ASSERT_FALSE(s.frames.empty());
      EXPECT_NE(std::string(s.frames[0].function).find("AllocateTooMuch"), std::string::npos);
    } else if (keep && s.labels.at("device") == "cpu:0") {
      keep_bytes += s.values[p.bytes_index];
      keep_count += s.values[p.count_index];
    } else if (keep && s.labels.at("device") == "gpu:0") {
      gpu_bytes += s.values[p.bytes_index];
    }
  }
  EXPECT_EQ(keep_bytes, 3000);
  EXPECT_EQ(keep_count, 3);
  EXPECT_EQ(gpu_bytes, 777);
  EXPECT_EQ(failed, 1);
}

TEST(CrashDump, HostileDumpsAreRefused) {
  const std::string& good = Dump();
  std::string gz;
  auto refused = [&](const std::string& raw) {
    spyglass::Status s = in::ConvertCrashDump(raw, &gz, nullptr);
    return !s.ok() && s.code() == spyglass::StatusCode::kInvalidArgument &&
           s.message().find("not a valid spyglass memory dump") != std::string::npos;
  };
  EXPECT_TRUE(refused(""));
  EXPECT_TRUE(refused(std::string(200, 'x')));
  // Every truncation (the end record is the last 8 bytes).
  for (size_t n = 0; n + 1 < good.size(); n += (n < 4096 ? 1 : 997)) EXPECT_TRUE(refused(good.substr(0, n))) << n;
  // A record length past the end, or over the bound.
  std::string lying = good;
  uint32_t huge = 0xfffffff0u;
  std::memcpy(&lying[72 + 4], &huge, 4);  // the first record's length (after the 72-byte header)
  EXPECT_TRUE(refused(lying));
  // Random corruption: refused or read, never a crash (bounded: 2000 tries).
  std::mt19937 rng(7);
  for (int i = 0; i < 2000; ++i) {
    std::string bad = good;
    for (int k = 0; k < 4; ++k) bad[rng() % bad.size()] = static_cast<char>(rng());
    spyglass::Status s = in::ConvertCrashDump(bad, &gz, nullptr);
    if (!s.ok()) EXPECT_EQ(s.code(), spyglass::StatusCode::kInvalidArgument);
  }
}

}  // namespace
