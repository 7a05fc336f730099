// Hostile and unusual input to the profile readers: pprof files that expand
// (one huge name referenced many times, gzip bombs, stacks of ids x lines),
// directories, values at the int64 limits; .xplane.pb bytes likewise. Each
// check runs the reader (library or the real CLI) in a child process with an
// address-space limit and reads its peak RSS from wait4.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/gzip.h"
#include "memory/pprof.h"
#include "model/xspace_import.h"
#include "spyglass/profile_reader.h"
#include "xplane.pb.h"

namespace {

namespace mem = spyglass::memory;
namespace fs = std::filesystem;

constexpr size_t kMiB = size_t{1} << 20;
constexpr rlim_t kChildAddressSpace = rlim_t{4} << 30;  // a runaway child fails fast instead of eating the VM

// ---- a minimal protobuf writer ---------------------------------------------------
struct Pb {
  std::string s;
  void raw_varint(uint64_t v) {
    while (v >= 0x80) {
      s += static_cast<char>(v | 0x80);
      v >>= 7;
    }
    s += static_cast<char>(v);
  }
  Pb& varint(uint32_t field, uint64_t v) {
    raw_varint(uint64_t{field} << 3);
    raw_varint(v);
    return *this;
  }
  Pb& bytes(uint32_t field, std::string_view b) {
    raw_varint((uint64_t{field} << 3) | 2);
    raw_varint(b.size());
    s.append(b);
    return *this;
  }
  Pb& msg(uint32_t field, const Pb& m) { return bytes(field, m.s); }
  Pb& packed(uint32_t field, const std::vector<uint64_t>& vs) {
    Pb p;
    for (uint64_t v : vs) p.raw_varint(v);
    return bytes(field, p.s);
  }
};

std::string Gzip(std::string_view in) { return spyglass::GzipCompress(in, 9); }

// `total` zero bytes, gzipped, made a MiB at a time (a ~1000:1 bomb).
std::string GzipBomb(size_t total) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 1, Z_DEFLATED, 15 + 16, 9, Z_RLE), Z_OK);
  std::string zeros(kMiB, '\0'), out;
  char buf[1 << 16];
  for (size_t done = 0; done < total;) {
    size_t n = std::min(zeros.size(), total - done);
    done += n;
    z.next_in = reinterpret_cast<Bytef*>(zeros.data());
    z.avail_in = static_cast<uInt>(n);
    int flush = done == total ? Z_FINISH : Z_NO_FLUSH;
    do {
      z.next_out = reinterpret_cast<Bytef*>(buf);
      z.avail_out = sizeof buf;
      deflate(&z, flush);
      out.append(buf, sizeof buf - z.avail_out);
    } while (z.avail_out == 0);
  }
  deflateEnd(&z);
  return out;
}

// pprof field numbers (profile.proto).
enum : uint32_t { kSampleType = 1, kSample = 2, kLocation = 4, kFunction = 5, kStringTable = 6 };

// A profile with sample types allocations/count, space/bytes whose strings
// start the table: "", allocations, count, space, bytes, then `extra`.
Pb ProfileHead(const std::vector<std::string>& extra) {
  Pb p;
  p.msg(kSampleType, Pb().varint(1, 1).varint(2, 2));
  p.msg(kSampleType, Pb().varint(1, 3).varint(2, 4));
  for (std::string_view s : {"", "allocations", "count", "space", "bytes"}) p.bytes(kStringTable, s);
  for (const std::string& s : extra) p.bytes(kStringTable, s);
  return p;
}

// One 1 MiB string (index 5) as the name and file of `refs` functions, each
// in its own location and sample, and as the value of a label on each sample.
std::string HugeNameProfile(int refs) {
  Pb p = ProfileHead({std::string(kMiB, 'A'), "kind"});
  for (int i = 1; i <= refs; ++i) {
    p.msg(kFunction, Pb().varint(1, i).varint(2, 5).varint(4, 5));
    p.msg(kLocation, Pb().varint(1, i).msg(4, Pb().varint(1, i).varint(2, 7)));
    Pb s;
    s.packed(1, {static_cast<uint64_t>(i)}).packed(2, {1, 1000}).msg(3, Pb().varint(1, 6).varint(2, 5));
    p.msg(kSample, s);
  }
  return Gzip(p.s);
}

