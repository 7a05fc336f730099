// The heap hook's cgroup limit watch (src/memory/cgroup_watch.h) against the
// kernel: a real cgroup v1 memory group with a limit (its eventfd threshold
// must fire as usage passes 90%), and the PSI trigger of /proc/pressure/memory
// for a v2-style tree. Each part is skipped, with the reason, where this
// machine does not let it be made.
#include "memory/cgroup_watch.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace spyglass::memory::heap {
namespace {

bool WriteFile(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  return static_cast<bool>(f.flush());
}

// A v2 cgroup tree in a fresh temporary directory (removed by the test):
// memory.max and memory.current as given; "" when it cannot be made.
std::string FakeV2Tree(const std::string& max, const std::string& current) {
  char tmpl[] = "/tmp/spyglass-cgroup-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) return "";
  const std::string root = tmpl;
  if (!WriteFile(root + "/memory.max", max) || !WriteFile(root + "/memory.current", current)) return "";
  return root;
}

// Child exit codes of the v1 test.
enum : int { kOk = 0, kNoMove = 10, kNoWatch, kNotEvents, kEarlyEvent, kNoEvent, kBelow90 };

int V1Child(const std::string& cg) {
  if (!WriteFile(cg + "/cgroup.procs", std::to_string(getpid()))) return kNoMove;
  CgroupWatch* w = CgroupWatch::Open();
  if (!w || w->dir() != cg) return kNoWatch;
  if (w->mode() != CgroupWatch::Mode::kV1Events) return kNotEvents;
  pollfd fds[CgroupWatch::kMaxFds];
  int n = w->PollFds(fds);
  if (poll(fds, static_cast<nfds_t>(n), 0) != 0) return kEarlyEvent;  // usage is far below 90% yet
  // Touch 1 MiB at a time, up to 98% of the limit: the kernel's threshold
  // event must come on the way (checked without waiting after each step,
  // then for up to 5 s at the end).
  const size_t mib = size_t{1} << 20, most = w->limit() / 100 * 98;
  char* mem = static_cast<char*>(mmap(nullptr, most, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  if (mem == MAP_FAILED) return kNoWatch;
  for (size_t used = 0; used + mib <= most; used += mib) {
    std::memset(mem + used, 1, mib);
    n = w->PollFds(fds);
    if (poll(fds, static_cast<nfds_t>(n), 0) > 0 && w->Check(fds, n))
      return w->usage() >= w->limit() / 10 * 9 ? kOk : kBelow90;
  }
  n = w->PollFds(fds);
  if (poll(fds, static_cast<nfds_t>(n), 5000) > 0 && w->Check(fds, n)) return kOk;
  return kNoEvent;
}

TEST(CgroupWatch, V1UsageThresholdEventFromTheKernel) {
  const std::string root = "/sys/fs/cgroup/memory";
  if (access((root + "/cgroup.event_control").c_str(), W_OK) != 0)
    GTEST_SKIP() << "no writable cgroup v1 memory hierarchy at " << root;
  const std::string cg = root + "/spyglass-watch-test-" + std::to_string(getpid());
  if (mkdir(cg.c_str(), 0755) != 0) GTEST_SKIP() << "cannot make a cgroup: " << std::strerror(errno);
  if (!WriteFile(cg + "/memory.limit_in_bytes", std::to_string(64 << 20))) {
    rmdir(cg.c_str());
    GTEST_SKIP() << "cannot set a memory limit on " << cg;
  }
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) _exit(V1Child(cg));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  rmdir(cg.c_str());
  ASSERT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), kOk) << "child step " << WEXITSTATUS(status)
                                      << " (10 move, 11 watch, 12 not events, 13 early event, 14 no event, 15 below 90%)";
}

// A v2-style tree of plain files (memory.max, memory.current): the files are
// not cgroup files, so no event is registered on them; the system's PSI
// trigger (/proc/pressure/memory) is, where the kernel accepts it, else the
// watch polls. Either way usage passing 90% is reported once until it falls
// below 80%.
TEST(CgroupWatch, V2TreePsiTriggerOrPollingAndTheThresholds) {
  const std::string root = FakeV2Tree("1000000\n", "500000\n");
  ASSERT_FALSE(root.empty());
  ASSERT_TRUE(WriteFile(root + "/memory.events", "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"));
  std::unique_ptr<CgroupWatch> w(CgroupWatch::Open(root));
  bool has_v2 = false;
  {
    std::ifstream f("/proc/self/cgroup");
    for (std::string line; std::getline(f, line);) has_v2 |= line.rfind("0::", 0) == 0;
  }
  if (!has_v2) {
    EXPECT_EQ(w, nullptr);
    std::filesystem::remove_all(root);
    GTEST_SKIP() << "this process has no cgroup v2 path in /proc/self/cgroup";
  }
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->limit(), 1000000u);
  EXPECT_EQ(w->dir(), root);
  // Is a PSI trigger accepted here? (As the watch makes it.)
  bool psi = false;
  if (int fd = open("/proc/pressure/memory", O_RDWR | O_NONBLOCK | O_CLOEXEC); fd >= 0) {
    const char trigger[] = "some 150000 2000000";
    psi = write(fd, trigger, sizeof trigger) == static_cast<ssize_t>(sizeof trigger);
    close(fd);
  }
  pollfd fds[CgroupWatch::kMaxFds];
  int n = w->PollFds(fds);
  if (psi) {
    EXPECT_EQ(w->mode(), CgroupWatch::Mode::kV2Events);
    EXPECT_EQ(w->how(), "cgroup v2 POLLPRI: a PSI trigger on /proc/pressure/memory");
    EXPECT_EQ(n, 1);
    EXPECT_EQ(w->TimeoutMs(), -1);
  } else {
    EXPECT_EQ(w->mode(), CgroupWatch::Mode::kPolling) << "no PSI trigger accepted here, yet: " << w->how();
    EXPECT_EQ(n, 0);
    EXPECT_EQ(w->TimeoutMs(), 250);
  }
  for (int i = 0; i < n; ++i) fds[i].revents = 0;
  EXPECT_FALSE(w->Check(fds, n));  // 50%
  ASSERT_TRUE(WriteFile(root + "/memory.current", "950000\n"));
  EXPECT_TRUE(w->Check(fds, n));  // passed 90%
  EXPECT_EQ(w->usage(), 950000u);
  EXPECT_FALSE(w->Check(fds, n));  // still above: once
  ASSERT_TRUE(WriteFile(root + "/memory.current", "850000\n"));
  EXPECT_FALSE(w->Check(fds, n));
  ASSERT_TRUE(WriteFile(root + "/memory.current", "950000\n"));
  EXPECT_FALSE(w->Check(fds, n));  // never fell below 80%
  ASSERT_TRUE(WriteFile(root + "/memory.current", "700000\n"));
  EXPECT_FALSE(w->Check(fds, n));
  ASSERT_TRUE(WriteFile(root + "/memory.current", "990000\n"));
  EXPECT_TRUE(w->Check(fds, n));  // re-armed below 80%
  w.reset();
  std::filesystem::remove_all(root);
}

// No limit anywhere: no watch (and no snapshot thread in the hook).
TEST(CgroupWatch, NoLimitNoWatch) {
  const std::string root = FakeV2Tree("max\n", "500000\n");
  ASSERT_FALSE(root.empty());
  EXPECT_EQ(CgroupWatch::Open(root), nullptr);
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace spyglass::memory::heap
