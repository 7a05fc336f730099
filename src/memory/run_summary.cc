#include "memory/run_summary.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <vector>

#include "export/output_file.h"
#include "memory/crash_dump.h"
#include "memory/pprof.h"
#include "memory/timeline.h"
#include "memory/timeline_chart.h"

namespace spyglass::memory {
namespace {

namespace fs = std::filesystem;

// One profile file: memory.<pid>.<comm>.<tag>.<prof|raw>, or the series
// memory.<pid>.<comm>.timeline.tsv (comm may hold dots).
struct ProfileFile {
  std::string name;
  long pid = 0;
  std::string comm, tag, ext;
};
bool ParseProfileName(const std::string& name, ProfileFile* f) {
  if (name.rfind("memory.", 0) != 0) return false;
  size_t a = 7, b = name.find('.', a);
  size_t ext = name.rfind('.');
  if (b == std::string::npos || ext == std::string::npos || ext <= b) return false;
  size_t tag = name.rfind('.', ext - 1);
  if (tag == std::string::npos || tag <= b) return false;
  std::string pid = name.substr(a, b - a);
  if (pid.empty() || pid.size() > 9 || pid.find_first_not_of("0123456789") != std::string::npos) return false;
  *f = {name, std::stol(pid), name.substr(b + 1, tag - b - 1), name.substr(tag + 1, ext - tag - 1),
        name.substr(ext + 1)};
  // Names as the hook makes them (SafeComm): nothing else is ours, nor printed.
  for (char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '+' && c != '-') return false;
  return f->ext == "prof" || f->ext == "raw" || (f->ext == "tsv" && f->tag == "timeline");
}

// Live bytes in a profile (the sum of space/bytes); -1 if unreadable.
int64_t LiveBytes(const std::string& path) {
  PprofProfile p;
  if (!ReadPprofFile(path, &p).ok() || p.bytes_index < 0) return -1;
  int64_t total = 0;
  for (const PprofSample& s : p.samples)
    if (static_cast<size_t>(p.bytes_index) < s.values.size() &&
        __builtin_add_overflow(total, s.values[p.bytes_index], &total))
      return -1;  // not a profile of ours
  return total;
}

// How the hook watched the cgroup limit, from a cgroup snapshot's comment
// (" (watched by ...)"), or "" (an older profile, unreadable).
std::string CgroupWatchedBy(const std::string& path) {
  PprofProfile p;
  if (!ReadPprofFile(path, &p).ok()) return "";
  constexpr std::string_view kWatched = ", watched by ";
  for (std::string_view c : p.comments) {
    if (c.rfind("spyglass: cgroup memory limit:", 0) != 0) continue;
    size_t at = c.find(kWatched);
    if (at != std::string_view::npos) return " (watched by " + std::string(c.substr(at + kWatched.size(), 120)) + ")";
  }
  return "";
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

// What one process left: its files and how it ended.
struct ProcessReport {
  long pid = 0;
  std::string comm;
  std::vector<std::string> files;
  int64_t peak = -1, exit = -1;  // exit: at exit, or in the dump of a dying process
  int dump_signal = 0;
  std::string ended;
};

// Turns the raw dumps of dying processes (crash_dump.h) into pprof profiles
// beside them; the dump goes once converted.
void ConvertDump(const exporter::OutputDir& out, const ProfileFile& f, ProcessReport* r, std::string* msg) {
  std::string raw;
  std::error_code ec;
  // Dumps are the tracker's tables: bounded as the profile readers are.
  if (uintmax_t size = fs::file_size(out.PathOf(f.name), ec); ec || size > kDefaultMaxProfileBytes) {
    *msg += "spyglass run: " + out.PathOf(f.name) + ": " +
            (ec ? ec.message() : "over " + std::to_string(kDefaultMaxProfileBytes >> 20) + " MiB") +
            "; left as it is\n";
    r->files.push_back(f.name);
    return;
  }
  {
    std::ifstream in(out.PathOf(f.name), std::ios::binary);
    raw.assign(std::istreambuf_iterator<char>(in), {});
  }
  std::string pprof;
  internal::DumpSummary sum;
  Status s = internal::ConvertCrashDump(raw, &pprof, &sum);
  std::string name = f.name.substr(0, f.name.size() - 3) + "prof";
  if (s.ok()) s = out.WriteBytes(name, pprof);
  if (!s.ok()) {
    *msg += "spyglass run: " + out.PathOf(f.name) + ": " + s.message() + "\n";
    r->files.push_back(f.name);
    return;
  }
  unlinkat(out.fd(), f.name.c_str(), 0);
  r->files.push_back(name);
  if (r->exit < 0) r->exit = sum.live_bytes;
  std::string what;
  if (sum.reason == internal::DumpReason::kOutOfMemory) {
    what = "out of memory: an allocation of " + HumanBytes(static_cast<int64_t>(sum.failed_bytes)) +
           " failed" + (sum.failed_site.empty() ? "" : " in " + sum.failed_site);
  } else {
    r->dump_signal = sum.signal;
    what = "killed by " + SignalName(sum.signal) + " (snapshot at the signal)";
  }
  r->ended = r->ended.empty() ? what : r->ended + "; " + what;
}

constexpr const char* kNearCgroupLimit = "passed 90% of its cgroup memory limit";

}  // namespace

DirListing ListDir(const std::string& dir) {
  DirListing out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    out[e.path().filename().string()] = e.last_write_time(ec).time_since_epoch().count();
  return out;
}

std::string SummarizeRun(const std::string& dir, long main_pid, ProgramEnd end, const DirListing& before,
                         bool chart) {
  std::string msg;
  exporter::OutputDir out;
  if (Status s = exporter::OutputDir::Open(dir, &out); !s.ok()) return "spyglass run: " + s.message() + "\n";
  std::map<long, ProcessReport> procs;
  std::vector<ProfileFile> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    ProfileFile f;
    if (!ParseProfileName(e.path().filename().string(), &f)) continue;
    auto old = before.find(f.name);
    if (old != before.end() && old->second == e.last_write_time(ec).time_since_epoch().count())
      continue;  // from an earlier run
    files.push_back(f);
  }
  // Dumps first: a .raw becomes a .prof of the same stem.
  std::sort(files.begin(), files.end(), [](const ProfileFile& a, const ProfileFile& b) {
    return std::make_tuple(a.pid, a.ext != "raw", a.name) < std::make_tuple(b.pid, b.ext != "raw", b.name);
  });
  for (const ProfileFile& f : files) {
    ProcessReport& r = procs[f.pid];
    r.pid = f.pid;
    r.comm = f.comm;
    if (f.ext == "raw") {
      ConvertDump(out, f, &r, &msg);
      continue;
    }
    if (std::find(r.files.begin(), r.files.end(), f.name) != r.files.end()) continue;
    r.files.push_back(f.name);
    if (f.tag == "exit") r.exit = LiveBytes(out.PathOf(f.name));
    if (f.tag == "peak") r.peak = LiveBytes(out.PathOf(f.name));
    if (f.tag == "cgroup") {
      const std::string near = kNearCgroupLimit + CgroupWatchedBy(out.PathOf(f.name));
      r.ended = r.ended.empty() ? near : r.ended + "; " + near;
    }
  }
  if (procs.empty()) {
    return msg + "spyglass run: no memory profile was written (did the program exit through _exit, or was it "
                 "killed by SIGKILL?)\n";
  }
  for (auto& [pid, r] : procs) {
    if (pid == main_pid) {
      std::string how = end.signaled ? "killed by " + SignalName(end.code) : "exit status " + std::to_string(end.code);
      if (end.signaled && end.code == r.dump_signal) how.clear();  // the dump says it
      r.ended = r.ended.empty() ? how : how.empty() ? r.ended : how + "; " + r.ended;
    } else if (r.ended.empty()) {
      r.ended = r.exit >= 0 ? "exited" : "";
    }
  }
  std::vector<ProcessReport*> order;
  if (procs.count(main_pid)) order.push_back(&procs[main_pid]);
  for (auto& [pid, r] : procs)
    if (pid != main_pid) order.push_back(&r);
  auto bytes = [](int64_t b) { return b < 0 ? std::string("-") : HumanBytes(b); };
  msg += "spyglass run: memory profiles in " + dir + "/ (" + std::to_string(procs.size()) +
         (procs.size() == 1 ? " process" : " processes") + ")\n";
  char line[1024];
  std::snprintf(line, sizeof line, "  %-8s %-22s %12s %12s  %s\n", "pid", "program", "peak", "at the end", "how it ended");
  msg += line;
  std::string read_first;
  for (ProcessReport* r : order) {
    std::string prog = r->comm + (r->pid == main_pid ? " (main)" : "");
    std::snprintf(line, sizeof line, "  %-8ld %-22s %12s %12s  %s\n", r->pid, prog.c_str(), bytes(r->peak).c_str(),
                  bytes(r->exit).c_str(), r->ended.c_str());
    msg += line;
    for (const std::string& f : r->files) msg += "           " + f + "\n";
    if (read_first.empty()) {
      // The program's most telling profile: its dump, else the exit snapshot, else any.
      for (const char* tag : {".oom.prof", ".signal.prof", ".exit.prof", ".peak.prof", ".prof"})
        for (const std::string& f : r->files)
          if (read_first.empty() && f.size() > std::strlen(tag) && f.compare(f.size() - std::strlen(tag), std::string::npos, tag) == 0)
            read_first = out.PathOf(f);
    }
  }
  if (!read_first.empty())
    msg += "Read them with: spyglass memtop " + read_first + "   or   go tool pprof -top " + read_first + "\n";
  std::string timeline;
  if (procs.count(main_pid))
    for (const std::string& f : procs[main_pid].files)
      if (f.size() > 13 && f.compare(f.size() - 13, 13, ".timeline.tsv") == 0) timeline = out.PathOf(f);
  if (timeline.empty()) return msg;
  msg += "Over time: spyglass memtop --over-time " + timeline + "\n";
  if (chart) {
    Timeline t;
    if (Status s = ReadTimelineFile(timeline, &t); s.ok())
      msg += "\n" + TimelineChart(t, timeline);
    else
      msg += "spyglass run: " + s.message() + "\n";
  }
  return msg;
}


}  // namespace spyglass::memory
