// The public read API (spyglass/profile_reader.h): the whole model through
// the chunked importer, or one streaming pass over the mapped file's wire
// bytes that keeps only one plane's metadata at a time.
#include "spyglass/profile_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <unordered_map>

#include "common/quote.h"
#include "common/saturate.h"
#include "model/profile_file.h"
#include "model/schema.h"
#include "model/wire.h"
#include "model/xspace.h"
#include "model/xspace_import_chunked.h"

namespace spyglass::profile {
namespace {

namespace fs = std::filesystem;

using model::wire::kFixed64;
using model::wire::kLengthDelimited;
using model::wire::kVarint;
using model::wire::Next;
using model::wire::NextField;

// Field numbers (proto/xplane.proto).
namespace f {
constexpr uint32_t kSpacePlanes = 1, kSpaceErrors = 2, kSpaceWarnings = 3, kSpaceHostnames = 4;
constexpr uint32_t kPlaneId = 1, kPlaneName = 2, kPlaneLines = 3, kPlaneEventMd = 4, kPlaneStatMd = 5,
                   kPlaneStats = 6;
constexpr uint32_t kLineId = 1, kLineName = 2, kLineTimestamp = 3, kLineEvents = 4, kLineDisplayId = 10,
                   kLineDisplayName = 11;
constexpr uint32_t kEventMd = 1, kEventOffset = 2, kEventDuration = 3, kEventStats = 4;
constexpr uint32_t kStatMd = 1, kStatDouble = 2, kStatUint = 3, kStatInt = 4, kStatStr = 5, kStatBytes = 6,
                   kStatRef = 7;
constexpr uint32_t kMdId = 1, kMdName = 2, kMdDisplayName = 4;
}  // namespace f

bool IsXPlaneFile(const fs::path& p) {
  std::string n = p.filename().string();
  return n.size() >= 9 && n.compare(n.size() - 9, 9, "xplane.pb") == 0;
}

std::vector<std::string> XPlaneFilesIn(const fs::path& dir) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file(ec) && IsXPlaneFile(e.path())) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Field errors of a scan, worded for the user.
Status WireError(Next n, const std::string& path, size_t at, uint64_t size) {
  if (n == Next::kTruncated)
    return InvalidArgumentError(QuoteInput(path) + " is truncated: the record at byte " + std::to_string(at) +
                                " runs past the end of the file (" + std::to_string(size) +
                                " bytes); was the writer stopped before it finished?");
  return InvalidArgumentError(QuoteInput(path) + " is not a profile: the bytes near offset " + std::to_string(at) +
                              " are not a serialized XSpace (.xplane.pb)");
}

// Reads a map entry (key 1, value 2) of XPlane's metadata maps: the id and
// name of its value, and its display name where `display` is given.
bool ReadMetadataEntry(std::string_view entry, int64_t* id, std::string_view* name,
                       std::string_view* display = nullptr) {
  size_t pos = 0;
  uint32_t number, type;
  std::string_view payload, value;
  uint64_t v = 0;
  Next n;
  *id = 0;
  bool have_value = false;
  while ((n = NextField(entry, &pos, &number, &type, &payload, &v)) == Next::kField) {
    if (number == 1 && type == kVarint) *id = static_cast<int64_t>(v);
    if (number == 2 && type == kLengthDelimited) value = payload, have_value = true;
  }
  if (n != Next::kEnd) return false;
  *name = {};
  if (display != nullptr) *display = {};
  if (!have_value) return true;
  pos = 0;
  while ((n = NextField(value, &pos, &number, &type, &payload, &v)) == Next::kField) {
    if (number == f::kMdName && type == kLengthDelimited) *name = payload;
    if (display != nullptr && number == f::kMdDisplayName && type == kLengthDelimited) *display = payload;
    if (number == f::kMdId && type == kVarint && *id == 0) *id = static_cast<int64_t>(v);
  }
  return n == Next::kEnd;
}

// Names by metadata id: a vector for the dense ids every writer we know
// assigns, a map otherwise.
class NameTable {
 public:
  void clear() {
    dense_.clear();
    sparse_.clear();
  }
  void add(int64_t id, std::string_view name) {
    if (id >= 0 && id < kDenseLimit) {
      if (static_cast<size_t>(id) >= dense_.size()) dense_.resize(static_cast<size_t>(id) + 1);
      dense_[static_cast<size_t>(id)] = name;
    } else {
      sparse_[id] = name;
    }
  }
  std::string_view find(uint64_t id) const {
    if (id < dense_.size()) return dense_[id];
    auto it = sparse_.find(static_cast<int64_t>(id));
    return it == sparse_.end() ? std::string_view() : it->second;
  }

