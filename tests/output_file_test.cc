// The one file-creation path (export/output_file.h) and run directories
// (export/log_dir.h): no output is written through a planted symbolic or hard
// link, a failed write leaves no partial file, and run names do not run out.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "export/log_dir.h"
#include "export/output_file.h"
#include "export/trace_json/trace_json_writer.h"
#include "export/xplane/xplane_writer.h"
#include "model/xspace.h"
#include "spyglass/memory.h"
#include "test_util.h"

namespace spyglass {
namespace {

namespace fs = std::filesystem;
using spyglass::testing::MakeTempDir;
using spyglass::testing::ReadFile;

void Put(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr) << path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
}

model::Space OneEventSpace() {
  model::Space space;
  model::Plane& host = space.plane(model::kHostPlaneName);
  host.line_with_id(1).events.push_back({0, 1000, host.intern_event("e"), model::kNoStats});
  return space;
}

// Every writer, by path.
std::vector<std::pair<std::string, std::function<Status(const std::string&)>>> Writers() {
  return {
      {"WriteXSpaceFile", [](const std::string& p) { return exporter::WriteXSpaceFile(OneEventSpace(), p); }},
      {"WriteTraceJsonGz", [](const std::string& p) { return exporter::WriteTraceJsonGz(OneEventSpace(), p); }},
      {"WriteOutputFile", [](const std::string& p) {
         return exporter::WriteOutputFile(p, [](int fd) { return write(fd, "data", 4) == 4 ? 0 : errno; });
       }},
      {"save_device_memory_profile", [](const std::string& p) { return profiler::save_device_memory_profile(p); }},
  };
}

TEST(OutputFile, LinksAtTheNameAreNeverWrittenThrough) {
  for (const auto& [what, write] : Writers()) {
    std::string dir = MakeTempDir(), outside = MakeTempDir("spyglass-outside");
    Put(outside + "/precious", "precious");
    fs::create_symlink(outside + "/precious", dir + "/out");
    Status s = write(dir + "/out");
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << what << ": " << s.ToString();
    EXPECT_EQ(ReadFile(outside + "/precious"), "precious") << what;
    // A dangling link: nothing is created at its target either.
    fs::create_symlink(outside + "/new", dir + "/dangling");
    EXPECT_FALSE(write(dir + "/dangling").ok()) << what;
    EXPECT_FALSE(fs::exists(outside + "/new")) << what;
    // A hard link to a file outside: the name is replaced, the file kept.
    fs::create_hard_link(outside + "/precious", dir + "/hard");
    EXPECT_TRUE(write(dir + "/hard").ok()) << what;
    EXPECT_EQ(ReadFile(outside + "/precious"), "precious") << what;
    EXPECT_NE(ReadFile(dir + "/hard"), "precious") << what;
  }
}

TEST(OutputFile, AFailedWriteLeavesTheOldFileAndNoPartialOne) {
  std::string dir = MakeTempDir();
  Put(dir + "/kept", "old");
  Status s = exporter::WriteOutputFile(dir + "/kept", [](int fd) { return write(fd, "par", 3) == 3 ? EIO : errno; });
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_NE(s.message().find("cannot write " + dir + "/kept"), std::string::npos) << s.ToString();
  EXPECT_EQ(ReadFile(dir + "/kept"), "old");
  s = exporter::WriteOutputFile(dir + "/new", [](int) { return ENOSPC; });
  EXPECT_FALSE(s.ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"kept"});  // no temporary left behind
}

