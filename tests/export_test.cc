// Converters: the model to .xplane.pb and trace-event JSON, checked by
// reading them back (generated protobuf classes, nlohmann::json).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <map>
#include <filesystem>
#include <set>

#include "export/export.h"
#include "export/perfetto/perfetto_writer.h"
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
  model::Event inner{2'000'500, 1'000'000, host.intern_event("inner \xe2\x9c\x93 \xff"), model::kNoStats};
  line.add_stats(inner, std::vector<model::Stat>{host.int_stat("step_num", 5), host.int_stat("_r", 1),
                                                  host.ref_stat("kind", "eval"), host.double_stat("lr", 0.125)});
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

// SerializeXSpace writes in one pass, guessing each length prefix's width
// from an estimate and moving the message when the guess is off; the file
// writer measures first. Both must give the same, canonical bytes.
TEST(XPlaneWriter, OnePassInMemoryMatchesTheMeasuredFile) {
  model::Space space = SampleSpace();
  model::Plane& gpu = *space.find_plane("/device:GPU:0");
  // Estimated far too small: 3000 events with 300-byte string stats.
  model::Line& big = gpu.line_with_id(8);
  big.name = "strings";
  for (int i = 0; i < 3000; ++i) {
    model::Event& e = big.events.emplace_back(model::Event{i * 1000, 500, gpu.intern_event("copy"), model::kNoStats});
    big.add_stat(e, gpu.str_stat("note", std::string(300, static_cast<char>('a' + i % 26))));
  }
  // Estimated too large: a few bare events (a one-byte prefix, not two).
  model::Line& small = gpu.line_with_id(9);
  for (int i = 0; i < 6; ++i) small.events.push_back({i, 0, 0, model::kNoStats});
  gpu.line_with_id(10);  // no events
  // An event whose body passes 127 bytes (its one-byte length reserved, then moved).
  model::Line& many = gpu.line_with_id(11);
  model::Event& wide = many.events.emplace_back(model::Event{-5, 1, gpu.intern_event("wide"), model::kNoStats});
  for (int i = 0; i < 12; ++i)
    many.add_stat(wide, i % 3 == 0   ? gpu.int_stat("neg", -1 - i)
                        : i % 3 == 1 ? gpu.double_stat("d", 0.5 * i)
                                     : gpu.uint_stat("u", ~uint64_t{0} - i));
  std::string bytes;
  ASSERT_TRUE(exporter::SerializeXSpace(space, &bytes).ok());
  std::string dir = MakeTempDir();
  ASSERT_TRUE(exporter::WriteXSpaceFile(space, dir + "/x.xplane.pb").ok());
  EXPECT_EQ(bytes, spyglass::testing::ReadFile(dir + "/x.xplane.pb"));
  tensorflow::profiler::XSpace parsed;
  ASSERT_TRUE(parsed.ParseFromString(bytes));
  ASSERT_EQ(parsed.planes(1).lines_size(), 5);
  ASSERT_EQ(parsed.planes(1).lines(4).events(0).stats_size(), 12);
  EXPECT_EQ(parsed.planes(1).lines(4).events(0).offset_ps(), -5);
  EXPECT_EQ(parsed.planes(1).lines(4).events(0).stats(9).int64_value(), -10);
  EXPECT_EQ(parsed.planes(1).lines(4).events(0).stats(10).double_value(), 5.0);
  EXPECT_EQ(parsed.planes(1).lines(4).events(0).stats(11).uint64_value(), ~uint64_t{0} - 11);
  EXPECT_EQ(parsed.planes(1).lines(1).events_size(), 3000);
  EXPECT_EQ(parsed.planes(1).lines(1).events(2999).stats(0).str_value(), std::string(300, 'a' + 2999 % 26));
  EXPECT_EQ(parsed.planes(1).lines(2).events_size(), 6);
  std::string again;  // canonical prefixes: protobuf's own sizes (map order may differ)
  ASSERT_TRUE(parsed.SerializeToString(&again));
  EXPECT_EQ(again.size(), bytes.size());
  // Over the limit, the in-memory writer falls back to the measured cut.
  std::string cut;
  ASSERT_TRUE(exporter::SerializeXSpace(space, &cut, {bytes.size() / 2}).ok());
  EXPECT_LE(cut.size(), bytes.size() / 2);
  tensorflow::profiler::XSpace cut_parsed;
  ASSERT_TRUE(cut_parsed.ParseFromString(cut));
  EXPECT_LT(cut_parsed.planes(1).lines(1).events_size(), 3000);
  EXPECT_NE(cut_parsed.warnings(cut_parsed.warnings_size() - 1).find("over protobuf's limit"), std::string::npos);
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

// Inflates `gz` as gzip (windowBits 31) and reports whether it is exactly
// one member: the stream ends (Z_STREAM_END) at the file's last byte.
// Perfetto's importer reads only the first member of a concatenation.
bool InflateOneMember(const std::string& gz, std::string* out) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 16) != Z_OK) return false;
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  char buf[1 << 16];
  int r = Z_OK;
  while (r == Z_OK) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    r = inflate(&z, Z_NO_FLUSH);
    out->append(buf, sizeof buf - z.avail_out);
  }
  bool one = r == Z_STREAM_END && z.avail_in == 0;
  inflateEnd(&z);
  return one;
}