 private:
  // A hostile id costs no more than this (16 bytes a slot).
  static constexpr int64_t kDenseLimit = 1 << 16;
  std::vector<std::string_view> dense_;
  std::unordered_map<int64_t, std::string_view> sparse_;
};

bool ReadStat(std::string_view msg, const NameTable& stat_names, ProfileStat* out) {
  size_t pos = 0;
  uint32_t number, type;
  std::string_view payload;
  uint64_t v = 0;
  Next n;
  *out = ProfileStat{};
  while ((n = NextField(msg, &pos, &number, &type, &payload, &v)) == Next::kField) {
    switch (number) {
      case f::kStatMd: out->name = stat_names.find(v); break;
      case f::kStatDouble:
        if (type == kFixed64) {
          uint64_t bits = 0;
          std::memcpy(&bits, payload.data(), 8);
          std::memcpy(&out->f64, &bits, 8);
          out->kind = ProfileStat::Kind::kDouble;
        }
        break;
      case f::kStatUint: out->kind = ProfileStat::Kind::kUint64, out->u64 = v; break;
      case f::kStatInt: out->kind = ProfileStat::Kind::kInt64, out->i64 = static_cast<int64_t>(v); break;
      case f::kStatStr: out->kind = ProfileStat::Kind::kString, out->str = payload; break;
      case f::kStatBytes: out->kind = ProfileStat::Kind::kBytes, out->str = payload; break;
      case f::kStatRef: out->kind = ProfileStat::Kind::kString, out->str = stat_names.find(v); break;
      default: break;
    }
  }
  return n == Next::kEnd;
}

ProfileStat ModelStat(const model::Plane& plane, const model::Stat& s) {
  ProfileStat out;
  out.name = plane.stat_name(s);
  switch (s.kind) {
    case model::StatKind::kInt64: out.kind = ProfileStat::Kind::kInt64, out.i64 = s.i64; break;
    case model::StatKind::kUint64: out.kind = ProfileStat::Kind::kUint64, out.u64 = s.u64; break;
    case model::StatKind::kDouble: out.kind = ProfileStat::Kind::kDouble, out.f64 = s.f64; break;
    case model::StatKind::kString: out.kind = ProfileStat::Kind::kString, out.str = plane.stat_str(s); break;
    case model::StatKind::kBytes: out.kind = ProfileStat::Kind::kBytes, out.str = plane.stat_str(s); break;
    case model::StatKind::kRef:
      out.kind = ProfileStat::Kind::kString;
      out.str = s.ref < plane.stat_metadata().size() ? std::string_view(plane.stat_metadata()[s.ref].name) : "";
      break;
  }
  return out;
}

// model::CheckProfileBytes (model/profile_file.h).
Status CheckTopLevel(std::string_view bytes, const std::string& path) {
  if (bytes.size() >= 2 && bytes[0] == '\x1f' && bytes[1] == '\x8b')
    return InvalidArgumentError(QuoteInput(path) +
                                " is gzip-compressed, not an .xplane.pb (a trace JSON? decompress it, or pass the "
                                "run's .xplane.pb)");
  // The top level: planes, errors, warnings, hostnames, nothing else; and the
  // format version in /host:metadata.
  size_t pos = 0;
  uint32_t number, type;
  std::string_view payload;
  Next n;
  while (true) {
    // The tag first: bytes of another format (a JSON file's "{") are not a
    // profile, whatever follows them.
    size_t at = pos;
    uint64_t tag = 0;
    if (model::wire::ReadVarint(bytes, &at, &tag) &&
        (tag >> 3 < f::kSpacePlanes || tag >> 3 > f::kSpaceHostnames || (tag & 7) != kLengthDelimited))
      return WireError(Next::kBad, path, pos, bytes.size());
    if ((n = NextField(bytes, &pos, &number, &type, &payload)) != Next::kField) break;
    if (number != f::kSpacePlanes) continue;
    // The name comes before lines in field order; stats after: read the
    // metadata plane only (it holds no events).
    size_t ppos = 0;
    uint32_t pn, pt;
    std::string_view pp;
    std::string_view name;
    NameTable stat_names;
    std::vector<std::string_view> stats;
    Next r;
    while ((r = NextField(payload, &ppos, &pn, &pt, &pp)) == Next::kField) {
      if (pn == f::kPlaneName) name = pp;
      if (pn == f::kPlaneLines && name != model::kMetadataPlaneName) break;
      if (pn == f::kPlaneStatMd && pt == kLengthDelimited) {
        int64_t id;
        std::string_view md_name;
        if (ReadMetadataEntry(pp, &id, &md_name)) stat_names.add(id, md_name);
      }
      if (pn == f::kPlaneStats && pt == kLengthDelimited) stats.push_back(pp);
    }
    if (name != model::kMetadataPlaneName) continue;
    for (std::string_view s : stats) {
      ProfileStat st;
      double v;
      if (ReadStat(s, stat_names, &st) && st.name == model::kFormatVersionMetadata && st.as_double(&v) &&
          v > static_cast<double>(kProfileFormatVersion))
        return InvalidArgumentError(QuoteInput(path) + " comes from a newer format (version " +
                                    std::to_string(int64_t(v)) + "; this spyglass reads up to version " +
                                    std::to_string(kProfileFormatVersion) + "): upgrade spyglass to read it");
    }
  }
  if (n != Next::kEnd) return WireError(n, path, pos, bytes.size());
  return Status::Ok();
}

}  // namespace