TEST(OutputFile, NamesMustBePlain) {
  std::string dir = MakeTempDir();
  exporter::OutputDir out;
  ASSERT_TRUE(exporter::OutputDir::Open(dir, &out).ok());
  for (const std::string& bad : {std::string(), std::string("."), std::string(".."), std::string("../x"),
                                 std::string("a/b"), std::string("x\0y", 3)}) {
    Status s = out.WriteBytes(bad, "x");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_TRUE(fs::is_empty(dir));
  EXPECT_TRUE(out.WriteBytes("ok", "x").ok());
  // A directory or a device at the name is refused as well.
  fs::create_directory(dir + "/d");
  EXPECT_EQ(out.WriteBytes("d", "x").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(exporter::WriteOutputBytes(dir + "/", "x").ok());
}

ino_t InodeOf(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// A second name of a file is a hard link (its bytes written once), made
// without following a link at either name, replacing a regular file there.
TEST(OutputFile, LinkOrCopyMakesASecondNameOfTheSameBytes) {
  std::string dir = MakeTempDir(), outside = MakeTempDir("spyglass-outside");
  exporter::OutputDir out;
  ASSERT_TRUE(exporter::OutputDir::Open(dir, &out).ok());
  ASSERT_TRUE(out.WriteBytes("a", "bytes").ok());
  ASSERT_TRUE(out.LinkOrCopy("a", "b").ok());
  EXPECT_EQ(InodeOf(dir + "/b"), InodeOf(dir + "/a"));
  EXPECT_EQ(fs::hard_link_count(dir + "/a"), 2u);
  // Again, onto the name it already is: still one file, no temporary left.
  ASSERT_TRUE(out.LinkOrCopy("a", "b").ok());
  EXPECT_EQ(fs::hard_link_count(dir + "/a"), 2u);
  // A hard link to a file outside at the name: replaced, the file kept.
  Put(outside + "/precious", "precious");
  fs::create_hard_link(outside + "/precious", dir + "/hard");
  ASSERT_TRUE(out.LinkOrCopy("a", "hard").ok());
  EXPECT_EQ(InodeOf(dir + "/hard"), InodeOf(dir + "/a"));
  EXPECT_EQ(ReadFile(outside + "/precious"), "precious");
  // A symbolic link planted at the name (or dangling there) is refused.
  fs::create_symlink(outside + "/precious", dir + "/planted");
  Status s = out.LinkOrCopy("a", "planted");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_symlink(dir + "/planted"));
  EXPECT_EQ(ReadFile(outside + "/precious"), "precious");
  fs::create_symlink(outside + "/new", dir + "/dangling");
  EXPECT_EQ(out.LinkOrCopy("a", "dangling").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(outside + "/new"));
  // The existing name must be a regular file itself, not a link to one.
  fs::create_symlink(outside + "/precious", dir + "/via");
  EXPECT_EQ(out.LinkOrCopy("via", "c").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir + "/c"));
  EXPECT_EQ(fs::hard_link_count(outside + "/precious"), 1u);  // "hard" was replaced, not written through
  EXPECT_EQ(out.LinkOrCopy("../x", "c").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out.LinkOrCopy("a", "x/c").code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(out.LinkOrCopy("missing", "c").ok());
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  EXPECT_EQ(names, (std::set<std::string>{"a", "b", "hard", "planted", "dangling", "via"}));
}

// Writes through directories that are links are refused below the base.
TEST(OutputFile, OpenBelowRefusesLinkedDirectories) {
  std::string base = MakeTempDir(), outside = MakeTempDir("spyglass-outside");
  fs::create_symlink(outside, base + "/linked");
  exporter::OutputDir dir;
  Status s = exporter::OutputDir::OpenBelow(base, {"linked", "x"}, &dir);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_empty(outside));
  std::vector<std::string> created;
  ASSERT_TRUE(exporter::OutputDir::OpenBelow(base + "/new", {"a", "b"}, &dir, &created).ok());
  EXPECT_EQ(created, (std::vector<std::string>{base + "/new", base + "/new/a", base + "/new/a/b"}));
  EXPECT_EQ(dir.path(), base + "/new/a/b");
}

TEST(RunDir, LinkedPluginsOrProfileDirectoriesAreRefused) {
  std::string outside = MakeTempDir("spyglass-outside");
  std::string log = MakeTempDir();
  fs::create_symlink(outside, log + "/plugins");
  std::string run;
  Status s = exporter::MakeRunDir(log, "", &run);
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  std::string log2 = MakeTempDir();
  fs::create_directory(log2 + "/plugins");
  fs::create_directory(log2 + "/plugins/profile");
  fs::create_symlink(outside, log2 + "/plugins/profile/named");
  s = exporter::MakeRunDir(log2, "named", &run);
  EXPECT_NE(s.message().find("symbolic link"), std::string::npos) << s.ToString();
  EXPECT_TRUE(fs::is_empty(outside));
}

// Item 18: the first 1000 names of this second are taken (by another
// process, say), then 1500 runs start in a tight loop: each gets its own
// directory.
TEST(RunDir, NamesDoNotRunOut) {
  std::string log = MakeTempDir();
  fs::create_directories(log + "/plugins/profile");
  time_t now = time(nullptr);
  struct tm tm;
  localtime_r(&now, &tm);
  char base[32];
  strftime(base, sizeof base, "%Y_%m_%d_%H_%M_%S", &tm);
  for (int i = 0; i < 1000; ++i)
    mkdir((log + "/plugins/profile/" + base + (i ? "_" + std::to_string(i) : "")).c_str(), 0755);
  std::set<std::string> names;
  for (int i = 0; i < 1500; ++i) {
    std::string run;
    Status s = exporter::MakeRunDir(log, "", &run);
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
    EXPECT_TRUE(fs::is_empty(run));
    names.insert(run);
  }
  EXPECT_EQ(names.size(), 1500u);
}

TEST(RunDir, RemoveIfEmptyRemovesOnlyWhatItMade) {
  std::string log = MakeTempDir();
  exporter::RunDir run;
  ASSERT_TRUE(exporter::MakeRunDir(log + "/logs", "", &run).ok());
  EXPECT_EQ(run.created.size(), 4u);  // logs, plugins, profile, the run
  exporter::RemoveIfEmpty(run);
  EXPECT_TRUE(fs::is_empty(log));
  ASSERT_TRUE(exporter::MakeRunDir(log, "s", &run).ok());
  ASSERT_TRUE(run.dir.WriteBytes("file", "x").ok());
  exporter::RemoveIfEmpty(run);  // not empty: kept
  EXPECT_TRUE(fs::exists(log + "/plugins/profile/s/file"));
}

}  // namespace
}  // namespace spyglass
