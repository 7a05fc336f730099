#include "view/view_index.h"

#include <algorithm>
#include <cstring>
#include <fcntl.h>
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
};

ViewIndex::~ViewIndex() {
  if (map_ != nullptr) munmap(const_cast<uint8_t*>(map_), map_bytes_);
}

Status ViewIndex::Build(const std::vector<std::string>& files, BuildProgress* progress) {
  BuildProgress unused;
  if (progress == nullptr) progress = &unused;
  uint64_t total = 0;
  for (const std::string& f : files) {
    struct stat st {};
    if (stat(f.c_str(), &st) == 0) total += static_cast<uint64_t>(st.st_size);
  }
  progress->size = total;
  // Writers sort their lines (ours do): each is taken as sorted, which saves
  // a pass over the files that would find the few that are not.
  std::vector<std::set<std::pair<size_t, size_t>>> unsorted(files.size());
  uint64_t out_of_order = 0;
  if (Status s = BuildPass(files, unsorted, progress, &out_of_order); !s.ok() || out_of_order == 0) return s;
  progress->pass = 2;
  progress->read = 0;
  for (size_t i = 0; i < files.size(); i++)
    if (Status s = report::FindUnsortedLines(files[i], &unsorted[i]); !s.ok()) return s;
  return BuildPass(files, unsorted, progress, &out_of_order);
}

Status ViewIndex::BuildPass(const std::vector<std::string>& files,
                            const std::vector<std::set<std::pair<size_t, size_t>>>& unsorted, BuildProgress* progress,
                            uint64_t* out_of_order) {
  const char* tmp = std::getenv("TMPDIR");
  exporter::OutputDir dir;
  if (Status s = exporter::OutputDir::Open(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", &dir); !s.ok()) return s;
  const std::string name = "spyglass-view-" + std::to_string(getpid()) + "-" + RandomToken().substr(0, 16) + ".index";
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
                                       file_bytes = size;
                                     });
      before += file_bytes;
    }
    if (!built.ok()) return EINVAL;
    *out_of_order = builder.out_of_order();
    if (*out_of_order > 0) return 0;
    tl_ = builder.Finish();
    bytes = sink.size();
    return sink.Flush();
  });
  if (*out_of_order > 0 && written.ok()) {
    unlinkat(dir.fd(), name.c_str(), 0);
    return Status::Ok();
  }
  if (!built.ok()) {
    unlinkat(dir.fd(), name.c_str(), 0);
    return built;
  }
  if (!written.ok()) return written;
  // Mapped, then unlinked: the file goes when the server ends, however it ends.
  int fd = openat(dir.fd(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st {};
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
      static_cast<uint64_t>(st.st_size) != bytes) {
    if (fd >= 0) close(fd);
    unlinkat(dir.fd(), name.c_str(), 0);
    return InternalError("cannot read back the index " + dir.PathOf(name));
  }
  unlinkat(dir.fd(), name.c_str(), 0);
  if (bytes > 0) {
    void* m = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
      close(fd);
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