bool ProfileStat::as_double(double* out) const {
  switch (kind) {
    case Kind::kInt64: *out = static_cast<double>(i64); return true;
    case Kind::kUint64: *out = static_cast<double>(u64); return true;
    case Kind::kDouble: *out = f64; return true;
    case Kind::kString: {
      int64_t v = 0;
      auto [end, ec] = std::from_chars(str.data(), str.data() + str.size(), v);
      if (ec != std::errc() || end != str.data() + str.size() || str.empty()) return false;
      *out = static_cast<double>(v);
      return true;
    }
    case Kind::kBytes: return false;
  }
  return false;
}

Status FindProfileFiles(const std::string& run, std::vector<std::string>* files) {
  files->clear();
  std::error_code ec;
  fs::path p(run);
  if (!fs::exists(p, ec)) return NotFoundError("no such file or folder: " + QuoteInput(run));
  if (!fs::is_directory(p, ec)) {
    files->push_back(run);
    return Status::Ok();
  }
  *files = XPlaneFilesIn(p);
  if (!files->empty()) return Status::Ok();
  // A log dir: its runs are the folders of <dir>/plugins/profile (or of the
  // folder itself when given plugins/profile); the newest wins.
  for (const fs::path& runs : {p / "plugins" / "profile", p}) {
    fs::path newest;
    fs::file_time_type newest_time{};
    for (const auto& e : fs::directory_iterator(runs, ec)) {
      if (!e.is_directory(ec) || XPlaneFilesIn(e.path()).empty()) continue;
      fs::file_time_type t = e.last_write_time(ec);
      if (newest.empty() || t > newest_time || (t == newest_time && e.path().filename() > newest.filename()))
        newest = e.path(), newest_time = t;
    }
    if (!newest.empty()) {
      *files = XPlaneFilesIn(newest);
      return Status::Ok();
    }
  }
  return NotFoundError("no .xplane.pb in " + QuoteInput(run) +
                       " (expected a profile file, a run folder, or a log dir holding plugins/profile/<run>/)");
}

// --- ProfileData ----------------------------------------------------------------

