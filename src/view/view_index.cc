#include "view/view_index.h"

#include <algorithm>
#include <cstring>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "export/output_file.h"
#include "view/http_server.h"

namespace spyglass::view {
namespace {

// The blob's encoding (report/timeline.h): LEB128 varints, zigzag gaps,
// little-endian float64s.
struct Reader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t Varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (p >= end) break;
      uint8_t b = *p++;
      v |= uint64_t{b & 127u} << shift;
      if (!(b & 128)) return v;
    }
    ok = false;
    return 0;
  }
  int64_t Zigzag() {
    uint64_t z = Varint();
    return static_cast<int64_t>(z >> 1) ^ -static_cast<int64_t>(z & 1);
  }
  void Skip(size_t n) {
    if (static_cast<size_t>(end - p) < n) {
      ok = false;
      p = end;
    } else {
      p += n;
    }
  }
};

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 128) {
    out->push_back(static_cast<char>((v & 127) | 128));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}
void PutZigzag(std::string* out, int64_t v) {
  PutVarint(out, (static_cast<uint64_t>(v) << 1) ^ static_cast<uint64_t>(v >> 63));
}

// The coarsest level that merges only what is under a pixel (as the page's levelFor).
size_t LevelFor(const std::vector<report::TimelineLevel>& levels, double ns_per_px) {
  size_t k = 0;
  for (size_t i = 1; i < levels.size(); i++)
    if (static_cast<double>(levels[i].threshold_ns) <= ns_per_px) k = i;
  return k;
}

// The last seek point at or before t0: every span (point) before it ends by then.
size_t SeekBefore(const std::vector<ViewIndex::Seek>& seeks, int64_t t0) {
  auto it = std::upper_bound(seeks.begin(), seeks.end(), t0,
                             [](int64_t t, const ViewIndex::Seek& s) { return t < s.prev_ns; });
  return it == seeks.begin() ? 0 : static_cast<size_t>(it - seeks.begin()) - 1;
}

// Decodes `l` (in `blob`) from `seek` to its end.
Reader ReaderAt(const std::string& blob, const report::TimelineLevel& l, const ViewIndex::Seek& seek) {
  const auto* base = reinterpret_cast<const uint8_t*>(blob.data());
  return Reader{base + seek.offset, base + l.offset + l.bytes};
}

// A cached index: [the levels][the meta: key, then the timeline][trailer].
// A new format (or a change of what the timeline holds) takes a new version.
constexpr char kCacheMagic[8] = {'S', 'P', 'Y', 'V', 'I', 'D', 'X', '\n'};
constexpr uint64_t kIndexFormat = 1;
constexpr size_t kTrailerBytes = 8 * 8;
constexpr uint64_t kMaxMetaBytes = uint64_t{1} << 30;

// A checksum of bytes given in any pieces (not cryptographic: it finds a
// truncated or damaged file; the directory is the user's alone).
class StreamHash {
 public:
  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (; n > 0 && held_ > 0; --n) Byte(*p++);
    for (; n >= 8; n -= 8, p += 8) {
      uint64_t w;
      std::memcpy(&w, p, 8);
      Word(w);
    }
    for (; n > 0; --n) Byte(*p++);
  }
  uint64_t Final() const {
    uint64_t h = h_ ^ ((len_ + static_cast<uint64_t>(held_)) * 0x9e3779b97f4a7c15ull) ^ pending_;
    h = (h ^ (h >> 33)) * 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
  }

 private:
  void Byte(uint8_t b) {
    pending_ |= uint64_t{b} << (8 * held_);
    if (++held_ == 8) Word(pending_);
  }
  void Word(uint64_t w) {
    h_ = (h_ ^ (w * 0x87c37b91114253d5ull)) * 0x4cf5ad432745937full;
    h_ ^= h_ >> 29;
    len_ += 8;
    pending_ = 0;
    held_ = 0;
  }
  uint64_t h_ = 0x243f6a8885a308d3ull, pending_ = 0, len_ = 0;
  int held_ = 0;
};

uint64_t HashOf(std::string_view b) {
  StreamHash h;
  h.Update(b.data(), b.size());
  return h.Final();
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; i++) out->push_back(static_cast<char>((v >> (8 * i)) & 255));
}
void PutStr(std::string* out, std::string_view s) {
  PutU64(out, s.size());
  out->append(s);
}
void PutF64(std::string* out, double d) {
  uint64_t v;
  std::memcpy(&v, &d, 8);
  PutU64(out, v);
}

// Reads the meta back: every count is checked against the bytes left
// before anything is allocated for it.
struct MetaReader {
  const uint8_t* p;
  const uint8_t* end;
  bool ok = true;
  uint64_t U64() {
    if (end - p < 8) {
      ok = false;
      p = end;
      return 0;
    }
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= uint64_t{p[i]} << (8 * i);
    p += 8;
    return v;
  }
  int64_t I64() { return static_cast<int64_t>(U64()); }
  double F64() {
    uint64_t v = U64();
    double d;
    std::memcpy(&d, &v, 8);
    return d;
  }
  // A count of items of at least `min_bytes` each.
  size_t Count(size_t min_bytes) {
    uint64_t n = U64();
    if (n > static_cast<uint64_t>(end - p) / min_bytes) {
      ok = false;
      p = end;
      return 0;
    }
    return static_cast<size_t>(n);
  }
  std::string Str() {
    size_t n = Count(1);
    std::string s(reinterpret_cast<const char*>(p), n);
    p += n;
    return s;
  }
};

