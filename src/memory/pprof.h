// pprof profiles (perftools.profiles.Profile, field numbers of
// google/pprof proto/profile.proto; spec PPROF.md): the writer of our
// snapshots, a validating reader, and the memtop / memdiff reports.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::memory {

// ---- writing ----------------------------------------------------------------
struct ProfileFunction {
  std::string name, system_name, filename;
  int64_t start_line = 0;
};
struct ProfileLine {
  uint64_t function_id;  // 1-based index into functions
  int64_t line;
};
struct ProfileLocation {
  uint64_t address = 0;
  std::vector<ProfileLine> lines;  // innermost first
};
struct ProfileSample {
  std::vector<uint64_t> location_ids;  // 1-based, leaf first
  int64_t count = 0;
  int64_t bytes = 0;
  std::string kind, device;  // labels ("" = no label)
  std::vector<std::pair<std::string, std::string>> labels;  // more labels (key, value)
};
struct ProfileData {
  std::vector<ProfileFunction> functions;
  std::vector<ProfileLocation> locations;
  std::vector<ProfileSample> samples;
  int64_t time_nanos = 0;
  std::vector<std::string> comments;
  // (type, unit) of the two values, count then bytes; empty: allocations/count, space/bytes.
  std::vector<std::pair<std::string, std::string>> sample_types;
  std::pair<std::string, std::string> period_type;  // empty: none written
  int64_t period = 0;
  int64_t duration_nanos = 0;
};
// Serialized, gzipped Profile with sample types allocations/count,
// space/bytes (or data.sample_types).
std::string EncodePprofGz(const ProfileData& data, int gzip_level = 6);

// A snapshot of the tracker now (devices matching `backend`), gzipped pprof;
// `comments` go first among the profile's comments.
Status SnapshotPprof(std::string_view backend, std::string* out, std::vector<std::string> comments = {});
// The live set at each selected device's high-water mark (tracker.h, "Peak").
Status PeakPprof(std::string_view backend, std::string* out);

// ---- reading ----------------------------------------------------------------
// Default bound on what reading one profile may use: its bytes after gunzip
// plus what parsing builds from them (string table, frames, labels). memtop and
// memdiff take it from --max-profile-mb or $SPYGLASS_MAX_PROFILE_MB.
inline constexpr size_t kDefaultMaxProfileBytes = size_t{1024} << 20;  // 1 GiB

struct PprofReadOptions {
  size_t max_bytes = kDefaultMaxProfileBytes;  // over it: InvalidArgument naming the limit
};

// Strings are views into the profile's own storage (the string table is not
// copied per reference), valid while any copy of the PprofProfile lives.
struct PprofFrame {
  std::string_view function, file;
  int64_t line = 0;
};
struct PprofSample {
  std::vector<PprofFrame> frames;  // innermost first (inlined frames expanded)
  std::vector<int64_t> values;
  std::map<std::string_view, std::string_view> labels;  // numeric labels as decimal text
};
struct PprofProfile {
  std::vector<std::pair<std::string, std::string>> sample_types;  // (type, unit)
  std::vector<PprofSample> samples;
  int64_t time_nanos = 0;
  int count_index = -1, bytes_index = -1;  // of allocations/count and space/bytes
  std::vector<std::string_view> comments;  // "spyglass: peak cpu:0 1006666 bytes", ...
  std::shared_ptr<const void> storage;     // what the views point into
};
// Accepts gzipped or plain serialized profiles; any inconsistency is an
// InvalidArgument error naming what is wrong (truncated, not gzip, bad ids,
// over options.max_bytes).
Status ParsePprof(std::string_view bytes, PprofProfile* out, const PprofReadOptions& options = {});
Status ReadPprofFile(const std::string& path, PprofProfile* out, const PprofReadOptions& options = {});

// ---- reports ----------------------------------------------------------------
// Where a sample's memory was allocated from. By default the innermost Python
// frame (function, file:line) where the stack has one, else the first frame
// that is neither allocator plumbing (malloc, operator new, std:: containers,
// our API) nor a program's allocation wrapper (xmalloc, g_malloc0,
// sqlite3Malloc, PyMem_Malloc).
struct SiteOptions {
  int frames = 1;       // frames shown from the call site on ("f <- g <- ..."); 0: the whole stack
  bool native = false;  // start at the first native frame past the plumbing, even in a Python program
};
std::string CallSite(const PprofSample& s, const SiteOptions& options = {});

std::string MemTopReport(const PprofProfile& p, const std::string& name, size_t top, const SiteOptions& options = {});
std::string MemDiffReport(const PprofProfile& base, const PprofProfile& cur, const std::string& base_name,
                          const std::string& cur_name, size_t top, const SiteOptions& options = {});

// Reports sum with saturation: totals past the int64 range print as the
// limit, under a warning line; negative values are counted under a warning.
std::string HumanBytes(int64_t bytes);  // "12.3 MiB"

}  // namespace spyglass::memory