std::string_view ProfileEvent::name() const { return plane_->event_metadata()[event_->metadata_id].name; }
std::string_view ProfileEvent::display_name() const {
  return plane_->event_metadata()[event_->metadata_id].display_name;
}
int64_t ProfileEvent::start_ns() const { return SaturatedAdd(line_->timestamp_ns, event_->offset_ps / 1000); }
int64_t ProfileEvent::duration_ns() const { return event_->duration_ps / 1000; }
int64_t ProfileEvent::offset_ps() const { return event_->offset_ps; }
int64_t ProfileEvent::duration_ps() const { return event_->duration_ps; }
std::vector<ProfileStat> ProfileEvent::stats() const {
  std::vector<ProfileStat> out;
  for (const model::Stat& s : line_->stats_of(*event_)) out.push_back(ModelStat(*plane_, s));
  for (const model::Stat& s : plane_->event_metadata()[event_->metadata_id].stats)
    out.push_back(ModelStat(*plane_, s));
  return out;
}

int64_t ProfileLine::id() const { return line_->id; }
int64_t ProfileLine::display_id() const { return line_->display_id; }
std::string_view ProfileLine::name() const { return line_->name; }
std::string_view ProfileLine::display_name() const { return line_->display_name; }
int64_t ProfileLine::timestamp_ns() const { return line_->timestamp_ns; }
size_t ProfileLine::event_count() const { return line_->events.size(); }
ProfileEvent ProfileLine::event(size_t i) const { return ProfileEvent(plane_, line_, &line_->events.at(i)); }

int64_t ProfilePlane::id() const { return plane_->id; }
std::string_view ProfilePlane::name() const { return plane_->name; }
size_t ProfilePlane::line_count() const { return plane_->lines.size(); }
ProfileLine ProfilePlane::line(size_t i) const { return ProfileLine(plane_, &plane_->lines.at(i)); }
std::vector<ProfileStat> ProfilePlane::stats() const {
  std::vector<ProfileStat> out;
  for (const model::Stat& s : plane_->stats) out.push_back(ModelStat(*plane_, s));
  return out;
}

ProfileData::ProfileData() : space_(std::make_unique<model::Space>()) {}
ProfileData::~ProfileData() = default;
ProfileData::ProfileData(ProfileData&&) noexcept = default;
ProfileData& ProfileData::operator=(ProfileData&&) noexcept = default;

Status ProfileData::FromSerialized(std::string_view bytes, ProfileData* out) {
  auto space = std::make_unique<model::Space>();
  if (Status s = model::ImportXSpaceBytesChunked(bytes, space.get()); !s.ok()) return s;
  out->space_ = std::move(space);
  return Status::Ok();
}

size_t ProfileData::plane_count() const { return space_->planes.size(); }
ProfilePlane ProfileData::plane(size_t i) const { return ProfilePlane(&space_->planes.at(i)); }
std::optional<ProfilePlane> ProfileData::find_plane(std::string_view name) const {
  const model::Plane* p = space_->find_plane(name);
  if (!p) return std::nullopt;
  return ProfilePlane(p);
}
const std::vector<std::string>& ProfileData::hostnames() const { return space_->hostnames; }
const std::vector<std::string>& ProfileData::errors() const { return space_->errors; }
const std::vector<std::string>& ProfileData::warnings() const { return space_->warnings; }
uint64_t ProfileData::event_count() const { return space_->event_count(); }

// --- ProfileReader ----------------------------------------------------------------

namespace {
Status ScanBytes(const char* data, uint64_t size, const std::string& path, const ReadOptions& options,
                 ProfileVisitor& visitor);
}  // namespace

ProfileVisitor::~ProfileVisitor() = default;

ProfileReader::ProfileReader() = default;
ProfileReader::~ProfileReader() { Close(); }

void ProfileReader::Close() {
  if (data_ && size_) model::UnmapFile({data_, size_});
  data_ = nullptr;
  size_ = 0;
}