void PutLevel(std::string* out, const report::TimelineLevel& l) {
  PutU64(out, static_cast<uint64_t>(l.threshold_ns));
  PutU64(out, l.spans);
  PutU64(out, l.offset);
  PutU64(out, l.bytes);
  PutU64(out, l.marks.size());
  for (int64_t m : l.marks) PutU64(out, static_cast<uint64_t>(m));
  PutU64(out, l.chunks.size());
  for (const report::TimelineChunk& c : l.chunks) {
    PutU64(out, c.offset);
    PutU64(out, c.bytes);
    PutU64(out, c.first_span);
    PutU64(out, static_cast<uint64_t>(c.prev_ns));
  }
}
report::TimelineLevel ReadLevel(MetaReader& r) {
  report::TimelineLevel l;
  l.threshold_ns = r.I64();
  l.spans = r.U64();
  l.offset = r.U64();
  l.bytes = r.U64();
  l.marks.resize(r.Count(8));
  for (int64_t& m : l.marks) m = r.I64();
  l.chunks.resize(r.Count(32));
  for (report::TimelineChunk& c : l.chunks) {
    c.offset = r.U64();
    c.bytes = r.U64();
    c.first_span = r.U64();
    c.prev_ns = r.I64();
  }
  return l;
}
void PutStrings(std::string* out, const std::vector<std::string>& v) {
  PutU64(out, v.size());
  for (const std::string& s : v) PutStr(out, s);
}
std::vector<std::string> ReadStrings(MetaReader& r) {
  std::vector<std::string> v(r.Count(8));
  for (std::string& s : v) s = r.Str();
  return v;
}

// The timeline as Build leaves it (its lanes' levels in the index file,
// the counters' in its blob).
std::string MetaOf(const report::Timeline& tl) {
  std::string out;
  PutU64(&out, static_cast<uint64_t>(tl.start_ns));
  PutU64(&out, static_cast<uint64_t>(tl.duration_ns));
  PutU64(&out, tl.events);
  PutStrings(&out, tl.names);
  PutU64(&out, tl.name_events.size());
  for (uint64_t n : tl.name_events) PutU64(&out, n);
  PutU64(&out, tl.hidden_names);
  PutStrings(&out, tl.details);
  PutU64(&out, tl.hidden_details);
  PutU64(&out, tl.tracks.size());
  for (const report::TimelineTrack& t : tl.tracks) {
    PutStr(&out, t.plane);
    PutStr(&out, t.name);
    PutU64(&out, static_cast<uint64_t>(t.id));
    PutU64(&out, static_cast<uint64_t>(t.at_ns));
    PutU64(&out, t.events);
    PutU64(&out, t.hidden);
    PutU64(&out, t.lanes.size());
    for (const auto& levels : t.lanes) {
      PutU64(&out, levels.size());
      for (const report::TimelineLevel& l : levels) PutLevel(&out, l);
    }
  }
  PutU64(&out, tl.hidden_tracks);
  PutU64(&out, tl.hidden_track_events);
  PutU64(&out, tl.counters.size());
  for (const report::TimelineCounter& c : tl.counters) {
    PutStr(&out, c.plane);
    PutStr(&out, c.name);
    PutU64(&out, c.bytes ? 1 : 0);
    PutU64(&out, static_cast<uint64_t>(c.at_ns));
    PutU64(&out, c.samples);
    PutF64(&out, c.min);
    PutF64(&out, c.max);
    PutU64(&out, c.levels.size());
    for (const report::TimelineLevel& l : c.levels) PutLevel(&out, l);
  }
  PutU64(&out, tl.flows.size());
  for (const report::TimelineFlow& f : tl.flows) {
    PutU64(&out, f.from_track);
    PutU64(&out, f.from_lane);
    PutU64(&out, static_cast<uint64_t>(f.from_ns));
    PutU64(&out, f.to_track);
    PutU64(&out, f.to_lane);
    PutU64(&out, static_cast<uint64_t>(f.to_ns));
  }
  PutU64(&out, tl.hidden_flows);
  PutU64(&out, tl.coarsened_lanes);
  PutU64(&out, tl.coarsened_events);
  PutU64(&out, tl.coarsened_counters);
  PutU64(&out, static_cast<uint64_t>(tl.coarsened_ns));
  PutU64(&out, tl.hidden_counters);
  PutU64(&out, tl.hidden_counter_samples);
  PutStr(&out, tl.blob);
  return out;
}

