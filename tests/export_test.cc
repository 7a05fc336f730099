// Converters: the model to .xplane.pb and trace-event JSON, checked by
// reading them back (generated protobuf classes, nlohmann::json).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "test_util.h"
#include "trace/host_collector.h"

using namespace spyglass;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadGzip;
using spyglass::testing::ReadXSpace;

namespace {

model::Space SampleSpace() {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  model::Line& line = host.line_with_id(0x1234567890LL);
  line.name = line.display_name = "main \"quoted\"";
  model::Event outer{1'000'000, 5'000'000, host.intern_event("outer"), model::kNoStats};
  model::Event inner{2'000'500, 1'000'000, host.intern_event("inner \xe2\x9c\x93 \xff"), 0};
  line.stat_lists.push_back({host.int_stat("step_num", 5), host.int_stat("_r", 1), host.ref_stat("kind", "eval"),
                             host.double_stat("lr", 0.125)});
  line.events = {outer, inner};
  host.stats.push_back(host.int_stat("process_id", 42));
  model::Plane& gpu = space.plane("/device:GPU:0");
  gpu.id = 3;
  model::Line& stream = gpu.line_with_id(7);
  stream.name = "stream 7";
  stream.events.push_back({0, 0, gpu.intern_event("kernel"), model::kNoStats});
  space.plane(model::kTaskEnvPlaneName).stats.push_back(
      space.find_plane(model::kTaskEnvPlaneName)->uint_stat("profile_start_time", 1));
  space.hostnames.push_back("host-a");
  space.warnings.push_back("a warning");
  return space;
}

TEST(XPlaneWriter, RoundTripsThroughTheGeneratedParser) {
  model::Space space = SampleSpace();
  std::string bytes = exporter::SerializeXSpace(space);
  tensorflow::profiler::XSpace parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.planes_size(), 3);
  const auto& host = parsed.planes(0);
  EXPECT_EQ(host.name(), "/host:CPU");
  ASSERT_EQ(host.lines_size(), 1);
  EXPECT_EQ(host.lines(0).id(), 0x1234567890LL);
  EXPECT_EQ(host.lines(0).name(), "main \"quoted\"");
  ASSERT_EQ(host.lines(0).events_size(), 2);
  const auto& e0 = host.lines(0).events(0);
  EXPECT_EQ(host.event_metadata().at(e0.metadata_id()).name(), "outer");
  EXPECT_EQ(e0.offset_ps(), 1'000'000);
  EXPECT_EQ(e0.duration_ps(), 5'000'000);
  const auto& e1 = host.lines(0).events(1);
  ASSERT_EQ(e1.stats_size(), 4);
  EXPECT_EQ(e1.stats(0).int64_value(), 5);
  EXPECT_EQ(host.stat_metadata().at(e1.stats(2).ref_value()).name(), "eval");
  EXPECT_EQ(e1.stats(3).double_value(), 0.125);
  // Metadata maps: key == id, ids dense from 1.
  for (const auto& [id, md] : host.event_metadata()) EXPECT_EQ(id, md.id());
  for (const auto& [id, md] : host.stat_metadata()) EXPECT_EQ(id, md.id());
  EXPECT_EQ(host.stat_metadata().count(0), 0u);
  // An event at offset 0 still carries the oneof case.
  EXPECT_EQ(parsed.planes(1).lines(0).events(0).data_case(), tensorflow::profiler::XEvent::kOffsetPs);
  EXPECT_EQ(parsed.planes(1).id(), 3);
  EXPECT_EQ(parsed.hostnames(0), "host-a");
  EXPECT_EQ(parsed.warnings(0), "a warning");
  // Byte-compatible: protobuf re-serializes what it parsed to the same bytes.
  std::string again;
  ASSERT_TRUE(parsed.SerializeToString(&again));
  EXPECT_EQ(again.size(), bytes.size());
}