Status ProfileReader::Open(const std::string& path, const ReadOptions& options) {
  Close();
  path_ = path;
  options_ = options;
  model::MappedFile file;
  if (Status s = file.Open(path, UINT64_MAX); !s.ok()) return s;
  if (file.bytes().empty())
    return InvalidArgumentError(QuoteInput(path) +
                                " is empty: not a profile (was the writer stopped before it finished?)");
  std::string_view bytes = file.Release();  // unmapped by Close()
  data_ = bytes.data();
  size_ = bytes.size();
  Status s = model::CheckProfileBytes(bytes, path);
  return model::FileChanged(bytes) ? model::FileChangedError(path) : s;
}

Status ProfileReader::Read(ProfileData* out) const {
  if (!data_) return FailedPreconditionError("no profile open");
  Status s = ProfileData::FromSerialized(std::string_view(data_, size_), out);
  if (model::FileChanged({data_, size_})) return model::FileChangedError(path_);
  if (!s.ok()) return InvalidArgumentError(path_ + ": " + s.message());
  return s;
}

Status ProfileReader::Scan(ProfileVisitor& visitor) const {
  if (!data_) return FailedPreconditionError("no profile open");
  Status s = ScanBytes(data_, size_, path_, options_, visitor);
  // Pages past a new end read as zeros: whatever the scan made of them, the
  // file changed.
  return model::FileChanged({data_, size_}) ? model::FileChangedError(path_) : s;
}

