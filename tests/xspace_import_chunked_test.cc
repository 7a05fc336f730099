// The chunked XSpace import (what `collect` uses to keep its peak memory near
// the reply's size) gives the same model as the one-shot import, whatever the
// piece size: events of one line split across pieces, lines without events,
// stats of every kind (refs too), unknown metadata, several planes.
#include <random>
#include <string>

#include <gtest/gtest.h>

#include "export/trace_json/trace_json_writer.h"
#include "model/xspace_import.h"
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
    for (size_t chunk : {size_t{1}, size_t{40}, size_t{300}, model::kImportChunkBytes}) {
      model::Space pieces;
      ASSERT_TRUE(model::ImportXSpaceBytesChunked(bytes, &pieces, chunk).ok()) << seed << " " << chunk;
      ASSERT_EQ(pieces.planes.size(), whole.planes.size());
      for (size_t p = 0; p < whole.planes.size(); ++p) {
        ASSERT_EQ(pieces.planes[p].lines.size(), whole.planes[p].lines.size()) << seed << " " << chunk;
        EXPECT_EQ(pieces.planes[p].name, whole.planes[p].name);
        EXPECT_EQ(pieces.planes[p].stats.size(), whole.planes[p].stats.size());
        for (size_t l = 0; l < whole.planes[p].lines.size(); ++l)
          EXPECT_EQ(pieces.planes[p].lines[l].events.size(), whole.planes[p].lines[l].events.size());
      }
      EXPECT_EQ(pieces.errors, whole.errors);
      EXPECT_EQ(pieces.warnings, whole.warnings);
      EXPECT_EQ(pieces.hostnames, whole.hostnames);
      EXPECT_EQ(exporter::TraceJsonString(pieces), expect) << seed << " " << chunk;
    }
  }
}

TEST(XSpaceImportChunked, MalformedBytesFail) {
  std::string bytes = RandomSpace(7).SerializeAsString();
  for (size_t cut : {size_t{1}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 1}) {
    model::Space out, whole;
    Status chunked = model::ImportXSpaceBytesChunked(bytes.substr(0, cut), &out, 100);
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

}  // namespace
}  // namespace spyglass