TEST(XPlaneWriter, FileAndErrors) {
  std::string dir = MakeTempDir();
  model::Space space = SampleSpace();
  ASSERT_TRUE(exporter::WriteXSpaceFile(space, dir + "/x.xplane.pb").ok());
  EXPECT_EQ(ReadXSpace(dir + "/x.xplane.pb").planes_size(), 3);
  auto s = exporter::WriteXSpaceFile(space, dir + "/missing/x.xplane.pb");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("missing/x.xplane.pb"), std::string::npos);
  if (access("/dev/full", W_OK) == 0) {
    s = exporter::WriteXSpaceFile(space, "/dev/full");
    EXPECT_FALSE(s.ok()) << "a full disk must be reported";
  }
}

TEST(TraceJson, FormatAsTslWritesIt) {
  model::Space space = SampleSpace();
  std::string text = exporter::TraceJsonString(space);
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\":\"ns\",\"metadata\":{\"highres-ticks\":true},\"traceEvents\":[", 0), 0u);
  // No trailing `{}` element (JAX writes one; speedscope rejects it).
  EXPECT_EQ(text.substr(text.size() - 3), "}]}");
  nlohmann::json j = nlohmann::json::parse(text);  // throws on invalid JSON
  const auto& events = j["traceEvents"];
  for (const auto& e : events) EXPECT_FALSE(e.empty()) << "an empty element in traceEvents";
  bool host_name = false, thread_name = false, gpu_name = false;
  nlohmann::json inner;
  for (const auto& e : events) {
    if (e.empty()) continue;
    if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 701) host_name = e["args"]["name"] == "/host:CPU";
    if (e["ph"] == "M" && e["name"] == "process_name" && e["pid"] == 4) gpu_name = e["args"]["name"] == "/device:GPU:0";
    if (e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 701) {
      thread_name = e["args"]["name"] == "main \"quoted\"";
      EXPECT_EQ(e["tid"], uint32_t(0x1234567890LL));
    }
    if (e["ph"] == "X" && e["name"].get<std::string>().rfind("inner", 0) == 0) inner = e;
  }
  EXPECT_TRUE(host_name);
  EXPECT_TRUE(thread_name);
  EXPECT_TRUE(gpu_name);
  ASSERT_FALSE(inner.is_null());
  EXPECT_EQ(inner["name"], "inner \xe2\x9c\x93 \xef\xbf\xbd");  // invalid byte replaced
  EXPECT_DOUBLE_EQ(inner["ts"].get<double>(), 2.0005);
  EXPECT_DOUBLE_EQ(inner["dur"].get<double>(), 1.0);
  // Args: strings, sorted, internal stats hidden.
  EXPECT_EQ(inner["args"].dump(), R"({"kind":"eval","lr":"0.125","step_num":"5"})");
  EXPECT_NE(text.find("\"ts\":2.0005,"), std::string::npos);
}

TEST(TraceJson, PerfettoVariantHasNoMetadataAndGzipReads) {
  std::string dir = MakeTempDir();
  exporter::TraceJsonOptions o;
  o.perfetto = true;
  ASSERT_TRUE(exporter::WriteTraceJsonGz(SampleSpace(), dir + "/p.json.gz", o).ok());
  std::string text = ReadGzip(dir + "/p.json.gz");
  auto j = nlohmann::json::parse(text);
  EXPECT_FALSE(j.contains("metadata"));
  EXPECT_EQ(j["displayTimeUnit"], "ns");
  EXPECT_FALSE(exporter::WriteTraceJsonGz(SampleSpace(), dir + "/no/such/dir.json.gz").ok());
}

TEST(TraceMeName, ParsesLikeTheReference) {
  auto p = internal::ParseTraceMeName("step#_r=1,step_num=5,list=[1,2],q=\"a,b\",bad,=x,y=#");
  EXPECT_EQ(p.name, "step");
  ASSERT_EQ(p.args.size(), 4u);
  EXPECT_EQ(p.args[0].first, "_r");
  EXPECT_EQ(p.args[2].second, "[1,2]");
  EXPECT_EQ(p.args[3].second, "\"a,b\"");
  EXPECT_EQ(internal::ParseTraceMeName("plain name").name, "plain name");
  EXPECT_EQ(internal::ParseTraceMeName("no#end").name, "no#end");
}

}  // namespace
