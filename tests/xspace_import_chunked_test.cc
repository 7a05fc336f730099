// The wire-decoding XSpace import (what `collect` and the profile readers use
// to keep their peak memory near the file's size) gives the same model as the
// one-shot protobuf import: lines without events, stats of every kind (refs
// too), unknown metadata, several planes; and fails where protobuf fails.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "export/trace_json/trace_json_writer.h"
#include "model/xspace_import.h"
#include "model/wire.h"
#include "model/xspace_import_chunked.h"
#include "xplane.pb.h"

namespace spyglass {
namespace {

namespace tp = tensorflow::profiler;

tp::XSpace RandomSpace(uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint32_t>(n)); };
  tp::XSpace space;
  for (int p = 0; p < 3; ++p) {
    tp::XPlane* plane = space.add_planes();
    plane->set_id(p);
    plane->set_name(p == 0 ? "/host:CPU" : "/device:GPU:" + std::to_string(p));
    for (int m = 1; m <= 6; ++m) {
      auto& md = (*plane->mutable_event_metadata())[m * 3];
      md.set_id(m * 3);
      md.set_name("event_" + std::to_string(m));
      if (m == 2) md.set_display_name("shown");
      auto& sm = (*plane->mutable_stat_metadata())[m * 5];
      sm.set_id(m * 5);
      sm.set_name("stat_" + std::to_string(m));
    }
    auto* ps = plane->add_stats();
    ps->set_metadata_id(5);
    ps->set_int64_value(42);
    for (int l = 0; l < 4; ++l) {
      tp::XLine* line = plane->add_lines();
      line->set_id(100 + l);
      line->set_display_id(l);
      line->set_name("line " + std::to_string(l));
      line->set_timestamp_ns(1000 + l);
      int events = l == 2 ? 0 : 1 + pick(60);
      for (int e = 0; e < events; ++e) {
        tp::XEvent* ev = line->add_events();
        ev->set_metadata_id(pick(10) == 0 ? 999 : 3 * (1 + pick(6)));  // 999: unknown
        ev->set_offset_ps(1000 * e);
        ev->set_duration_ps(pick(5000));
        for (int s = pick(4); s > 0; --s) {
          tp::XStat* st = ev->add_stats();
          st->set_metadata_id(5 * (1 + pick(6)));
          switch (pick(5)) {
            case 0: st->set_int64_value(-pick(100)); break;
            case 1: st->set_uint64_value(pick(100)); break;
            case 2: st->set_double_value(pick(100) / 4.0); break;
            case 3: st->set_str_value("s" + std::to_string(pick(9))); break;
            case 4: st->set_ref_value(5 * (1 + pick(6))); break;
          }
        }
      }
    }
  }
  space.add_errors("an error");
  space.add_warnings("a warning");
  space.add_hostnames("host-a");
  return space;
}

TEST(XSpaceImportChunked, SameModelAsTheOneShotImport) {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::string bytes = RandomSpace(seed).SerializeAsString();
    model::Space whole;
    ASSERT_TRUE(model::ImportXSpaceBytes(bytes, &whole).ok());
    std::string expect = exporter::TraceJsonString(whole);
    {
      model::Space pieces;
      ASSERT_TRUE(model::ImportXSpaceBytesChunked(bytes, &pieces).ok()) << seed;
      ASSERT_EQ(pieces.planes.size(), whole.planes.size());
      for (size_t p = 0; p < whole.planes.size(); ++p) {
        ASSERT_EQ(pieces.planes[p].lines.size(), whole.planes[p].lines.size()) << seed;
        EXPECT_EQ(pieces.planes[p].name, whole.planes[p].name);
        EXPECT_EQ(pieces.planes[p].stats.size(), whole.planes[p].stats.size());
        for (size_t l = 0; l < whole.planes[p].lines.size(); ++l)
          EXPECT_EQ(pieces.planes[p].lines[l].events.size(), whole.planes[p].lines[l].events.size());
      }
      EXPECT_EQ(pieces.errors, whole.errors);
      EXPECT_EQ(pieces.warnings, whole.warnings);
      EXPECT_EQ(pieces.hostnames, whole.hostnames);
      EXPECT_EQ(exporter::TraceJsonString(pieces), expect) << seed;
    }
  }
}