// A model whose JSON (~9 MB) spans many of the writer's ~1 MiB slices, with
// names longer than its formatting buffer and a counter line.
model::Space LargeSpace() {
  model::Space space = SampleSpace();
  model::Plane& host = *space.find_plane(model::kHostPlaneName);
  std::string long_name(300'000, 'n');
  for (size_t i = 0; i < long_name.size(); i += 997) long_name[i] = i % 2 ? '"' : '\x01';
  long_name += "\xe2\x9c\x93 \xc3";  // a valid and a cut UTF-8 sequence at the end
  uint32_t names[] = {host.intern_event("step"), host.intern_event("op \\ x"), host.intern_event(long_name)};
  for (int l = 0; l < 3; ++l) {
    model::Line& line = host.line_with_id(100 + l);
    line.name = "worker " + std::to_string(l);
    for (int64_t i = 0; i < 25'000; ++i) {
      model::Event e{i * 1'234'567, 1'000'000 + i, names[i == 7 || i == 20'007 ? 2 : i % 2], model::kNoStats};
      if (i % 10 == 0) {
        line.add_stat(e, host.int_stat("step_num", i));
        line.add_stat(e, host.str_stat("shape", "f32[8,128]"));
      }
      line.events.push_back(e);
    }
  }
  model::Line& counters = host.line_with_id(200);
  counters.name = "_counters_";
  for (int64_t i = 0; i < 1000; ++i) {
    model::Event e{i * 1000, 0, host.intern_event("live bytes"), model::kNoStats};
    counters.add_stat(e, host.uint_stat("bytes", static_cast<uint64_t>(i) * 4096));
    counters.events.push_back(e);
  }
  host.stats.push_back(host.uint_stat("dropped_events", 3));
  return space;
}

// Line timestamps past int64 in ps (ns since the epoch, a far-future or
// hostile file read back): event times are exact microseconds, not wrapped
// to the other end.
TEST(TraceJson, FarTimesAreExact) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  const int64_t far[] = {INT64_MAX / 1000 + 1, INT64_MIN / 1000 - 1};
  for (int i = 0; i < 2; ++i) {
    model::Line& line = host.line_with_id(i + 1);
    line.timestamp_ns = far[i];
    line.events.push_back({7, 1000, host.intern_event(i == 0 ? "future" : "past"), model::kNoStats});
  }
  nlohmann::json j = nlohmann::json::parse(exporter::TraceJsonString(space));
  std::map<std::string, double> ts;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") ts[e["name"]] = e["ts"].get<double>();
  ASSERT_EQ(ts.size(), 2u);
  EXPECT_GT(ts["future"], 9.2e12);  // INT64_MAX ps in us; wrapped, it was negative
  EXPECT_LT(ts["past"], -9.2e12);

  // ns since the epoch: to the picosecond.
  model::Space epoch;
  model::Plane& p = epoch.plane(model::kHostPlaneName);
  model::Line& line = p.line_with_id(1);
  line.timestamp_ns = 1'700'000'000'000'000'000;
  line.events.push_back({7, 1000, p.intern_event("now"), model::kNoStats});
  const std::string json = exporter::TraceJsonString(epoch);
  EXPECT_NE(json.find("\"ts\":1700000000000000.000007,"), std::string::npos) << json.substr(0, 600);
}

// The slices that worker threads deflate form one gzip member whose content
// is exactly the JSON formatted in one piece, with igzip and zlib, with one
// thread and with several.
TEST(TraceJson, GzipIsOneMemberHoldingTheWholeJson) {
  model::Space space = LargeSpace();
  const std::string json = exporter::TraceJsonString(space);
  ASSERT_GT(json.size(), 6u << 20);
  {
    nlohmann::json j = nlohmann::json::parse(json);
    size_t complete = 0, counters = 0;
    for (const auto& e : j["traceEvents"]) {
      complete += e["ph"] == "X";
      counters += e["ph"] == "C";
    }
    EXPECT_EQ(complete, 3u * 25'000 + 3);  // and SampleSpace's two host events and one GPU kernel
    EXPECT_EQ(counters, 1000u);
  }
  std::string dir = MakeTempDir();
  struct Case {
    int level;
    bool zlib;
    int threads;
  } cases[] = {{1, false, 0}, {1, false, 1}, {1, false, 4}, {3, false, 2}, {1, true, 2}, {6, false, 3}};
  std::map<std::pair<int, bool>, std::string> first_gz;  // by level and deflater
  for (const Case& c : cases) {
    SCOPED_TRACE("level " + std::to_string(c.level) + (c.zlib ? " zlib" : "") + ", threads " + std::to_string(c.threads));
    exporter::TraceJsonOptions o;
    o.gzip_level = c.level;
    o.zlib = c.zlib;
    o.threads = c.threads;
    const std::string path = dir + "/t.json.gz";
    ASSERT_TRUE(exporter::WriteTraceJsonGz(space, path, o).ok());
    std::string gz = spyglass::testing::ReadFile(path), text;
    EXPECT_TRUE(InflateOneMember(gz, &text)) << "not exactly one gzip member";
    EXPECT_EQ(text.size(), json.size());
    EXPECT_TRUE(text == json) << "the gzip content differs from the JSON formatted in one piece";
    EXPECT_LT(gz.size(), json.size() / 4);
    // Deterministic: the same bytes whatever the number of threads.
    auto [it, inserted] = first_gz.emplace(std::make_pair(c.level, c.zlib), gz);
    if (!inserted) EXPECT_TRUE(it->second == gz) << "the file depends on the number of threads";
  }
}

TEST(TraceJson, EmptyModelIsValidJson) {
  std::string dir = MakeTempDir();
  ASSERT_TRUE(exporter::WriteTraceJsonGz(model::Space{}, dir + "/e.json.gz").ok());
  std::string gz = spyglass::testing::ReadFile(dir + "/e.json.gz"), text;
  EXPECT_TRUE(InflateOneMember(gz, &text));
  EXPECT_EQ(text, exporter::TraceJsonString(model::Space{}));
  EXPECT_TRUE(nlohmann::json::parse(text)["traceEvents"].empty());
  // The one-member check itself: two members concatenated are refused.
  std::string two;
  EXPECT_FALSE(InflateOneMember(gz + gz, &two));
}

TEST(TraceJson, GzipWriteErrorsAreReported) {
  model::Space space = LargeSpace();
  if (access("/dev/full", W_OK) == 0) {  // outputs are regular files only
    Status s = exporter::WriteTraceJsonGz(space, "/dev/full");
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("not a regular file"), std::string::npos) << s.message();
  }
  // A write in the middle fails, with slices in flight on the workers: the
  // file size limit stands in for a disk that fills up. In a child process,
  // since the limit holds for the whole process.
  std::string dir = MakeTempDir();
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);  // write() fails with EFBIG instead of the signal
    rlimit limit{256 << 10, 256 << 10};
    setrlimit(RLIMIT_FSIZE, &limit);
    exporter::TraceJsonOptions o;
    o.threads = 2;
    Status s = exporter::WriteTraceJsonGz(space, dir + "/t.json.gz", o);
    _exit(!s.ok() && s.message().find("File too large") != std::string::npos ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
}

// Process identity comes from the model: the recorded process's pid (its
// process_id stat), never the pid of the process that exports (collect
// exports other hosts' and children's traces).
TEST(TraceJson, ProcessesAreLabelledWithTheirRecordedPid) {
  model::Space space = SampleSpace();
  model::Plane& host = *space.find_plane(model::kHostPlaneName);
  host.stats.push_back(host.str_stat("process_name", "trainer"));
  model::Plane& child = space.plane("/host:CPU [child]");  // the tag is not a pid
  child.stats.push_back(child.int_stat("process_id", 4242));
  child.stats.push_back(child.str_stat("process_name", "worker"));
  model::Line& line = child.line_with_id(9);
  line.events.push_back({0, 1000, child.intern_event("child_work"), model::kNoStats});
  nlohmann::json j = nlohmann::json::parse(exporter::TraceJsonString(space));
  std::map<std::string, int64_t> label_pid;
  std::set<int64_t> event_pids;
  for (const auto& e : j["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_labels") label_pid[e["args"]["labels"]] = e["pid"];
    if (e["ph"] == "X" && e["name"] == "child_work") event_pids.insert(e["pid"].get<int64_t>());
  }
  EXPECT_EQ(label_pid.count("trainer (pid 42)"), 1u) << j.dump().substr(0, 2000);
  EXPECT_EQ(label_pid.count("worker (pid 4242)"), 1u);
  EXPECT_EQ(event_pids, std::set<int64_t>{4242});
}

// One UTF-8 rule everywhere: a surrogate or an overlong form in a string
// value becomes U+FFFD in the JSON, as the model does with names (the JSON
// writer once let them through, and strict readers reject the file).
TEST(TraceJson, InvalidUtf8FormsAreReplacedByTheModelsRule) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  model::Line& line = host.line_with_id(1);
  model::Event e{0, 1000, host.intern_event("e"), model::kNoStats};
  line.add_stat(e, host.str_stat("s", "a\xed\xa0\x80" "b\xe0\x80\xaf" "c\xc3\xa9"));
  line.events.push_back(e);
  const std::string text = exporter::TraceJsonString(space);
  nlohmann::json j = nlohmann::json::parse(text);  // throws on invalid UTF-8
  std::string value;
  for (const auto& e : j["traceEvents"])
    if (e["ph"] == "X") value = e["args"]["s"];
  EXPECT_EQ(value, "a\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd" "c\xc3\xa9");
}

// The one export step writes exactly the requested formats into one
// directory, under the names each caller used to build by hand, and writes
// an XSpace received as bytes as is.
TEST(ExportStep, WritesTheRequestedFormatsIntoOneDirectory) {
  model::Space space = SampleSpace();
  exporter::OutputDir dir;
  ASSERT_TRUE(exporter::OutputDir::Open(MakeTempDir(), &dir).ok());
  exporter::ExportedFiles files;
  exporter::ExportRequest all{
      {exporter::Format::kXPlane, exporter::Format::kTraceJson, exporter::Format::kPerfettoTraceJson,
       exporter::Format::kPerfettoTrace},
      "h_1",
      {}};
  ASSERT_TRUE(exporter::Export(space, dir, all, &files).ok());
  EXPECT_EQ(files.xplane, dir.path() + "/h_1.xplane.pb");
  EXPECT_EQ(files.trace_json, dir.path() + "/h_1.trace.json.gz");
  EXPECT_EQ(files.perfetto_trace_json, dir.path() + "/perfetto_trace.json.gz");
  EXPECT_EQ(files.perfetto_trace, dir.path() + "/perfetto_trace.pb");
  EXPECT_EQ(ReadXSpace(files.xplane).planes_size(), 3);
  EXPECT_EQ(spyglass::testing::ReadFile(files.perfetto_trace), exporter::PerfettoTraceString(space));
  EXPECT_EQ(nlohmann::json::parse(spyglass::testing::ReadGzip(files.trace_json)).count("metadata"), 1u);
  // perfetto_trace.json.gz is the host's trace JSON under a second name:
  // one file (its bytes written once), "metadata" kept (Perfetto skips it).
  EXPECT_TRUE(std::filesystem::equivalent(files.perfetto_trace_json, files.trace_json));
  EXPECT_EQ(std::filesystem::hard_link_count(files.trace_json), 2u);
  // Without a host: the trace JSON of the model (collect's hosts merged).
  exporter::OutputDir merged_dir;
  ASSERT_TRUE(exporter::OutputDir::Open(MakeTempDir(), &merged_dir).ok());
  exporter::ExportedFiles merged;
  ASSERT_TRUE(
      exporter::Export(space, merged_dir, {{exporter::Format::kPerfettoTraceJson}, "", {}}, &merged).ok());
  EXPECT_EQ(spyglass::testing::ReadGzip(merged.perfetto_trace_json), spyglass::testing::ReadGzip(files.trace_json));

  exporter::ExportedFiles again;
  exporter::ExportRequest as_received{{exporter::Format::kXPlane}, "h_2", "received bytes"};
  ASSERT_TRUE(exporter::Export(space, dir, as_received, &again).ok());
  EXPECT_EQ(spyglass::testing::ReadFile(again.xplane), "received bytes");
  EXPECT_TRUE(again.trace_json.empty());
  exporter::ExportRequest bad{{exporter::Format::kXPlane}, "../x", {}};
  EXPECT_EQ(exporter::Export(space, dir, bad, &again).code(), StatusCode::kInvalidArgument);
}

// perfetto_trace.pb is encoded in slices of a line on several threads and
// written in order: the same bytes as one thread writes, slice boundaries
// inside a line and lines of overlapping events included.
TEST(PerfettoTrace, ThreadsWriteTheSameBytesAsOne) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  for (int64_t tid = 1; tid <= 2; ++tid) {
    model::Line& line = host.line_with_id(tid);
    line.name = "t" + std::to_string(tid);
    for (int64_t i = 0; i < 100000; ++i) {
      model::Event e;
      e.offset_ps = i * 1000000;
      // Every 7th overlaps the next without nesting in it (a track beside the thread).
      e.duration_ps = i % 7 == 0 ? 1500000 : 500000;
      e.metadata_id = host.intern_event("ev" + std::to_string(i % 100));
      if (i % 10 == 0) {
        model::Stat st = host.int_stat("i", i);
        line.add_stats(e, std::span<const model::Stat>(&st, 1));
      }
      line.events.push_back(e);
    }
  }
  const std::string dir = MakeTempDir();
  exporter::PerfettoTraceOptions one, four;
  one.threads = 1;
  four.threads = 4;
  ASSERT_TRUE(exporter::WritePerfettoTrace(space, dir + "/one.pb", one).ok());
  ASSERT_TRUE(exporter::WritePerfettoTrace(space, dir + "/four.pb", four).ok());
  const std::string bytes = spyglass::testing::ReadFile(dir + "/one.pb");
  EXPECT_GT(bytes.size(), 200000u * 20);
  EXPECT_TRUE(bytes == spyglass::testing::ReadFile(dir + "/four.pb"));
  EXPECT_TRUE(bytes == exporter::PerfettoTraceString(space));
}

