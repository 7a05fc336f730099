// What a profiled run left in its directory, summed up (`spyglass run` and
// `python -m spyglass run`): the raw dumps of dying processes
// (memory/crash_dump.h) turned into pprof profiles, then one line per process
// that left files, the program first, with its peak and final live bytes and
// how it ended (exit status, fatal signal, out of memory, near a cgroup
// limit), and its files.
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace spyglass::memory {

// A directory's files (name -> modification time, ns) before a run: those
// unchanged since are not the run's.
using DirListing = std::map<std::string, int64_t>;
DirListing ListDir(const std::string& dir);

// How the program (the process the run started) ended.
struct ProgramEnd {
  bool signaled = false;
  int code = 0;  // exit status, or the signal
};

// Converts the run's dumps and returns the summary text (for stderr); with
// `chart`, the program's timeline chart (memtop --over-time) after it.
std::string SummarizeRun(const std::string& dir, long main_pid, ProgramEnd end, const DirListing& before,
                         bool chart = false);

}  // namespace spyglass::memory