// Valid profile with one sample per (bytes, count) value given.
std::string ValuesProfile(const std::vector<std::pair<int64_t, int64_t>>& values) {
  Pb p = ProfileHead({"site", "site.cc"});
  p.msg(kFunction, Pb().varint(1, 1).varint(2, 5).varint(4, 6));
  p.msg(kLocation, Pb().varint(1, 1).msg(4, Pb().varint(1, 1).varint(2, 3)));
  for (auto [bytes, count] : values)
    p.msg(kSample, Pb().packed(1, {1}).packed(2, {static_cast<uint64_t>(count), static_cast<uint64_t>(bytes)}));
  return Gzip(p.s);
}

// ---- running in a child ------------------------------------------------------------
struct ChildResult {
  int exit_code = -1;  // 128 + signal when killed
  long peak_rss_mib = 0;
  std::string out, err;
};

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `body` in a forked child with stdout/stderr captured and address space
// limited; the child's exit status is body's return value.
ChildResult InChild(const std::function<int()>& body) {
  static int n = 0;
  std::string base = (fs::temp_directory_path() / ("spyglass_reader_child." + std::to_string(getpid()) + "." +
                                                   std::to_string(n++))).string();
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int o = open((base + ".out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    int e = open((base + ".err").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    struct rlimit lim {kChildAddressSpace, kChildAddressSpace};
    setrlimit(RLIMIT_AS, &lim);
    int rc = 3;
    try {
      rc = body();
    } catch (const std::exception& e) {  // never back into gtest from the child
      std::fprintf(stderr, "uncaught exception: %s\n", e.what());
    }
    std::fflush(nullptr);
    _exit(rc);
  }
  ChildResult r;
  int status = 0;
  struct rusage ru {};
  while (wait4(pid, &status, 0, &ru) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.peak_rss_mib = ru.ru_maxrss / 1024;
  r.out = ReadAll(base + ".out");
  r.err = ReadAll(base + ".err");
  fs::remove(base + ".out");
  fs::remove(base + ".err");
  return r;
}

std::string Cli() {
  const char* c = std::getenv("SPYGLASS_CLI");
  return c ? c : "";
}

ChildResult RunCli(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
  args.insert(args.begin(), Cli());
  return InChild([&] {
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    return 127;
  });
}

class TempDir {
 public:
  TempDir() {
    std::string t = (fs::temp_directory_path() / "spyglass_reader_XXXXXX").string();
    path_ = mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string file(const std::string& name, std::string_view bytes) const {
    std::string p = path_ + "/" + name;
    std::ofstream(p, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return p;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

size_t LongestLine(const std::string& text) {
  size_t longest = 0, start = 0;
  for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
    longest = std::max(longest, nl - start);
  return std::max(longest, text.size() - start);
}

// ---- item 11: expansion ----------------------------------------------------------

TEST(ProfileReaderHostile, HugeNameReferencedManyTimesIsReadInBoundedMemory) {
  const std::string bytes = HugeNameProfile(20000);
  EXPECT_LT(bytes.size(), 200000u);  // small on disk
  ChildResult r = InChild([&] {
    mem::PprofProfile p;
    spyglass::Status s = mem::ParsePprof(bytes, &p);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.message().c_str());
      return 1;
    }
    std::string report = mem::MemTopReport(p, "huge.prof", 5);
    std::fwrite(report.data(), 1, report.size(), stdout);
    return p.samples.size() == 20000 && p.samples[0].frames[0].function.size() == kMiB ? 0 : 2;
  });
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  // Names are stored once and cut when printed: ~1 MiB of strings, not 20,000 copies.
  EXPECT_LT(r.peak_rss_mib, 300) << "peak RSS (MiB)";
  EXPECT_NE(r.out.find("19.1 MiB in 20,000 allocations"), std::string::npos) << r.out.substr(0, 2000);
  EXPECT_LT(LongestLine(r.out), 400u);
  EXPECT_NE(r.out.find("AAA..."), std::string::npos);
}

TEST(ProfileReaderHostile, HugeNameProfileThroughTheCli) {
  ASSERT_FALSE(Cli().empty()) << "set SPYGLASS_CLI";
  TempDir dir;
  std::string f = dir.file("huge.prof", HugeNameProfile(20000));
  ChildResult r = RunCli({"memtop", f});
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_LT(r.peak_rss_mib, 300) << "peak RSS (MiB)";
  EXPECT_LT(LongestLine(r.out), 400u);
  r = RunCli({"memdiff", f, f});
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_LT(r.peak_rss_mib, 300) << "peak RSS (MiB)";
}

// The same file is a valid profile to Go's pprof, the reference reader.
TEST(ProfileReaderHostile, GoPprofReadsTheHugeNameProfile) {
  std::string go;
  for (const char* cand : {"/usr/local/go/bin/go", "/usr/bin/go", "/usr/lib/go/bin/go"})
    if (access(cand, X_OK) == 0) go = cand;
  if (go.empty()) GTEST_SKIP() << "go is not installed";
  TempDir dir;
  std::string f = dir.file("huge.prof", HugeNameProfile(100));
  ChildResult r = InChild([&] {
    setenv("HOME", dir.path().c_str(), 1);
    setenv("PPROF_TMPDIR", dir.path().c_str(), 1);
    execl(go.c_str(), go.c_str(), "tool", "pprof", "-top", f.c_str(), static_cast<char*>(nullptr));
    return 127;
  });
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_NE(r.out.find("AAAA"), std::string::npos) << r.err.substr(0, 500);
}

TEST(ProfileReaderHostile, GzipBombStopsAtTheLimit) {
  const std::string bomb = GzipBomb(512 * kMiB);
  EXPECT_LT(bomb.size(), 4 * kMiB);
  ChildResult r = InChild([&] {
    mem::PprofProfile p;
    mem::PprofReadOptions opts;
    opts.max_bytes = 64 * kMiB;
    spyglass::Status s = mem::ParsePprof(bomb, &p, opts);
    std::fprintf(stdout, "%s\n", s.message().c_str());
    return s.ok() ? 0 : s.code() == spyglass::StatusCode::kInvalidArgument ? 1 : 2;
  });
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("exceeds the limit of 64 MiB"), std::string::npos) << r.out;
  EXPECT_LT(r.peak_rss_mib, 200) << "peak RSS (MiB)";
}

// Past the default 1 GiB through the CLI: a clear error, memory near the limit.
TEST(ProfileReaderHostile, GzipBombThroughTheCli) {
  ASSERT_FALSE(Cli().empty()) << "set SPYGLASS_CLI";
  TempDir dir;
  std::string f = dir.file("bomb.prof", GzipBomb(mem::kDefaultMaxProfileBytes + 64 * kMiB));
  ChildResult r = RunCli({"memtop", f});
  EXPECT_EQ(r.exit_code, 1) << r.err.substr(0, 500);
  EXPECT_NE(r.err.find("exceeds the limit of 1024 MiB"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_LT(r.peak_rss_mib, 1024 + 200) << "peak RSS (MiB)";
  // Lower limits: the flag, the environment; the flag wins.
  r = RunCli({"memtop", "--max-profile-mb", "16", f});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exceeds the limit of 16 MiB"), std::string::npos) << r.err.substr(0, 500);
  EXPECT_LT(r.peak_rss_mib, 150) << "peak RSS (MiB)";
  r = RunCli({"memdiff", f, f}, {"SPYGLASS_MAX_PROFILE_MB=32"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("exceeds the limit of 32 MiB"), std::string::npos) << r.err.substr(0, 500);
  r = RunCli({"memtop", "--max-profile-mb", "8", f}, {"SPYGLASS_MAX_PROFILE_MB=32"});
  EXPECT_NE(r.err.find("exceeds the limit of 8 MiB"), std::string::npos) << r.err.substr(0, 500);
  r = RunCli({"memtop", f}, {"SPYGLASS_MAX_PROFILE_MB=-5"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("SPYGLASS_MAX_PROFILE_MB must be"), std::string::npos) << r.err.substr(0, 500);
}

// A location with 50,000 inlined lines referenced 50,000 times by one sample:
// 2.5e9 frames from ~600 KB of protobuf.
TEST(ProfileReaderHostile, StackExpansionIsBounded) {
  Pb p = ProfileHead({"f", "f.cc"});
  p.msg(kFunction, Pb().varint(1, 1).varint(2, 5).varint(4, 6));
  Pb loc;
  loc.varint(1, 1);
  for (int i = 0; i < 50000; ++i) loc.msg(4, Pb().varint(1, 1).varint(2, 1));
  p.msg(kLocation, loc);
  p.msg(kSample, Pb().packed(1, std::vector<uint64_t>(50000, 1)).packed(2, {1, 1}));
  const std::string bytes = p.s;
  ChildResult r = InChild([&] {
    mem::PprofProfile prof;
    mem::PprofReadOptions opts;
    opts.max_bytes = 64 * kMiB;
    spyglass::Status s = mem::ParsePprof(bytes, &prof, opts);
    std::fprintf(stdout, "%s\n", s.message().c_str());
    return s.ok() ? 0 : 1;
  });
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.out.find("the expanded stacks exceeds the limit of 64 MiB"), std::string::npos) << r.out;
  EXPECT_LT(r.peak_rss_mib, 200) << "peak RSS (MiB)";
}

TEST(ProfileReaderHostile, PlainInputOverTheLimitIsRefused) {
  std::string plain = ProfileHead({std::string(2 * kMiB, 'x')}).s;
  mem::PprofProfile p;
  mem::PprofReadOptions opts;
  opts.max_bytes = kMiB;
  spyglass::Status s = mem::ParsePprof(plain, &p, opts);
  EXPECT_EQ(s.code(), spyglass::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceeds the limit of 1 MiB"), std::string::npos) << s.message();
  TempDir dir;
  s = mem::ReadPprofFile(dir.file("big.prof", plain), &p, opts);
  EXPECT_NE(s.message().find("exceeds the limit of 1 MiB"), std::string::npos) << s.message();
  opts.max_bytes = 4 * kMiB;
  EXPECT_TRUE(mem::ParsePprof(plain, &p, opts).ok());
}

// Profiles stay valid after the PprofProfile that read them is moved or copied.
TEST(ProfileReaderHostile, ViewsOutliveMovesAndCopies) {
  mem::PprofProfile copy;
  {
    mem::PprofProfile p;
    ASSERT_TRUE(mem::ParsePprof(ValuesProfile({{100, 1}}), &p).ok());
    mem::PprofProfile moved = std::move(p);
    copy = moved;
  }
  ASSERT_EQ(copy.samples.size(), 1u);
  EXPECT_EQ(copy.samples[0].frames[0].function, "site");
  EXPECT_EQ(mem::CallSite(copy.samples[0]), "site  site.cc:3");
}

// ---- item 12: directories, int64 limits ---------------------------------------------

TEST(ProfileReaderHostile, DirectoryIsAClearError) {
  ASSERT_FALSE(Cli().empty()) << "set SPYGLASS_CLI";
  TempDir dir;
  std::string f = dir.file("ok.prof", ValuesProfile({{100, 1}}));
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"memtop", dir.path()}, {"memdiff", dir.path(), f}, {"memdiff", f, dir.path()}}) {
    ChildResult r = RunCli(args);
    EXPECT_EQ(r.exit_code, 1) << r.err.substr(0, 500);
    EXPECT_NE(r.err.find(dir.path() + ": is a directory"), std::string::npos) << r.err.substr(0, 500);
  }
  mem::PprofProfile p;
  EXPECT_EQ(mem::ReadPprofFile(dir.path(), &p).code(), spyglass::StatusCode::kInvalidArgument);
}

TEST(ProfileReaderHostile, Int64MinIsReportedNotPrintedAsNonsense) {
  ASSERT_FALSE(Cli().empty()) << "set SPYGLASS_CLI";
  TempDir dir;
  std::string f = dir.file("min.prof", ValuesProfile({{INT64_MIN, INT64_MIN}}));
  ChildResult r = RunCli({"memtop", f});
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_NE(r.out.find("1 samples with negative values"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("-8.0 EiB in -9,223,372,036,854,775,808 allocations"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("TiB"), std::string::npos) << r.out;
}

TEST(ProfileReaderHostile, OverflowingSumsSaturateWithAWarning) {
  ASSERT_FALSE(Cli().empty()) << "set SPYGLASS_CLI";
  TempDir dir;
  // Two samples of INT64_MAX bytes used to wrap to "-2 B".
  std::string big = dir.file("big.prof", ValuesProfile({{INT64_MAX, 1}, {INT64_MAX, 1}}));
  ChildResult r = RunCli({"memtop", big});
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_NE(r.out.find("warning: sums overflow 64 bits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Live memory in " + big + ": 8.0 EiB in 2 allocations"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("-2 B"), std::string::npos) << r.out;
  // A difference past the range: INT64_MIN -> INT64_MAX.
  std::string min = dir.file("min.prof", ValuesProfile({{INT64_MIN, 1}}));
  std::string max = dir.file("max.prof", ValuesProfile({{INT64_MAX, 1}}));
  r = RunCli({"memdiff", min, max});
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_NE(r.out.find("warning: sums overflow 64 bits"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("live bytes  -8.0 EiB -> 8.0 EiB  (+8.0 EiB)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Grew (top 1 of 1)"), std::string::npos) << r.out;
}

TEST(ProfileReaderHostile, HumanBytesCoversTheRange) {
  EXPECT_EQ(mem::HumanBytes(0), "0 B");
  EXPECT_EQ(mem::HumanBytes(-2), "-2 B");
  EXPECT_EQ(mem::HumanBytes(1536), "1.5 KiB");
  EXPECT_EQ(mem::HumanBytes(INT64_MAX), "8.0 EiB");
  EXPECT_EQ(mem::HumanBytes(INT64_MIN), "-8.0 EiB");
  EXPECT_EQ(mem::HumanBytes(int64_t{3} << 50), "3.0 PiB");
}

// ---- .xplane.pb ----------------------------------------------------------------------

namespace tp = tensorflow::profiler;

// One plane where a huge event name and a huge stat name are referenced by
// `refs` events (metadata ids and ref_value stats).
std::string HugeNameXSpace(int refs, size_t name_bytes = kMiB) {
  tp::XSpace space;
  tp::XPlane* plane = space.add_planes();
  plane->set_name("/host:CPU");
  const std::string big(name_bytes, 'N');
  (*plane->mutable_event_metadata())[1].set_id(1);
  (*plane->mutable_event_metadata())[1].set_name(big);
  (*plane->mutable_stat_metadata())[1].set_id(1);
  (*plane->mutable_stat_metadata())[1].set_name("key");
  (*plane->mutable_stat_metadata())[2].set_id(2);
  (*plane->mutable_stat_metadata())[2].set_name(big);
  tp::XLine* line = plane->add_lines();
  line->set_id(1);
  for (int i = 0; i < refs; ++i) {
    tp::XEvent* e = line->add_events();
    e->set_metadata_id(1);
    e->set_offset_ps(i * 1000);
    e->set_duration_ps(500);
    tp::XStat* s = e->add_stats();
    s->set_metadata_id(1);
    s->set_ref_value(2);
  }
  return space.SerializeAsString();
}

// 100,000 references to a 16 MiB name: each used to be copied and hashed
// (~1.6 TB of memory traffic, a quarter of an hour); now a fraction of a second.
TEST(XSpaceReaderHostile, HugeNamesAreInternedOnce) {
  const std::string bytes = HugeNameXSpace(100000, 16 * kMiB);
  ChildResult r = InChild([&] {
    alarm(60);  // a hang guard only
    spyglass::model::Space space;
    spyglass::Status s = spyglass::model::ImportXSpaceBytes(bytes, &space);
    if (!s.ok()) return 1;
    const auto& plane = space.planes.at(0);
    // One event metadata and one interned ref value, however many references.
    std::printf("events=%zu event_metadata=%zu stat_metadata=%zu\n", plane.lines.at(0).events.size(),
                plane.event_metadata().size(), plane.stat_metadata().size());
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.err.substr(0, 500);
  EXPECT_NE(r.out.find("events=100000 event_metadata=2 stat_metadata=3"), std::string::npos) << r.out;
  EXPECT_LT(r.peak_rss_mib, 400) << "peak RSS (MiB)";
}

TEST(XSpaceReaderHostile, InputOverTheLimitIsRefused) {
  const std::string bytes = HugeNameXSpace(10);
  spyglass::model::Space space;
  spyglass::model::XSpaceImportOptions opts;
  opts.max_bytes = kMiB;
  spyglass::Status s = spyglass::model::ImportXSpaceBytes(bytes, &space, opts);
  EXPECT_EQ(s.code(), spyglass::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("exceed the limit of 1 MiB"), std::string::npos) << s.message();
  EXPECT_TRUE(space.planes.empty());
  opts.max_bytes = 4 * kMiB;
  EXPECT_TRUE(spyglass::model::ImportXSpaceBytes(bytes, &space, opts).ok());
}

// Lines holding ns since the epoch (ps past int64) and hostile times at the
// ends of int64: event times wrap modulo 2^64 without undefined behaviour
// (the UBSan run checks), so that the differences between events stay
// exact. (Saturating them made every event of such a file one time: its
// summary read 0 ns everywhere.)
TEST(XSpaceReaderHostile, FarTimesKeepTheirSpacing) {
  tp::XSpace in;
  tp::XPlane* plane = in.add_planes();
  plane->set_name("/host:CPU");
  (*plane->mutable_event_metadata())[1].set_name("e");
  constexpr int64_t kEpochNs = 1'700'000'000'000'000'000;
  struct Ev {
    int64_t line_ns, offset_ps;
  };
  const Ev evs[] = {{kEpochNs, 0}, {kEpochNs, 5'000'000}, {kEpochNs + 1'000'000, 0}, {INT64_MAX, INT64_MAX}, {INT64_MIN, -7}};
  for (const Ev& ev : evs) {
    tp::XLine* line = plane->add_lines();
    line->set_timestamp_ns(ev.line_ns);
    tp::XEvent* e = line->add_events();
    e->set_metadata_id(1);
    e->set_offset_ps(ev.offset_ps);
  }
  TempDir dir;
  std::string path = dir.file("far.xplane.pb", in.SerializeAsString());
  struct Starts : spyglass::profile::ProfileVisitor {
    std::vector<uint64_t> starts;
    void OnEvent(const spyglass::profile::EventRecord& e) override { starts.push_back(static_cast<uint64_t>(e.start_ps)); }
  } v;
  spyglass::profile::ProfileReader reader;
  ASSERT_TRUE(reader.Open(path).ok());
  ASSERT_TRUE(reader.Scan(v).ok());
  ASSERT_EQ(v.starts.size(), 5u);
  EXPECT_EQ(v.starts[1] - v.starts[0], 5'000'000u);      // 5 us apart on one line
  EXPECT_EQ(v.starts[2] - v.starts[0], 1'000'000'000u);  // the next line 1 ms later
}

// What the import keeps: every stat kind, ref values resolved to their names,
// unknown metadata ids as "(unknown event)", stats with unknown keys dropped.
TEST(XSpaceReaderHostile, ImportKeepsStatsAndResolvesRefs) {
  tp::XSpace in;
  tp::XPlane* plane = in.add_planes();
  plane->set_name("/host:CPU");
  auto& sm = *plane->mutable_stat_metadata();
  sm[10].set_name("i");
  sm[11].set_name("u");
  sm[12].set_name("d");
  sm[13].set_name("s");
  sm[14].set_name("r");
  sm[15].set_name("the ref value");
  auto& em = *plane->mutable_event_metadata();
  em[5].set_name("op");
  em[5].set_display_name("Op");
  tp::XStat* ms = em[5].add_stats();
  ms->set_metadata_id(14);
  ms->set_ref_value(15);
  plane->add_stats()->set_metadata_id(11);
  plane->mutable_stats(0)->set_uint64_value(7);
  tp::XLine* line = plane->add_lines();
  tp::XEvent* e = line->add_events();
  e->set_metadata_id(5);
  auto add = [&](int64_t key) {
    tp::XStat* s = e->add_stats();
    s->set_metadata_id(key);
    return s;
  };
  add(10)->set_int64_value(-3);
  add(12)->set_double_value(0.5);
  add(13)->set_str_value("text");
  add(14)->set_ref_value(15);
  add(14)->set_ref_value(99);   // no such metadata: dropped
  add(77)->set_int64_value(1);  // no such key: dropped
  line->add_events()->set_metadata_id(42);  // no such event metadata
  spyglass::model::Space space;
  ASSERT_TRUE(spyglass::model::ImportXSpaceBytes(in.SerializeAsString(), &space).ok());
  const spyglass::model::Plane& p = space.planes.at(0);
  const auto& events = p.lines.at(0).events;
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(p.event_metadata()[events[0].metadata_id].name, "op");
  EXPECT_EQ(p.event_metadata()[events[0].metadata_id].display_name, "Op");
  EXPECT_EQ(p.event_metadata()[events[1].metadata_id].name, "(unknown event)");
  std::vector<std::string> got;
  for (const auto& st : p.lines[0].stats_of(events[0])) got.push_back(p.stat_name(st) + "=" + p.stat_text(st));
  EXPECT_EQ(got, (std::vector<std::string>{"i=-3", "d=0.5", "s=text", "r=the ref value"}));
  const auto& md_stats = p.event_metadata()[events[0].metadata_id].stats;
  ASSERT_EQ(md_stats.size(), 1u);
  EXPECT_EQ(p.stat_text(md_stats[0]), "the ref value");
  ASSERT_EQ(p.stats.size(), 1u);
  EXPECT_EQ(p.stat_name(p.stats[0]) + "=" + p.stat_text(p.stats[0]), "u=7");
}

}  // namespace