// False if the meta does not read whole, or a level reaches past the
// levels' bytes (lanes) or the blob (counters), or a flow names no lane.
bool ReadMeta(MetaReader& r, uint64_t levels_bytes, report::Timeline* tl) {
  tl->start_ns = r.I64();
  tl->duration_ns = r.I64();
  tl->events = r.U64();
  tl->names = ReadStrings(r);
  tl->name_events.resize(r.Count(8));
  for (uint64_t& n : tl->name_events) n = r.U64();
  tl->hidden_names = r.U64();
  tl->details = ReadStrings(r);
  tl->hidden_details = r.U64();
  tl->tracks.resize(r.Count(7 * 8));
  for (report::TimelineTrack& t : tl->tracks) {
    t.plane = r.Str();
    t.name = r.Str();
    t.id = r.I64();
    t.at_ns = r.I64();
    t.events = r.U64();
    t.hidden = r.U64();
    t.lanes.resize(r.Count(8));
    for (auto& levels : t.lanes) {
      levels.resize(r.Count(6 * 8));
      for (report::TimelineLevel& l : levels) {
        l = ReadLevel(r);
        for (const report::TimelineChunk& c : l.chunks)
          if (c.offset > levels_bytes || c.bytes > levels_bytes - c.offset) return false;
      }
    }
  }
  tl->hidden_tracks = r.U64();
  tl->hidden_track_events = r.U64();
  tl->counters.resize(r.Count(8 * 8));
  for (report::TimelineCounter& c : tl->counters) {
    c.plane = r.Str();
    c.name = r.Str();
    c.bytes = r.U64() != 0;
    c.at_ns = r.I64();
    c.samples = r.U64();
    c.min = r.F64();
    c.max = r.F64();
    c.levels.resize(r.Count(6 * 8));
    for (report::TimelineLevel& l : c.levels) l = ReadLevel(r);
  }
  tl->flows.resize(r.Count(6 * 8));
  for (report::TimelineFlow& f : tl->flows) {
    f.from_track = static_cast<uint32_t>(r.U64());
    f.from_lane = static_cast<uint32_t>(r.U64());
    f.from_ns = r.I64();
    f.to_track = static_cast<uint32_t>(r.U64());
    f.to_lane = static_cast<uint32_t>(r.U64());
    f.to_ns = r.I64();
    if (f.from_track >= tl->tracks.size() || f.to_track >= tl->tracks.size()) return false;
  }
  tl->hidden_flows = r.U64();
  tl->coarsened_lanes = r.U64();
  tl->coarsened_events = r.U64();
  tl->coarsened_counters = r.U64();
  tl->coarsened_ns = r.I64();
  tl->hidden_counters = r.U64();
  tl->hidden_counter_samples = r.U64();
  tl->blob = r.Str();
  if (!r.ok || r.p != r.end || tl->name_events.size() != tl->names.size()) return false;
  // Counter levels are decoded from the blob (CutCounter, IndexCounterLevel).
  for (const report::TimelineCounter& c : tl->counters)
    for (const report::TimelineLevel& l : c.levels)
      if (l.offset > tl->blob.size() || l.bytes > tl->blob.size() - l.offset) return false;
  return true;
}

bool ReadAllAt(int fd, uint64_t offset, uint64_t bytes, char* out) {
  for (uint64_t done = 0; done < bytes;) {
    ssize_t r = pread(fd, out + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    done += static_cast<uint64_t>(r);
  }
  return true;
}

// Opens (making it 0700 if missing) the directory `name` in `parent`,
// refused if it is a link, not a directory, another user's, or writable by
// group or others.
Status OpenPrivateDir(const exporter::OutputDir& parent, const std::string& name, exporter::OutputDir* out) {
  if (mkdirat(parent.fd(), name.c_str(), 0700) != 0 && errno != EEXIST)
    return InternalError("cannot make " + parent.PathOf(name) + ": " + std::strerror(errno));
  if (Status s = parent.OpenSubdir(name, out); !s.ok()) return s;
  struct stat st {};
  if (fstat(out->fd(), &st) != 0) return InternalError("cannot look at " + out->path());
  if (st.st_uid != geteuid()) return InvalidArgumentError(out->path() + " is another user's");
  if ((st.st_mode & 022) != 0) return InvalidArgumentError(out->path() + " is writable by group or others");
  return Status::Ok();
}

}  // namespace

