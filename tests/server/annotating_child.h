// annotating_server (tests/server/annotating_server.cc) as a child process
// for the server tests: spawned with a free port, its "PORT <n>" line read
// back; killed on destruction. ANNOTATING_SERVER is the binary's path (a
// compile definition of the tests that use it).
#pragma once

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace spyglass::testing {

// Runs `annotating_server 0 --seconds 60 <extra...>`.
class AnnotatingChild {
 public:
  explicit AnnotatingChild(std::vector<std::string> extra = {}) {
    int fds[2];
    EXPECT_EQ(pipe(fds), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    std::vector<std::string> args = {ANNOTATING_SERVER, "0", "--seconds", "60"};
    for (auto& e : extra) args.push_back(e);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(posix_spawn(&pid_, ANNOTATING_SERVER, &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    std::string out;
    char c;
    while (read(fds[0], &c, 1) == 1 && c != '\n') out.push_back(c);
    close(fds[0]);
    if (out.rfind("PORT ", 0) == 0) port_ = std::stoi(out.substr(5));
    EXPECT_GT(port_, 0) << "child said: " << out;
  }
  ~AnnotatingChild() { Kill(); }
  void Kill() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
      pid_ = 0;
    }
  }
  int pid() const { return pid_; }
  int port() const { return port_; }

 private:
  pid_t pid_ = 0;
  int port_ = 0;
};

}  // namespace spyglass::testing
