#include "model/xspace_import_chunked.h"

#include <google/protobuf/arena.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/xspace_import.h"
#include "xplane.pb.h"

namespace spyglass::model {
namespace {

namespace tp = tensorflow::profiler;

// Field numbers of the messages split here (xplane.proto).
constexpr uint32_t kSpacePlanes = 1;
constexpr uint32_t kPlaneLines = 3;
constexpr uint32_t kLineEvents = 4;
constexpr uint32_t kLengthDelimited = 2;

bool ReadVarint(std::string_view msg, size_t* pos, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *pos < msg.size(); shift += 7) {
    uint8_t b = static_cast<uint8_t>(msg[(*pos)++]);
    *v |= uint64_t{b & 0x7fu} << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

enum class Next { kField, kEnd, kBad };

// Groups nest at most this deep (protobuf's own recursion limit).
constexpr int kMaxDepth = 100;

// Reads the field at *pos: its number, wire type and, when length-delimited,
// its payload. Groups (unknown fields only, in xplane.proto) are skipped
// whole; an end-group tag is a field only inside one (depth > 0).
Next NextField(std::string_view msg, size_t* pos, uint32_t* number, uint32_t* type, std::string_view* payload,
               int depth = 0) {
  if (*pos == msg.size()) return Next::kEnd;
  uint64_t tag, v;
  if (!ReadVarint(msg, pos, &tag) || tag >> 3 == 0 || tag >> 3 > UINT32_MAX) return Next::kBad;
  *number = static_cast<uint32_t>(tag >> 3);
  *type = static_cast<uint32_t>(tag & 7);
  switch (*type) {
    case 0: return ReadVarint(msg, pos, &v) ? Next::kField : Next::kBad;
    case 1: v = 8; break;
    case 5: v = 4; break;
    case kLengthDelimited:
      if (!ReadVarint(msg, pos, &v)) return Next::kBad;
      break;
    case 3:  // start group: up to its end-group tag of the same number
      if (depth >= kMaxDepth) return Next::kBad;
      while (true) {
        uint32_t n, t;
        std::string_view p;
        if (NextField(msg, pos, &n, &t, &p, depth + 1) != Next::kField) return Next::kBad;
        if (t == 4) return n == *number ? Next::kField : Next::kBad;
      }
    case 4: return depth > 0 ? Next::kField : Next::kBad;
    default: return Next::kBad;
  }
  if (v > msg.size() - *pos) return Next::kBad;
  *payload = msg.substr(*pos, v);
  *pos += v;
  return Next::kField;
}

// Splits a message into the payloads of field `split` (if `parts`) and the
// other fields, kept raw and in order in `rest`.
bool Split(std::string_view msg, uint32_t split, std::string* rest, std::vector<std::string_view>* parts) {
  size_t pos = 0;
  while (true) {
    size_t start = pos;
    uint32_t number, type;
    std::string_view payload;
    Next n = NextField(msg, &pos, &number, &type, &payload);
    if (n != Next::kField) return n == Next::kEnd;
    if (number == split && type == kLengthDelimited) {
      if (parts) parts->push_back(payload);
    } else {
      rest->append(msg.substr(start, pos - start));
    }
  }
}

void PutVarint(uint64_t v, std::string* out) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutLengthDelimited(uint32_t field, std::string_view value, std::string* out) {
  PutVarint(uint64_t{field} << 3 | kLengthDelimited, out);
  PutVarint(value.size(), out);
  out->append(value);
}

// Moves the lines of `piece` (line i of it is a part of line `line_of[i]` of
// the plane) into `out`: appended to the part already there, else as a new
// line. Metadata ids are matched by name unless `same_ids`.
void Append(Plane&& piece, const std::vector<size_t>& line_of, bool same_ids, Plane* out,
            std::vector<size_t>* out_line) {
  std::vector<uint32_t> event_id, stat_id;
  if (!same_ids) {
    event_id.resize(piece.event_metadata().size());
    stat_id.resize(piece.stat_metadata().size());
    for (size_t i = 1; i < event_id.size(); ++i) event_id[i] = out->intern_event(piece.event_metadata()[i].name);
    for (size_t i = 1; i < stat_id.size(); ++i) stat_id[i] = out->intern_stat(piece.stat_metadata()[i].name);
  }
  // The first piece's string values moved with the plane itself.
  uint64_t str_offset = same_ids ? 0 : out->adopt_strings(piece);
  for (size_t k = 0; k < line_of.size() && k < piece.lines.size(); ++k) {
    Line& line = piece.lines[k];
    if (!same_ids) {
      auto map = [](const std::vector<uint32_t>& ids, uint64_t id) {
        return id < ids.size() ? ids[id] : static_cast<uint32_t>(id);
      };
      for (Event& e : line.events) e.metadata_id = map(event_id, e.metadata_id);
      for (Stat& s : line.mutable_stats()) {
        s.metadata_id = map(stat_id, s.metadata_id);
        if (s.kind == StatKind::kRef) s.ref = map(stat_id, s.ref);
        if (s.kind == StatKind::kString || s.kind == StatKind::kBytes) s.str_index += str_offset;
      }
    }
    size_t& at = (*out_line)[line_of[k]];
    if (at == SIZE_MAX) {
      at = out->lines.size();
      out->lines.push_back(std::move(line));
      continue;
    }
    out->lines[at].append(std::move(line));
  }
}

Status ImportPlane(std::string_view bytes, size_t chunk_bytes, Plane* out) {
  const Status bad = InvalidArgumentError("the data is not a serialized XSpace");
  std::string header;
  std::vector<std::string_view> lines;
  if (!Split(bytes, kPlaneLines, &header, &lines)) return bad;
  std::vector<size_t> out_line(lines.size(), SIZE_MAX);
  size_t line = 0, pos = 0;  // the next event: at `pos` in lines[line]
  std::string line_header;   // lines[line]'s fields but its events
  bool first = true;
  do {
    // A piece: the plane's header and about chunk_bytes of events, from one
    // or more lines (a line without events still makes one part).
    std::string chunk = header;
    std::vector<size_t> line_of;
    size_t size = 0;
    bool full = false;
    while (line < lines.size() && !full) {
      if (pos == 0) {
        line_header.clear();
        if (!Split(lines[line], kLineEvents, &line_header, nullptr)) return bad;
      }
      std::string part = line_header;
      bool any = false, done = false;
      while (true) {
        size_t at = pos;
        uint32_t number, type;
        std::string_view event;
        Next n = NextField(lines[line], &pos, &number, &type, &event);
        if (n == Next::kBad) return bad;
        if (n == Next::kEnd) {
          done = true;
          break;
        }
        if (number != kLineEvents || type != kLengthDelimited) continue;
        if (size > 0 && size + event.size() > chunk_bytes) {
          pos = at;  // for the next piece
          full = true;
          break;
        }
        PutLengthDelimited(kLineEvents, event, &part);
        size += event.size() + 2;
        any = true;
      }
      if (!any && !done) break;
      PutLengthDelimited(kPlaneLines, part, &chunk);
      line_of.push_back(line);
      if (done) {
        ++line;
        pos = 0;
      }
    }
    google::protobuf::Arena arena;
    auto* parsed = google::protobuf::Arena::CreateMessage<tp::XPlane>(&arena);
    if (!parsed->ParseFromString(chunk)) return bad;
    std::string().swap(chunk);
    Plane piece;
    ImportXPlane(*parsed, &piece);
    if (first) {
      // The plane's own fields, metadata and stats: those of the first piece.
      std::vector<Line> piece_lines = std::move(piece.lines);
      *out = std::move(piece);
      out->lines.clear();
      Plane only_lines;
      only_lines.lines = std::move(piece_lines);
      Append(std::move(only_lines), line_of, /*same_ids=*/true, out, &out_line);
      first = false;
    } else {
      Append(std::move(piece), line_of, /*same_ids=*/false, out, &out_line);
    }
  } while (line < lines.size());
  return Status::Ok();
}

}  // namespace

Status ImportXSpaceBytesChunked(std::string_view bytes, Space* out, size_t chunk_bytes) {
  const Status bad = InvalidArgumentError("the data is not a serialized XSpace");
  std::string rest;
  std::vector<std::string_view> planes;
  if (!Split(bytes, kSpacePlanes, &rest, &planes)) return bad;
  tp::XSpace fields;  // errors, warnings, hostnames
  if (!fields.ParseFromString(rest)) return bad;
  Space space;
  for (std::string_view p : planes) {
    space.planes.emplace_back();
    if (Status s = ImportPlane(p, chunk_bytes, &space.planes.back()); !s.ok()) return s;
  }
  ImportXSpace(fields, &space);
  for (Plane& p : space.planes) out->planes.push_back(std::move(p));
  for (auto [from, to] : {std::pair{&space.errors, &out->errors}, std::pair{&space.warnings, &out->warnings},
                          std::pair{&space.hostnames, &out->hostnames}})
    to->insert(to->end(), from->begin(), from->end());
  return Status::Ok();
}

}  // namespace spyglass::model