TEST(XSpaceImportChunked, MalformedBytesFail) {
  std::string bytes = RandomSpace(7).SerializeAsString();
  for (size_t cut : {size_t{1}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    model::Space out, whole;
    Status chunked = model::ImportXSpaceBytesChunked(bytes.substr(0, cut), &out);
    Status once = model::ImportXSpaceBytes(bytes.substr(0, cut), &whole);
    EXPECT_EQ(chunked.ok(), once.ok()) << cut;
    if (!chunked.ok()) EXPECT_TRUE(out.planes.empty());
  }
  // A length past the end, an end-group without a start, groups (unknown
  // fields: skipped when well formed), nothing: as protobuf decides.
  for (const std::string& b : {std::string("\x0a\xff\xff\xff\x0f", 5), std::string("\x0c"), std::string("\x0b\x0c"),
                               std::string("\x0b\x14"), std::string("\x73\x74"), std::string()}) {
    model::Space out, whole;
    EXPECT_EQ(model::ImportXSpaceBytesChunked(b, &out).ok(), model::ImportXSpaceBytes(b, &whole).ok()) << b.size();
  }
}

// Random byte changes of a valid XSpace: the two imports agree on whether
// it parses and on the trace (a differential check of the event decoder
// against protobuf's parser, run every time; tests/fuzz goes further).
TEST(XSpaceImportChunked, MutatedBytesAgreeWithProtobuf) {
  const std::string good = RandomSpace(11).SerializeAsString();
  std::mt19937 rng(5);
  int parsed = 0;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes = good;
    for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k)
      bytes[rng() % bytes.size()] = static_cast<char>(rng() & 0xff);
    model::Space once, decoded;
    Status a = model::ImportXSpaceBytes(bytes, &once);
    Status b = model::ImportXSpaceBytesChunked(bytes, &decoded);
    ASSERT_EQ(a.ok(), b.ok()) << i << ": " << a.ToString() << " / " << b.ToString();
    if (!a.ok()) continue;
    ++parsed;
    ASSERT_EQ(exporter::TraceJsonString(once), exporter::TraceJsonString(decoded)) << i;
  }
  EXPECT_GT(parsed, 100);  // most changes hit a value, not the framing
}

// Hand-made events: the `data` oneof in both orders, fields of the wrong wire
// type (skipped as unknown), a stat without value or metadata (left out), a
// string stat that is not UTF-8 (protobuf rejects it: both imports read it
// with U+FFFD and a warning, as `spyglass summary` reads it).
TEST(XSpaceImportChunked, EdgeCasesOfTheWireAsProtobuf) {
  auto field = [](uint32_t number, std::string_view payload) {
    std::string out;
    model::wire::PutLengthDelimited(number, payload, &out);
    return out;
  };
  auto varint = [](uint32_t number, uint64_t v) {
    std::string out;
    model::wire::PutVarint(uint64_t{number} << 3, &out);
    model::wire::PutVarint(v, &out);
    return out;
  };
  auto space_with = [&](const std::string& event) {
    tp::XPlane plane;
    plane.set_name("p");
    (*plane.mutable_event_metadata())[1].set_name("e");
    (*plane.mutable_stat_metadata())[2].set_name("s");
    std::string line = varint(1, 9) + field(4, event);
    std::string p = plane.SerializeAsString() + field(3, line);
    return field(1, p);
  };
  const std::string stat = field(4, varint(1, 2) + varint(4, 7));
  const std::vector<std::string> events = {
      varint(1, 1) + varint(2, 5000) + varint(5, 3),  // offset, then num_occurrences: offset 0
      varint(1, 1) + varint(5, 3) + varint(2, 5000),  // the other order: offset 5000
      varint(1, 1) + field(2, "x") + varint(3, 7) + stat,  // offset as bytes: unknown field
      varint(1, 1) + field(4, varint(1, 2)),               // stat without value
      varint(1, 1) + field(4, varint(1, 99) + varint(4, 1)),  // stat without metadata
      varint(1, 1) + field(4, varint(1, 2) + field(5, "\xff")),  // not UTF-8
      varint(1, 1) + field(4, varint(1, 2) + field(5, "ok") + varint(4, -1)),  // the oneof's last wins
      varint(1, 77) + stat,  // unknown event metadata
      varint(1, 1) + varint(4, 3),  // stats as a varint: unknown field
  };
  for (size_t i = 0; i < events.size(); ++i) {
    std::string bytes = space_with(events[i]);
    model::Space once, decoded;
    Status a = model::ImportXSpaceBytes(bytes, &once);
    Status b = model::ImportXSpaceBytesChunked(bytes, &decoded);
    ASSERT_EQ(a.ok(), b.ok()) << i;
    if (!a.ok()) continue;
    ASSERT_EQ(exporter::TraceJsonString(once), exporter::TraceJsonString(decoded)) << i;
    const model::Line& l = decoded.planes.at(0).lines.at(0);
    ASSERT_EQ(l.events.size(), 1u) << i;
    const model::Line& w = once.planes.at(0).lines.at(0);
    EXPECT_EQ(l.events[0].offset_ps, w.events[0].offset_ps) << i;
    EXPECT_EQ(l.events[0].duration_ps, w.events[0].duration_ps) << i;
    EXPECT_EQ(l.stats_of(l.events[0]).size(), w.stats_of(w.events[0]).size()) << i;
  }
  model::Space out;
  ASSERT_TRUE(model::ImportXSpaceBytesChunked(space_with(events[5]), &out).ok());
  ASSERT_EQ(out.warnings.size(), 1u);
  EXPECT_EQ(out.warnings[0], model::InvalidUtf8Warning(1));
  out = {};
  EXPECT_EQ(model::ImportXSpaceBytesChunked(space_with(events[0]), &out).ok(), true);
  EXPECT_EQ(out.planes[0].lines[0].events[0].offset_ps, 0);
}

}  // namespace
}  // namespace spyglass
