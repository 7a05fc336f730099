// `spyglass view`'s index of a run: the report's timeline (levels of detail
// per lane, report/timeline.h) built once by streaming the run's files, each
// sorted line placed event by event (no line held in memory), the lanes'
// levels written to an index file (in $TMPDIR, through OutputDir: no link
// followed) that is mapped and unlinked at once, so that nothing is left
// behind. A window query reads only the chunks of the levels it returns
// (kStreamChunkBytes each) and gives their pages back after: memory stays
// the names, the seek points and what one answer holds.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <set>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "report/timeline.h"
#include "spyglass/status.h"

namespace spyglass::exporter {
class OutputDir;
}

namespace spyglass::view {

// Counter points decoded between two seek points at most (lanes seek by
// their chunks, report::kStreamChunkBytes each).
inline constexpr uint32_t kSeekStride = 256;
inline constexpr int kMaxWindowPixels = 20000;

// How far Build is, for the page shown meanwhile (read from other threads).
struct BuildProgress {
  std::atomic<uint64_t> read{0};   // bytes of the run's files placed so far
  std::atomic<uint64_t> size{0};   // the files' bytes in all
  std::atomic<uint64_t> events{0}; // events placed so far
  std::atomic<uint32_t> pass{1};   // 2: a line came out of order, the files are read again
};

// Where built indexes are kept to be reused by the next start on the same
// files (unchanged: same device, inode, size and mtime).
struct CacheOptions {
  // The cache directory: made 0700 if missing (with its parent); refused,
  // with a line said, when it or its parent is a symbolic link, another
  // user's, or writable by group or others (the index is then temporary).
  std::string dir;
  uint64_t max_bytes = uint64_t{4} << 30;  // all cached indexes together: the least recently used go
  std::function<void(const std::string&)> say;  // one line for each decision worth telling
};

// What identifies the files of a run for the cache: each one's device,
// inode, size and mtime (ns), with the index format; empty if one cannot be
// looked at.
std::string CacheKey(const std::vector<std::string>& files);
// Opens the cache's directory, made if missing; refused (false, with a
// line said) as CacheOptions says.
bool OpenCacheDir(const CacheOptions& cache, exporter::OutputDir* dir);
// A text kept beside the index (the run's summary, named `what`) for the
// files of `key`: read back whole (checksummed) or not at all.
bool ReadCachedText(const CacheOptions& cache, const std::string& key, const std::string& what, std::string* text);
void WriteCachedText(const CacheOptions& cache, const std::string& key, const std::string& what, const std::string& text);

class ViewIndex {
 public:
  ViewIndex() = default;
  ~ViewIndex();
  ViewIndex(const ViewIndex&) = delete;
  ViewIndex& operator=(const ViewIndex&) = delete;

  // Reads every file (several: hosts of one run, their planes prefixed by
  // the file's stem), one line at a time. Lines are taken as sorted (placed
  // as they come, one pass); if any event came out of order, the lines that
  // are not are found and the files read again.
  // With `cache`, an index cached for the same files (and index format) is
  // mapped instead, once its checksums and bounds are found right (a
  // truncated or corrupt one is rebuilt, and said so); a new one is kept
  // there.
  Status Build(const std::vector<std::string>& files, BuildProgress* progress = nullptr,
               const CacheOptions* cache = nullptr);
  // Whether Build mapped a cached index.
  bool reused() const { return reused_; }
  const report::Timeline& timeline() const { return tl_; }
  // Bytes of the lanes' levels in the index file (those kept, and those made past their first merge and dropped).
  uint64_t index_bytes() const { return map_bytes_; }
  // One chunk of a lane's level, as the index file holds it.
  std::string_view ChunkBytes(const report::TimelineChunk& c) const {
    return {reinterpret_cast<const char*>(map_) + c.offset, c.bytes};
  }

  // The run between t0_ns and t1_ns (from timeline().start_ns) as drawn on
  // `pixels` columns: a Timeline with the same tracks, lanes and counters
  // (names and details are not copied: the ids index timeline()'s), each lane
  // and counter holding one level, the coarsest that merges only what is
  // under a pixel (level 0, the events themselves, when zoomed in), cut to
  // the spans that overlap the window (counters: the point before and the
  // one after too). Its blob holds only those.
  report::Timeline Window(int64_t t0_ns, int64_t t1_ns, int pixels) const;

  struct Seek {
    uint64_t offset;  // in the blob, of the span (point) that follows
    int64_t prev_ns;  // end of the span (time of the point) before it
  };

 private:
  // One pass over the files into a new index file; `out_of_order`: events
  // of lines taken as sorted that were not (the index is then unusable).
  // Into `name` in `dir`, then mapped: unlinked at once without `key` (a
  // temporary index), kept with it (a cached one: the timeline and the key
  // follow the levels, then a trailer with their checksums).
  Status BuildPass(const std::vector<std::string>& files, const std::vector<std::set<std::pair<size_t, size_t>>>& unsorted,
                   BuildProgress* progress, uint64_t* out_of_order, const exporter::OutputDir& dir,
                   const std::string& name, const std::string* key);
  // BuildPass, again with the unsorted lines found if one was not sorted.
  Status BuildInto(const std::vector<std::string>& files, BuildProgress* progress, const exporter::OutputDir& dir,
                   const std::string& name, const std::string* key);
  // BuildInto a file in $TMPDIR (default /tmp), unlinked once mapped.
  Status BuildTemporary(const std::vector<std::string>& files, BuildProgress* progress);
  // Maps the cached index `name`; false (with why, empty if there is none)
  // if it is not a whole one for `key`.
  bool LoadCached(int dir_fd, const std::string& name, const std::string& key, std::string* why);
  // The least recently used indexes go until all weigh at most `max_bytes`
  // (`keep`, just made, last: alone over the bound, it goes too).
  static void EvictCache(int dir_fd, const std::string& dir_path, const std::string& keep, uint64_t max_bytes,
                         const std::function<void(const std::string&)>& say);
  void IndexCounterLevel(const report::TimelineLevel& level, int64_t at_ns);
  struct Touched {
    uint64_t from, to;  // bytes of the index file read
  };
  report::TimelineLevel CutLane(const report::TimelineLevel& l, int64_t at_ns, int64_t t0, int64_t t1,
                                std::string* out, Touched* touched) const;
  report::TimelineLevel CutCounter(const report::TimelineLevel& l, int64_t at_ns, int64_t t0, int64_t t1,
                                   std::string* out) const;
  const std::vector<Seek>& SeeksOf(const report::TimelineLevel& l) const { return seeks_.at(l.offset); }

  report::Timeline tl_;
  std::unordered_map<uint64_t, std::vector<Seek>> seeks_;  // of counter levels, by offset in the blob
  const uint8_t* map_ = nullptr;  // the index file
  size_t map_bytes_ = 0;
  bool reused_ = false;
  bool write_failed_ = false;  // the last BuildPass could not write its index file
};

}  // namespace spyglass::view