// Writes what the builder streams to the index file, in large writes.
class FileSink : public report::TimelineSink {
 public:
  // The file is written through a write-only descriptor: read back (a level
  // made from the one below) through one of its own, opened from that one.
  explicit FileSink(int fd)
      : fd_(fd), read_fd_(open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_CLOEXEC)) {}
  ~FileSink() override {
    if (read_fd_ >= 0) close(read_fd_);
  }
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;
  bool Readable() const override { return read_fd_ >= 0; }
  // One Append's bytes: all in the buffer, or all written.
  bool Read(uint64_t offset, uint64_t bytes, std::string* out) override {
    out->resize(bytes);
    if (offset >= written_) {
      if (offset - written_ + bytes > buf_.size()) return Fail(EINVAL);
      std::memcpy(out->data(), buf_.data() + (offset - written_), bytes);
      return true;
    }
    for (uint64_t done = 0; done < bytes;) {
      ssize_t r = pread(read_fd_, out->data() + done, bytes - done, static_cast<off_t>(offset + done));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return Fail(r < 0 ? errno : EIO);
      done += static_cast<uint64_t>(r);
    }
    return true;
  }
  uint64_t Append(std::string_view bytes) override {
    uint64_t at = written_ + buf_.size();
    hash_.Update(bytes.data(), bytes.size());
    buf_.append(bytes);
    if (buf_.size() >= (1u << 20)) Flush();
    return at;
  }
  int Flush() {
    if (error_ == 0 && !buf_.empty()) error_ = exporter::WriteAll(fd_, buf_);
    written_ += buf_.size();
    buf_.clear();
    return error_;
  }
  uint64_t size() const { return written_ + buf_.size(); }
  uint64_t hash() const { return hash_.Final(); }  // of all the bytes appended

 private:
  bool Fail(int error) {
    if (error_ == 0) error_ = error;
    return false;
  }
  int fd_;
  int read_fd_;
  std::string buf_;
  uint64_t written_ = 0;
  int error_ = 0;
  StreamHash hash_;
};

ViewIndex::~ViewIndex() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

// What identifies the files indexed: their device, inode, size and mtime
// (ns), and the names their planes are prefixed with; empty if one cannot
// be looked at.
std::string CacheKey(const std::vector<std::string>& files) {
  std::string key;
  PutU64(&key, kIndexFormat);
  PutU64(&key, files.size());
  for (const std::string& f : files) {
    struct stat st {};
    if (stat(f.c_str(), &st) != 0) return "";
    PutU64(&key, static_cast<uint64_t>(st.st_dev));
    PutU64(&key, static_cast<uint64_t>(st.st_ino));
    PutU64(&key, static_cast<uint64_t>(st.st_size));
    PutU64(&key, static_cast<uint64_t>(st.st_mtim.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec));
    PutStr(&key, files.size() > 1 ? std::filesystem::path(f).filename().string() : "");
  }
  return key;
}

namespace {
constexpr char kTextMagic[8] = {'S', 'P', 'Y', 'V', 'T', 'X', 'T', '\n'};
constexpr uint64_t kMaxCachedText = uint64_t{256} << 20;

std::string CachedName(const std::string& what, const std::string& key) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(HashOf(key)));
  return what + "-v" + std::to_string(kIndexFormat) + "-" + hex;
}
}  // namespace

bool OpenCacheDir(const CacheOptions& cache, exporter::OutputDir* out) {
  const std::filesystem::path dir(cache.dir);
  const std::filesystem::path parent = dir.parent_path(), top = parent.parent_path();
  exporter::OutputDir top_dir, parent_dir;
  Status s = dir.has_filename() && parent.has_filename() && !top.empty()
                 ? Status::Ok()
                 : InvalidArgumentError(cache.dir + " is not two directories below another");
  // The top one (~/.cache) is made if missing, as the user's alone; links in it are followed.
  if (s.ok() && mkdir(top.c_str(), 0700) != 0 && errno != EEXIST)
    s = InternalError("cannot make " + top.string() + ": " + std::strerror(errno));
  if (s.ok()) s = exporter::OutputDir::Open(top.string(), &top_dir);
  if (s.ok()) s = OpenPrivateDir(top_dir, parent.filename().string(), &parent_dir);
  if (s.ok()) s = OpenPrivateDir(parent_dir, dir.filename().string(), out);
  if (s.ok()) return true;
  if (cache.say) cache.say("not using the index cache: " + s.message() + " (the index is temporary)");
  return false;
}