// CPU samples of a hostile model: callers in a cycle, a node its own
// caller, callers and innermost nodes that are not in the plane, an
// annotation stack of 200k parts. The trace is written, bounded (a stack
// stops at 4096 frames, and 4096 annotations), the same with threads.
TEST(PerfettoTrace, HostileSampleStacksAreBounded) {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  auto node = [&](const std::string& fn, uint64_t parent) {
    uint32_t id = host.intern_event("cpu_stack#" + fn);
    host.event_metadata_at(id).display_name = fn;
    host.event_metadata_at(id).stats = {host.ref_stat("cpu_frame", fn), host.uint_stat("cpu_stack_parent", parent),
                                        host.ref_stat("cpu_frame_kind", "python")};
    return id;
  };
  const uint32_t a = node("cycle_a", 0), b = node("cycle_b", a);
  host.event_metadata_at(a).stats[1] = host.uint_stat("cpu_stack_parent", b);
  const uint32_t self = node("own_caller", 0);
  host.event_metadata_at(self).stats[1] = host.uint_stat("cpu_stack_parent", self);
  const uint32_t lost = node("caller_not_there", 1u << 30);
  model::Line& line = host.line_with_id((int64_t{1} << 32) + 7);
  line.name = "CPU samples";
  line.display_name = "t 7 CPU samples";
  for (uint32_t leaf : {a, b, self, lost, 0u, 999999u})
    line.events.push_back({static_cast<int64_t>(line.events.size()) * 1000000, 1000000, leaf});
  // An annotation stack of 200k parts, some runs of them an event's name:
  // bounded work and at most 4096 annotation frames.
  host.intern_event("x::x::x");
  std::string deep = "x";
  for (int i = 0; i < 200000; ++i) deep += "::x";
  model::Event annotated{static_cast<int64_t>(line.events.size()) * 1000000, 1000000, a};
  model::Stat st = host.ref_stat(model::kAnnotationStackStat, deep);
  line.add_stats(annotated, std::span<const model::Stat>(&st, 1));
  line.events.push_back(annotated);
  const std::string one = exporter::PerfettoTraceString(space);
  EXPECT_LT(one.size(), deep.size() + 64u * 1024);  // (the stack's text is interned once, as every ref)
  for (const char* fn : {"cycle_a", "cycle_b", "own_caller", "caller_not_there", "[annotation]", "x::x::x"})
    EXPECT_NE(one.find(fn), std::string::npos) << fn;
  const std::string dir = MakeTempDir();
  exporter::PerfettoTraceOptions four;
  four.threads = 4;
  ASSERT_TRUE(exporter::WritePerfettoTrace(space, dir + "/four.pb", four).ok());
  EXPECT_TRUE(one == spyglass::testing::ReadFile(dir + "/four.pb"));
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
