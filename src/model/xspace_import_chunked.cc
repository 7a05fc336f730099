#include "model/xspace_import_chunked.h"

#include <google/protobuf/arena.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/wire.h"
#include "model/xspace_import.h"
#include "xplane.pb.h"

namespace spyglass::model {
namespace {

namespace tp = tensorflow::profiler;
using wire::kLengthDelimited;
using wire::Next;
using wire::NextField;
using wire::PutLengthDelimited;
using wire::Split;

// Field numbers of the messages split here (xplane.proto).
constexpr uint32_t kSpacePlanes = 1;
constexpr uint32_t kPlaneLines = 3;
constexpr uint32_t kLineEvents = 4;

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
        if (n == Next::kBad || n == Next::kTruncated) return bad;
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
