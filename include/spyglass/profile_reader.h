// Reading a profile (.xplane.pb, ours or JAX's) from code, without a UI.
//
//   spyglass::profile::ProfileReader reader;
//   if (Status s = reader.Open("logs/plugins/profile/run1/host.xplane.pb"); !s.ok()) ...
//   ProfileData data;
//   reader.Read(&data);            // the whole profile: planes, lines, events, stats
//   reader.Scan(visitor);          // or one pass over the events, in bounded memory
//
// Times: an event starts at line timestamp_ns + offset_ps / 1000 (nanoseconds
// since the session started in files JAX and Spyglass write).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "spyglass/api.h"
#include "spyglass/status.h"

namespace spyglass::model {
struct Space;
class Plane;
struct Line;
struct Event;
struct Stat;
}  // namespace spyglass::model

namespace spyglass::profile {

// The newest format this reader understands (the stat
// "spyglass_format_version" of /host:metadata; files without it are format 1).
inline constexpr int64_t kProfileFormatVersion = 1;

// The .xplane.pb files a RUN argument names: the file itself; the files of a
// run folder (<log_dir>/plugins/profile/<run>/); or those of the newest run
// of a log dir (by folder modification time, then name). NotFound if none.
SPYGLASS_API Status FindProfileFiles(const std::string& run, std::vector<std::string>* files);

// A stat's value, as it is stored (ref values resolved to their text).
struct ProfileStat {
  enum class Kind : uint8_t { kInt64, kUint64, kDouble, kString, kBytes };
  std::string_view name;
  Kind kind = Kind::kInt64;
  int64_t i64 = 0;
  uint64_t u64 = 0;
  double f64 = 0;
  std::string_view str;  // kString, kBytes

  bool is_number() const { return kind <= Kind::kDouble; }
  // Numbers as a double; a string holding a decimal integer too (TraceMe
  // arguments arrive as text in some writers). False otherwise.
  SPYGLASS_API bool as_double(double* out) const;
};

// --- the whole profile in memory -------------------------------------------

class ProfileData;

class SPYGLASS_API ProfileEvent {
 public:
  std::string_view name() const;
  std::string_view display_name() const;  // empty if the writer gave none
  int64_t start_ns() const;               // line timestamp + offset
  int64_t duration_ns() const;
  int64_t offset_ps() const;
  int64_t duration_ps() const;
  std::vector<ProfileStat> stats() const;  // the event's, then its metadata's

 private:
  friend class ProfileLine;
  ProfileEvent(const model::Plane* p, const model::Line* l, const model::Event* e) : plane_(p), line_(l), event_(e) {}
  const model::Plane* plane_;
  const model::Line* line_;
  const model::Event* event_;
};

class SPYGLASS_API ProfileLine {
 public:
  int64_t id() const;
  int64_t display_id() const;
  std::string_view name() const;
  std::string_view display_name() const;
  int64_t timestamp_ns() const;
  size_t event_count() const;
  ProfileEvent event(size_t i) const;

 private:
  friend class ProfilePlane;
  ProfileLine(const model::Plane* p, const model::Line* l) : plane_(p), line_(l) {}
  const model::Plane* plane_;
  const model::Line* line_;
};

class SPYGLASS_API ProfilePlane {
 public:
  int64_t id() const;
  std::string_view name() const;
  size_t line_count() const;
  ProfileLine line(size_t i) const;
  std::vector<ProfileStat> stats() const;

 private:
  friend class ProfileData;
  explicit ProfilePlane(const model::Plane* p) : plane_(p) {}
  const model::Plane* plane_;
};

class SPYGLASS_API ProfileData {
 public:
  ProfileData();
  ~ProfileData();
  ProfileData(ProfileData&&) noexcept;
  ProfileData& operator=(ProfileData&&) noexcept;

  // Serialized XSpace bytes (InvalidArgument if they are not one).
  static Status FromSerialized(std::string_view bytes, ProfileData* out);

  size_t plane_count() const;
  ProfilePlane plane(size_t i) const;
  // The first plane of that name.
  std::optional<ProfilePlane> find_plane(std::string_view name) const;
  const std::vector<std::string>& hostnames() const;
  const std::vector<std::string>& errors() const;
  const std::vector<std::string>& warnings() const;
  uint64_t event_count() const;

 private:
  friend class ProfileReader;
  std::unique_ptr<model::Space> space_;
};

// --- one pass over the events -------------------------------------------------

struct PlaneHeader {
  int64_t id = 0;
  std::string_view name;
  std::span<const ProfileStat> stats;  // the plane's own stats
};

struct LineHeader {
  int64_t id = 0;
  int64_t display_id = 0;
  std::string_view name;
  std::string_view display_name;
  int64_t timestamp_ns = 0;
  size_t index = 0;  // in its plane
};

struct EventRecord {
  uint64_t metadata_id = 0;  // the same for every event of one name in a plane
  std::string_view name;     // its metadata's name
  std::string_view display_name;  // its metadata's display name; empty if none
  int64_t offset_ps = 0;
  int64_t duration_ps = 0;
  int64_t start_ps = 0;      // line timestamp_ns * 1000 + offset_ps
  std::span<const ProfileStat> stats;  // the event's own (not its metadata's)
};

// Scan() calls these in file order: each plane, then each of its lines and
// that line's events. Names and stats point into the file: they live until
// the next call.
class SPYGLASS_API ProfileVisitor {
 public:
  virtual ~ProfileVisitor();
  // False skips the plane's lines.
  virtual bool OnPlane(const PlaneHeader&) { return true; }
  // False skips the line's events.
  virtual bool OnLine(const LineHeader&) { return true; }
  virtual void OnEvent(const EventRecord&) {}
  virtual void OnLineEnd() {}
  virtual void OnPlaneEnd() {}
  // The XSpace's own fields, after the planes.
  virtual void OnSpace(const std::vector<std::string>& /*hostnames*/, const std::vector<std::string>& /*errors*/,
                       const std::vector<std::string>& /*warnings*/) {}
};

struct ReadOptions {
  // Called now and then with (bytes done, bytes in all) while reading.
  std::function<void(uint64_t, uint64_t)> progress;
};

// One .xplane.pb, read into memory (not mapped: a file truncated while it was
// mapped killed the reader with SIGBUS): memory is the file's bytes plus what
// the caller keeps (Scan), or the model too (Read).
class SPYGLASS_API ProfileReader {
 public:
  ProfileReader();
  ~ProfileReader();
  ProfileReader(const ProfileReader&) = delete;
  ProfileReader& operator=(const ProfileReader&) = delete;

  // Reads the file and checks that it is a profile this reader understands:
  // InvalidArgument with a clear message for a path that is not a regular
  // file (a FIFO is an error, not a hang), a file that is not a profile, is
  // truncated, or comes from a newer format.
  Status Open(const std::string& path, const ReadOptions& options = {});
  const std::string& path() const { return path_; }
  uint64_t size_bytes() const { return size_; }

  // The whole profile.
  Status Read(ProfileData* out) const;
  // One pass over planes, lines and events.
  Status Scan(ProfileVisitor& visitor) const;

 private:
  void Close();
  std::string path_;
  const char* data_ = nullptr;
  uint64_t size_ = 0;
  ReadOptions options_;
};

}  // namespace spyglass::profile