namespace {

// The scan itself (its parameters keep the names of the members it was
// written with).
Status ScanBytes(const char* data_, uint64_t size_, const std::string& path_, const ReadOptions& options_,
                 ProfileVisitor& visitor) {
  std::string_view bytes(data_, size_);
  auto error = [&](Next n, std::string_view within) {
    return WireError(n, path_, static_cast<size_t>(within.data() - data_), size_);
  };
  std::vector<std::string> hostnames, errors, warnings;
  NameTable event_names, event_display_names, stat_names;
  std::vector<ProfileStat> plane_stats, event_stats;
  std::vector<std::string_view> lines;
  uint64_t next_progress = 0, released = 0;
  constexpr uint64_t kProgressStep = 16 << 20, kReleaseStep = 16 << 20, kPage = 4096;
  size_t pos = 0;
  uint32_t number, type;
  std::string_view plane;
  Next n;
  while ((n = NextField(bytes, &pos, &number, &type, &plane)) == Next::kField) {
    if (number == f::kSpaceHostnames) hostnames.emplace_back(plane);
    if (number == f::kSpaceErrors) errors.emplace_back(plane);
    if (number == f::kSpaceWarnings) warnings.emplace_back(plane);
    if (number != f::kSpacePlanes) continue;
    // Pass 1: the plane's header, metadata and stats; where its lines are.
    PlaneHeader header;
    event_names.clear();
    event_display_names.clear();
    stat_names.clear();
    lines.clear();
    std::vector<std::string_view> raw_stats;
    size_t ppos = 0;
    uint32_t pn, pt;
    std::string_view pp;
    uint64_t v = 0;
    Next r;
    while ((r = NextField(plane, &ppos, &pn, &pt, &pp, &v)) == Next::kField) {
      int64_t id;
      std::string_view name, display;
      switch (pn) {
        case f::kPlaneId: header.id = static_cast<int64_t>(v); break;
        case f::kPlaneName: header.name = pp; break;
        case f::kPlaneLines: lines.push_back(pp); break;
        case f::kPlaneEventMd:
          if (!ReadMetadataEntry(pp, &id, &name, &display)) return error(Next::kBad, pp);
          event_names.add(id, name);
          if (!display.empty()) event_display_names.add(id, display);
          break;
        case f::kPlaneStatMd:
          if (!ReadMetadataEntry(pp, &id, &name)) return error(Next::kBad, pp);
          stat_names.add(id, name);
          break;
        case f::kPlaneStats: raw_stats.push_back(pp); break;
        default: break;
      }
    }
    if (r != Next::kEnd) return error(r, plane.substr(ppos));
    plane_stats.clear();
    for (std::string_view s : raw_stats) {
      ProfileStat st;
      if (!ReadStat(s, stat_names, &st)) return error(Next::kBad, s);
      plane_stats.push_back(st);
    }
    header.stats = plane_stats;
    if (!visitor.OnPlane(header)) continue;
    // Pass 2: each line's header (its display fields follow its events),
    // then its events.
    for (size_t li = 0; li < lines.size(); ++li) {
      std::string_view line = lines[li];
      uint64_t at = static_cast<uint64_t>(line.data() - data_);
      // The pages read so far leave this process (they stay in the page
      // cache, and come back if read again: clean pages of the file, so what
      // points into them stays valid): memory stays near what the visitor
      // keeps, whatever the file's size, a line of gigabytes included.
      auto release = [&](const char* p, bool now = false) {
        uint64_t here = static_cast<uint64_t>(p - data_);
        if (here < released || (here - released < kReleaseStep && !now)) return;
        uint64_t end = here & ~(kPage - 1);
        if (end > released) madvise(const_cast<char*>(data_) + released, end - released, MADV_DONTNEED);
        released = std::max(released, end);
      };
      // Progress every kProgressStep bytes, within a line too (a trace of one busy thread is one line).
      auto report_progress = [&](const char* p) {
        uint64_t here = static_cast<uint64_t>(p - data_);
        if (!options_.progress || here < next_progress) return;
        options_.progress(here, size_);
        next_progress = here + kProgressStep;
      };
      release(line.data());
      report_progress(line.data());
      LineHeader lh;
      lh.index = li;
      size_t lpos = 0;
      while ((r = NextField(line, &lpos, &pn, &pt, &pp, &v)) == Next::kField) {
        if (pt == kLengthDelimited) release(pp.data());  // (a varint field leaves pp as it was)
        switch (pn) {
          case f::kLineId: lh.id = static_cast<int64_t>(v); break;
          case f::kLineName: lh.name = pp; break;
          case f::kLineTimestamp: lh.timestamp_ns = static_cast<int64_t>(v); break;
          case f::kLineDisplayId: lh.display_id = static_cast<int64_t>(v); break;
          case f::kLineDisplayName: lh.display_name = pp; break;
          default: break;
        }
      }
      if (r != Next::kEnd) return error(r, line.substr(lpos));
      // The events' pass reads the line again: what the first left goes now.
      if (line.size() > kReleaseStep) release(line.data() + line.size(), true);
      released = at & ~(kPage - 1);
      if (!visitor.OnLine(lh)) continue;
      lpos = 0;
      while ((r = NextField(line, &lpos, &pn, &pt, &pp, &v)) == Next::kField) {
        if (pn != f::kLineEvents || pt != kLengthDelimited) continue;
        release(pp.data());
        report_progress(pp.data());
        EventRecord e;
        event_stats.clear();
        size_t epos = 0;
        uint32_t en, et;
        std::string_view ep;
        uint64_t ev = 0;
        Next er;
        while ((er = NextField(pp, &epos, &en, &et, &ep, &ev)) == Next::kField) {
          switch (en) {
            case f::kEventMd: e.metadata_id = ev; break;
            case f::kEventOffset: e.offset_ps = static_cast<int64_t>(ev); break;
            case f::kEventDuration: e.duration_ps = static_cast<int64_t>(ev); break;
            case f::kEventStats: {
              ProfileStat st;
              if (!ReadStat(ep, stat_names, &st)) return error(Next::kBad, ep);
              event_stats.push_back(st);
              break;
            }
            default: break;
          }
        }
        if (er != Next::kEnd) return error(er, pp.substr(epos));
        e.name = event_names.find(e.metadata_id);
        e.display_name = event_display_names.find(e.metadata_id);
        e.start_ps = WrappedPs(lh.timestamp_ns, e.offset_ps);
        e.stats = event_stats;
        visitor.OnEvent(e);
      }
      visitor.OnLineEnd();
    }
    visitor.OnPlaneEnd();
  }
  if (n != Next::kEnd) return error(n, bytes.substr(pos));
  if (options_.progress) options_.progress(size_, size_);
  visitor.OnSpace(hostnames, errors, warnings);
  return Status::Ok();
}

}  // namespace

}  // namespace spyglass::profile

namespace spyglass::model {

Status CheckProfileBytes(std::string_view bytes, const std::string& path) {
  return profile::CheckTopLevel(bytes, path);
}

}  // namespace spyglass::model