bool ReadCachedText(const CacheOptions& cache, const std::string& key, const std::string& what, std::string* text) {
  exporter::OutputDir dir;
  if (key.empty() || !OpenCacheDir(cache, &dir)) return false;
  const std::string name = CachedName(what, key);
  int fd = openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  std::string all;
  bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() && st.st_size >= 32 &&
            static_cast<uint64_t>(st.st_size) <= kMaxCachedText + key.size() + 32;
  if (ok) {
    all.resize(static_cast<size_t>(st.st_size));
    ok = ReadAllAt(fd, 0, all.size(), all.data());
  }
  close(fd);
  // [magic][key bytes][key][text bytes][text][checksum of all before]
  if (ok) {
    MetaReader r{reinterpret_cast<const uint8_t*>(all.data()) + 8,
                 reinterpret_cast<const uint8_t*>(all.data()) + all.size() - 8};
    MetaReader sum{reinterpret_cast<const uint8_t*>(all.data()) + all.size() - 8,
                   reinterpret_cast<const uint8_t*>(all.data()) + all.size()};
    ok = std::memcmp(all.data(), kTextMagic, 8) == 0 && HashOf(std::string_view(all).substr(0, all.size() - 8)) == sum.U64() &&
         r.Str() == key;
    if (ok) *text = r.Str();
    ok = ok && r.ok && r.p == r.end;
  }
  if (!ok) {
    unlinkat(dir.fd(), name.c_str(), 0);
    text->clear();
    if (cache.say) cache.say("the cached " + what + " " + dir.PathOf(name) + " is damaged: made again");
    return false;
  }
  utimensat(dir.fd(), name.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  return true;
}

void WriteCachedText(const CacheOptions& cache, const std::string& key, const std::string& what, const std::string& text) {
  exporter::OutputDir dir;
  if (key.empty() || text.size() > kMaxCachedText || !OpenCacheDir(cache, &dir)) return;
  std::string all(kTextMagic, 8);
  PutStr(&all, key);
  PutStr(&all, text);
  PutU64(&all, HashOf(all));
  if (Status s = dir.WriteBytes(CachedName(what, key), all); !s.ok() && cache.say)
    cache.say("the " + what + " is not cached: " + s.message());
}

Status ViewIndex::Build(const std::vector<std::string>& files, BuildProgress* progress, const CacheOptions* cache) {
  BuildProgress unused;
  if (progress == nullptr) progress = &unused;
  uint64_t total = 0;
  for (const std::string& f : files) {
    struct stat st {};
    if (stat(f.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  progress->size = total;
  auto say = [cache](const std::string& what) {
    if (cache != nullptr && cache->say) cache->say(what);
  };
  // The cache: its directory (and the one above it) the user's alone.
  exporter::OutputDir cache_dir;
  const std::string key = cache != nullptr && !cache->dir.empty() ? CacheKey(files) : "";
  if (!key.empty() && !OpenCacheDir(*cache, &cache_dir)) cache_dir = exporter::OutputDir();
  if (cache_dir.is_open()) {
    const std::string name = CachedName("index", key);
    std::string why;
    if (LoadCached(cache_dir.fd(), name, key, &why)) {
      reused_ = true;
      progress->read = total;
      progress->events = tl_.events;
      say("reusing the index cached in " + cache_dir.PathOf(name));
      return Status::Ok();
    }
    if (!why.empty()) {
      say("the cached index " + cache_dir.PathOf(name) + " " + why + ": rebuilding it");
      unlinkat(cache_dir.fd(), name.c_str(), 0);  // (a link planted there goes, never its target)
    }
    write_failed_ = false;
    Status s = BuildInto(files, progress, cache_dir, name, &key);
    if (!s.ok() && !write_failed_) return s;
    if (!s.ok()) {  // (a full disk under the cache, say): the temporary index instead
      say("the index could not be cached (" + s.message() + "): indexing into a temporary file");
      progress->read = 0;
      return BuildTemporary(files, progress);
    }
    // A file that changed while it was read is not kept under its old key.
    if (CacheKey(files) != key) {
      unlinkat(cache_dir.fd(), name.c_str(), 0);
      say("the run changed while it was indexed: its index is not cached");
      return s;
    }
    say("index cached in " + cache_dir.PathOf(name));
    EvictCache(cache_dir.fd(), cache_dir.path(), name, cache->max_bytes, say);
    return s;
  }
  return BuildTemporary(files, progress);
}

Status ViewIndex::BuildTemporary(const std::vector<std::string>& files, BuildProgress* progress) {
  const char* tmp = std::getenv("TMPDIR");
  exporter::OutputDir dir;
  if (Status s = exporter::OutputDir::Open(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", &dir); !s.ok()) return s;
  const std::string name = "spyglass-view-" + std::to_string(getpid()) + "-" + RandomToken().substr(0, 16) + ".index";
  return BuildInto(files, progress, dir, name, nullptr);
}

Status ViewIndex::BuildInto(const std::vector<std::string>& files, BuildProgress* progress,
                            const exporter::OutputDir& dir, const std::string& name, const std::string* key) {
  // Writers sort their lines (ours do): each is taken as sorted, which saves
  // a pass over the files that would find the few that are not.
  std::vector<std::set<std::pair<size_t, size_t>>> unsorted(files.size());
  uint64_t out_of_order = 0;
  if (Status s = BuildPass(files, unsorted, progress, &out_of_order, dir, name, key);
      !s.ok() || out_of_order == 0)
    return s;
  progress->pass = 2;
  progress->read = 0;
  for (size_t i = 0; i < files.size(); i++)
    if (Status s = report::FindUnsortedLines(files[i], &unsorted[i]); !s.ok()) return s;
  return BuildPass(files, unsorted, progress, &out_of_order, dir, name, key);
}

bool ViewIndex::LoadCached(int dir_fd, const std::string& name, const std::string& key, std::string* why) {
  why->clear();
  int fd = openat(dir_fd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno != ENOENT) *why = std::string("cannot be opened (") + std::strerror(errno) + ")";
    return false;
  }
  auto fail = [&](const std::string& what) {
    *why = what;
    close(fd);
    tl_ = report::Timeline();
    return false;
  };
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid()) return fail("is not a file of this user");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  uint8_t trailer[kTrailerBytes];
  if (size < kTrailerBytes || !ReadAllAt(fd, size - kTrailerBytes, kTrailerBytes, reinterpret_cast<char*>(trailer)))
    return fail("is truncated");
  MetaReader t{trailer, trailer + kTrailerBytes};
  uint64_t magic = t.U64(), format = t.U64(), levels_bytes = t.U64(), meta_bytes = t.U64(), levels_hash = t.U64(),
           meta_hash = t.U64(), key_bytes = t.U64(), trailer_hash = t.U64();
  if (std::memcmp(&magic, kCacheMagic, 8) != 0 || HashOf({reinterpret_cast<const char*>(trailer), kTrailerBytes - 8}) != trailer_hash)
    return fail("is truncated or damaged (no trailer)");
  if (format != kIndexFormat) return fail("is of another format");
  if (meta_bytes > kMaxMetaBytes || key_bytes > meta_bytes || levels_bytes > size ||
      size - levels_bytes < meta_bytes + kTrailerBytes || levels_bytes + meta_bytes + kTrailerBytes != size)
    return fail("is truncated or damaged (sizes)");
  std::string meta(meta_bytes, '\0');
  if (!ReadAllAt(fd, levels_bytes, meta_bytes, meta.data()) || HashOf(meta) != meta_hash)
    return fail("is damaged (its timeline's checksum)");
  if (std::string_view(meta).substr(0, key_bytes) != key) {
    close(fd);
    *why = "is of other files";  // the key's hash collided: rebuilt
    return false;
  }
  // The levels, read once through a small buffer: none is trusted unread.
  StreamHash h;
  std::string buf(1 << 20, '\0');
  for (uint64_t at = 0; at < levels_bytes; at += buf.size()) {
    uint64_t n = std::min<uint64_t>(buf.size(), levels_bytes - at);
    if (!ReadAllAt(fd, at, n, buf.data())) return fail("cannot be read");
    h.Update(buf.data(), n);
  }
  if (h.Final() != levels_hash) return fail("is damaged (its levels' checksum)");
  MetaReader r{reinterpret_cast<const uint8_t*>(meta.data()) + key_bytes,
               reinterpret_cast<const uint8_t*>(meta.data()) + meta.size()};
  if (!ReadMeta(r, levels_bytes, &tl_)) return fail("is damaged (its timeline does not read)");
  if (levels_bytes > 0) {
    void* m = mmap(nullptr, levels_bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) return fail(std::string("cannot be mapped (") + std::strerror(errno) + ")");
    map_ = static_cast<const uint8_t*>(m);
    map_bytes_ = levels_bytes;
  }
  close(fd);
  // Used now: the last to be evicted.
  utimensat(dir_fd, name.c_str(), nullptr, AT_SYMLINK_NOFOLLOW);
  for (const report::TimelineCounter& c : tl_.counters)
    for (const report::TimelineLevel& l : c.levels) IndexCounterLevel(l, c.at_ns);
  return true;
}

void ViewIndex::EvictCache(int dir_fd, const std::string& dir_path, const std::string& keep, uint64_t max_bytes,
                           const std::function<void(const std::string&)>& say) {
  struct Entry {
    int64_t mtime_ns;
    uint64_t bytes;
    std::string name;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  int fd = dup(dir_fd);
  DIR* d = fd >= 0 ? fdopendir(fd) : nullptr;
  if (d == nullptr) {
    if (fd >= 0) close(fd);
    return;
  }
  rewinddir(d);
  while (dirent* e = readdir(d)) {
    std::string_view n = e->d_name;
    // A temporary file of a writer that is gone (killed while it wrote) goes;
    // another's, still writing, stays.
    if (n.starts_with(".spyglass-") && n.ends_with(".tmp")) {
      const long writer = std::atol(std::string(n.substr(10)).c_str());
      if (writer > 0 && kill(static_cast<pid_t>(writer), 0) != 0 && errno == ESRCH) unlinkat(dir_fd, e->d_name, 0);
      continue;
    }
    if (!n.starts_with("index-v") && !n.starts_with("summary-v")) continue;
    struct stat st {};
    if (fstatat(dir_fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) continue;
    const uint64_t bytes = static_cast<uint64_t>(st.st_blocks) * 512;
    total += bytes;
    entries.push_back({st.st_mtim.tv_sec * 1'000'000'000ll + st.st_mtim.tv_nsec, bytes, e->d_name});
    if (entries.size() > 100000) break;  // bounded, whatever the directory holds
  }
  closedir(d);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.mtime_ns < b.mtime_ns; });
  for (const Entry& e : entries) {
    if (total <= max_bytes) break;
    if (e.name == keep) continue;
    if (unlinkat(dir_fd, e.name.c_str(), 0) == 0) {
      total -= e.bytes;
      say("evicted " + dir_path + "/" + e.name + " from the index cache (over " + std::to_string(max_bytes >> 20) +
          " MiB)");
    }
  }
  // Alone over the bound: not kept either.
  if (total > max_bytes && unlinkat(dir_fd, keep.c_str(), 0) == 0)
    say("the index is larger than the cache's bound (" + std::to_string(max_bytes >> 20) + " MiB): not kept");
}

Status ViewIndex::BuildPass(const std::vector<std::string>& files,
                            const std::vector<std::set<std::pair<size_t, size_t>>>& unsorted, BuildProgress* progress,
                            uint64_t* out_of_order, const exporter::OutputDir& dir, const std::string& name,
                            const std::string* key) {
  Status built = Status::Ok();
  uint64_t bytes = 0;
  *out_of_order = 0;
  Status written = dir.Write(name, [&](int fd) {
    FileSink sink(fd);
    report::TimelineBuilder builder;
    builder.StreamTo(&sink);
    uint64_t before = 0;  // bytes of the files read before this one
    for (size_t i = 0; i < files.size() && built.ok(); i++) {
      std::string host;
      if (files.size() > 1) {
        host = std::filesystem::path(files[i]).filename().string();
        host = host.substr(0, host.rfind(".xplane.pb"));
      }
      uint64_t file_bytes = 0;
      built = report::AddProfileFile(files[i], host, &builder, nullptr, &unsorted[i],
                                     [&](uint64_t done, uint64_t size) {
                                       progress->read = before + done;
                                       progress->events = builder.events_added();
                                       file_bytes = size;
                                     });
      before += file_bytes;
    }
    if (!built.ok()) return EINVAL;
    *out_of_order = builder.out_of_order();
    if (*out_of_order > 0) return 0;
    tl_ = builder.Finish();
    progress->events = tl_.events;
    bytes = sink.size();
    if (int e = sink.Flush(); e != 0 || key == nullptr) return e;
    // Cached: the key and the timeline, then the trailer.
    std::string meta = *key + MetaOf(tl_);
    std::string trailer(kCacheMagic, 8);
    PutU64(&trailer, kIndexFormat);
    PutU64(&trailer, bytes);
    PutU64(&trailer, meta.size());
    PutU64(&trailer, sink.hash());
    PutU64(&trailer, HashOf(meta));
    PutU64(&trailer, key->size());
    PutU64(&trailer, HashOf(trailer));
    if (int e = exporter::WriteAll(fd, meta); e != 0) return e;
    return exporter::WriteAll(fd, trailer);
  });
  if (*out_of_order > 0 && written.ok()) {
    unlinkat(dir.fd(), name.c_str(), 0);
    return Status::Ok();
  }
  if (!built.ok()) {
    unlinkat(dir.fd(), name.c_str(), 0);
    return built;
  }
  if (!written.ok()) {
    write_failed_ = true;
    return written;
  }
  // Mapped, then (a temporary index) unlinked: the file goes when the server
  // ends, however it ends.
  int fd = openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) < bytes) {
    if (fd >= 0) close(fd);
    unlinkat(dir.fd(), name.c_str(), 0);
    return InternalError("cannot read back the index " + dir.PathOf(name));
  }
  if (key == nullptr) unlinkat(dir.fd(), name.c_str(), 0);
  if (bytes > 0) {
    void* m = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
      if (key != nullptr) unlinkat(dir.fd(), name.c_str(), 0);
      return InternalError("cannot map the index " + dir.PathOf(name) + ": " + std::strerror(errno));
    }
    map_ = static_cast<const uint8_t*>(m);
    map_bytes_ = bytes;
  }
  close(fd);
  for (const report::TimelineTrack& t : tl_.tracks)
    for (const auto& levels : t.lanes)
      for (const report::TimelineLevel& l : levels)
        for (const report::TimelineChunk& c : l.chunks)
          if (c.offset > map_bytes_ || c.bytes > map_bytes_ - c.offset)
            return InternalError("the index " + dir.PathOf(name) + " is shorter than written");
  tl_.blob.shrink_to_fit();
  for (const report::TimelineCounter& c : tl_.counters)
    for (const report::TimelineLevel& l : c.levels) IndexCounterLevel(l, c.at_ns);
  return Status::Ok();
}

void ViewIndex::IndexCounterLevel(const report::TimelineLevel& l, int64_t at_ns) {
  if (l.spans == 0) return;
  std::vector<Seek>& seeks = seeks_[l.offset];
  const auto* base = reinterpret_cast<const uint8_t*>(tl_.blob.data());
  Reader r{base + l.offset, base + l.offset + l.bytes};
  int64_t prev = at_ns;
  for (uint64_t i = 0; i < l.spans && r.ok; i++) {
    if (i % kSeekStride == 0) seeks.push_back({static_cast<uint64_t>(r.p - base), prev});
    prev += r.Zigzag();
    r.Skip(l.threshold_ns > 0 ? 24 : 8);
  }
  seeks.shrink_to_fit();
}

report::TimelineLevel ViewIndex::CutLane(const report::TimelineLevel& l, int64_t at_ns, int64_t t0, int64_t t1,
                                         std::string* out, Touched* touched) const {
  report::TimelineLevel cut{l.threshold_ns, 0, out->size(), 0, {}, {}};
  const std::vector<report::TimelineChunk>& chunks = l.chunks;
  if (l.spans == 0 || chunks.empty()) return cut;
  // The last chunk that starts at or before t0: every span before it ends by then.
  auto it = std::upper_bound(chunks.begin(), chunks.end(), t0,
                             [at_ns](int64_t t, const report::TimelineChunk& c) { return t < at_ns + c.prev_ns; });
  size_t ci = it == chunks.begin() ? 0 : static_cast<size_t>(it - chunks.begin()) - 1;
  int64_t prev = at_ns + chunks[ci].prev_ns, last_end = at_ns;
  for (bool past = false; ci < chunks.size() && !past; ci++) {
    const report::TimelineChunk& c = chunks[ci];
    touched->from = std::min<uint64_t>(touched->from, c.offset);
    touched->to = std::max<uint64_t>(touched->to, c.offset + c.bytes);
    Reader r{map_ + c.offset, map_ + c.offset + c.bytes};
    while (r.p < r.end) {
      int64_t start = prev + r.Zigzag();
      int64_t end = start + static_cast<int64_t>(r.Varint());
      uint64_t name = r.Varint(), detail = r.Varint(), count = l.threshold_ns > 0 ? r.Varint() : 1;
      if (!r.ok || start > t1) {
        past = true;
        break;
      }
      prev = end;
      if (end < t0) continue;
      PutZigzag(out, start - last_end);
      PutVarint(out, static_cast<uint64_t>(end - start));
      PutVarint(out, name);
      PutVarint(out, detail);
      if (l.threshold_ns > 0) PutVarint(out, count);
      last_end = end;
      cut.spans++;
    }
  }
  cut.bytes = out->size() - cut.offset;
  return cut;
}

report::TimelineLevel ViewIndex::CutCounter(const report::TimelineLevel& l, int64_t at_ns, int64_t t0, int64_t t1,
                                            std::string* out) const {
  report::TimelineLevel cut{l.threshold_ns, 0, out->size(), 0, {}, {}};
  if (l.spans == 0) return cut;
  const std::vector<Seek>& seeks = SeeksOf(l);
  const size_t si = SeekBefore(seeks, t0);
  const size_t value_bytes = l.threshold_ns > 0 ? 24 : 8;
  Reader r = ReaderAt(tl_.blob, l, seeks[si]);
  int64_t prev = seeks[si].prev_ns, last = at_ns;
  // The point before t0 is held until the first one in the window.
  int64_t held_t = 0;
  const uint8_t* held = nullptr;
  auto emit = [&](int64_t t, const uint8_t* values) {
    PutZigzag(out, t - last);
    out->append(reinterpret_cast<const char*>(values), value_bytes);
    last = t;
    cut.spans++;
  };
  for (uint64_t i = uint64_t{si} * kSeekStride; i < l.spans; i++) {
    int64_t t = prev + r.Zigzag();
    const uint8_t* values = r.p;
    r.Skip(value_bytes);
    if (!r.ok) break;
    prev = t;
    if (t < t0) {
      held_t = t;
      held = values;
      continue;
    }
    if (held) emit(held_t, held), held = nullptr;
    emit(t, values);
    if (t > t1) break;  // the one after the window: where the last value ends
  }
  if (held) emit(held_t, held);
  cut.bytes = out->size() - cut.offset;
  return cut;
}

report::Timeline ViewIndex::Window(int64_t t0, int64_t t1, int pixels) const {
  pixels = std::clamp(pixels, 1, kMaxWindowPixels);
  if (t1 < t0) std::swap(t0, t1);
  double ns_per_px = static_cast<double>(t1 - t0) / pixels;
  report::Timeline w;
  w.start_ns = tl_.start_ns;
  w.duration_ns = tl_.duration_ns;
  w.events = tl_.events;
  w.hidden_details = tl_.hidden_details;
  w.hidden_tracks = tl_.hidden_tracks;
  w.hidden_track_events = tl_.hidden_track_events;
  w.hidden_counters = tl_.hidden_counters;
  w.hidden_counter_samples = tl_.hidden_counter_samples;
  Touched touched{UINT64_MAX, 0};
  for (const report::TimelineTrack& t : tl_.tracks) {
    report::TimelineTrack c;
    c.plane = t.plane, c.name = t.name, c.id = t.id, c.at_ns = t.at_ns, c.events = t.events, c.hidden = t.hidden;
    for (const auto& levels : t.lanes)
      c.lanes.push_back(levels.empty() ? std::vector<report::TimelineLevel>{}
                                       : std::vector<report::TimelineLevel>{CutLane(
                                             levels[LevelFor(levels, ns_per_px)], t.at_ns, t0, t1, &w.blob, &touched)});
    w.tracks.push_back(std::move(c));
  }
  // The pages read go back (they stay in the page cache): memory does not
  // grow with what has been looked at.
  if (touched.from < touched.to) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const uint64_t from = touched.from / page * page;
    madvise(const_cast<uint8_t*>(map_) + from, touched.to - from, MADV_DONTNEED);
  }
  for (const report::TimelineCounter& k : tl_.counters) {
    report::TimelineCounter c = k;
    if (!c.levels.empty()) c.levels = {CutCounter(c.levels[LevelFor(c.levels, ns_per_px)], k.at_ns, t0, t1, &w.blob)};
    w.counters.push_back(std::move(c));
  }
  return w;
}

}  // namespace spyglass::view
