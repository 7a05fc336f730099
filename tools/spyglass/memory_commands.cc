// `spyglass memtop` and `memdiff`: thin clients of src/memory/.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "commands.h"
#include "common/gzip.h"
#include "common/quote.h"
#include "memory/pprof.h"
#include "memory/timeline.h"
#include "memory/timeline_chart.h"
#include "memory/tracker.h"
#include "model/profile_file.h"

namespace spyglass::cli {
namespace {

// The reader's bound: --max-profile-mb, else $SPYGLASS_MAX_PROFILE_MB, else
// the library default (1024 MiB).
constexpr size_t kMaxProfileMbCeiling = size_t{1} << 24;  // 16 TiB: no overflow in MiB -> bytes

bool ReaderOptions(const char* cmd, size_t flag_mb, memory::PprofReadOptions* out) {
  size_t mb = flag_mb;
  if (mb == 0) {
    const char* env = std::getenv("SPYGLASS_MAX_PROFILE_MB");
    if (!env || !*env) return true;
    char* end = nullptr;
    errno = 0;
    unsigned long long v = std::strtoull(env, &end, 10);
    if (errno || *end || env[0] == '-' || v == 0 || v > kMaxProfileMbCeiling) {
      std::cerr << "spyglass " << cmd << ": SPYGLASS_MAX_PROFILE_MB must be a number of MiB from 1 to "
                << kMaxProfileMbCeiling << ", not '" << std::string(env).substr(0, 40) << "'\n";
      return false;
    }
    mb = static_cast<size_t>(v);
  }
  out->max_bytes = mb << 20;
  return true;
}

// memtop --over-time: the timeline of `file` (a .timeline.tsv, or a profile
// memory.<pid>.<comm>.<tag>.prof whose process wrote one beside it).
int OverTime(const std::string& file, size_t top, size_t width) {
  std::string tsv = file;
  const std::string kSuffix = ".timeline.tsv";
  if (tsv.size() < kSuffix.size() || tsv.compare(tsv.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0) {
    size_t ext = tsv.rfind(".prof");
    size_t tag = ext == std::string::npos || ext == 0 ? std::string::npos : tsv.rfind('.', ext - 1);
    if (ext != tsv.size() - 5 || tag == std::string::npos) {
      std::cerr << "spyglass memtop: --over-time reads a memory.<pid>.<program>.timeline.tsv, or a profile "
                   "memory.<pid>.<program>.<tag>.prof beside one; not "
                << QuoteInput(file) << "\n";
      return 2;
    }
    tsv = tsv.substr(0, tag) + kSuffix;
  }
  memory::Timeline t;
  if (Status s = memory::ReadTimelineFile(tsv, &t); !s.ok()) {
    std::cerr << "spyglass memtop: " << s.message() << "\n";
    return 1;
  }
  memory::TimelineChartOptions o;
  o.width = width;
  o.top_sites = std::min<size_t>(top, 20);
  std::cout << memory::TimelineChart(t, tsv, o);
  return 0;
}

}  // namespace

std::string OtherCommandFor(const std::string& path, bool from_summary) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return "";
  std::string head(64, '\0');
  {
    std::ifstream in(path, std::ios::binary);
    head.resize(static_cast<size_t>(in.read(head.data(), static_cast<std::streamsize>(head.size())).gcount()));
  }
  std::string quoted = QuoteInput(path);
  if (head.rfind("# spyglass memory timeline", 0) == 0)
    return quoted + " is a memory timeline: chart it with `spyglass memtop --over-time`";
  if (IsGzip(head)) {
    if (!from_summary) return "";  // memtop read it as a pprof already
    // A gzipped profile.proto (a trace JSON is gzipped too): parse it, within
    // a small budget, for this hint only.
    memory::PprofProfile p;
    memory::PprofReadOptions small;
    small.max_bytes = size_t{64} << 20;
    if (memory::ReadPprofFile(path, &p, small).ok())
      return quoted + " is a memory profile (pprof), not a trace: read it with `spyglass memtop` (or memdiff)";
    return "";
  }
  if (from_summary) return "";
  model::MappedFile f;
  if (f.Open(path, uint64_t{1} << 40).ok() && !f.bytes().empty() && model::CheckProfileBytes(f.bytes(), path).ok())
    return quoted + " is a trace (.xplane.pb), not a memory profile: read it with `spyglass summary` (or report)";
  return "";
}

void AddMemoryCommands(CLI::App& app) {
  auto* top = app.add_subcommand("memtop", "Top holders of live memory in a pprof memory profile, by call site");
  static std::string top_file;
  static size_t top_n = 20;
  top->add_option("profile", top_file, "memory profile (.prof, gzipped pprof)")->required();
  top->add_option("-n,--top", top_n, "how many call sites to print")->default_val(20);
  static size_t max_mb = 0;
  auto max_mb_option = [](CLI::App* cmd) {
    cmd->add_option("--max-profile-mb", max_mb,
                    "refuse a profile that needs more than this many MiB once decompressed and parsed "
                    "(default 1024, or $SPYGLASS_MAX_PROFILE_MB)")
        ->check(CLI::Range(size_t{1}, kMaxProfileMbCeiling));
  };
  max_mb_option(top);
  static memory::SiteOptions sites;
  auto site_options = [](CLI::App* cmd) {
    cmd->add_option("--frames", sites.frames,
                    "frames shown per call site, from the call site outwards (0: the whole stack, allocator "
                    "frames included)")
        ->check(CLI::Range(0, 1000))
        ->default_val(1);
    cmd->add_flag("--native", sites.native,
                  "a Python program's call site is its first native frame past the allocator, not its innermost "
                  "Python frame");
  };
  site_options(top);
  static bool over_time = false;
  static size_t chart_width = 60;
  top->add_flag("--over-time", over_time,
                "print live bytes over time as a text chart (per device, then the top call sites), from the "
                "memory.<pid>.<program>.timeline.tsv beside the profile (or given instead of it)");
  top->add_option("--width", chart_width, "columns of time in the --over-time chart")
      ->check(CLI::Range(size_t{10}, size_t{400}))
      ->default_val(60);
  top->callback([] {
    if (over_time) {
      std::exit(OverTime(top_file, top_n, chart_width));
    }
    memory::PprofProfile p;
    memory::PprofReadOptions opts;
    if (!ReaderOptions("memtop", max_mb, &opts)) std::exit(2);
    if (Status s = memory::ReadPprofFile(top_file, &p, opts); !s.ok()) {
      std::string other = OtherCommandFor(top_file, false);
      std::cerr << "spyglass memtop: " << (other.empty() ? s.message() : other) << "\n";
      std::exit(1);
    }
    std::cout << memory::MemTopReport(p, top_file, top_n, sites);
  });

  auto* diff = app.add_subcommand("memdiff", "What grew between two memory profiles, by call site (bytes and count)");
  static std::string base_file, cur_file;
  static size_t diff_n = 20;
  diff->add_option("early", base_file, "the earlier profile")->required();
  diff->add_option("late", cur_file, "the later profile")->required();
  diff->add_option("-n,--top", diff_n, "how many call sites to print")->default_val(20);
  max_mb_option(diff);
  site_options(diff);
  diff->callback([] {
    memory::PprofProfile a, b;
    memory::PprofReadOptions opts;
    if (!ReaderOptions("memdiff", max_mb, &opts)) std::exit(2);
    for (auto [file, prof] : {std::pair{&base_file, &a}, std::pair{&cur_file, &b}}) {
      if (Status s = memory::ReadPprofFile(*file, prof, opts); !s.ok()) {
        std::string other = OtherCommandFor(*file, false);
        std::cerr << "spyglass memdiff: " << (other.empty() ? s.message() : other) << "\n";
        std::exit(1);
      }
    }
    std::cout << memory::MemDiffReport(a, b, base_file, cur_file, diff_n, sites);
  });

}

}  // namespace spyglass::cli
