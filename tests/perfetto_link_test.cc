#include "sinks/perfetto_link.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>

namespace spyglass::sinks {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr char kName[] = "perfetto_trace.json.gz";

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "perfetto_link_test.XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Gzip magic, a NUL, then enough pseudo-random bytes to fill the socket
// buffers, so the server goes through partial writes and EAGAIN.
std::string TraceBytes(size_t size = 3 * 1024 * 1024 + 17) {
  std::string bytes("\x1f\x8b\x08\x00", 4);
  std::mt19937 rng(42);
  while (bytes.size() < size) bytes += static_cast<char>(rng());
  return bytes;
}

std::string WriteFile(const fs::path& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
  return path.string();
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval tv{10, 0};  // a hung server fails the test instead of hanging it
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  return fd;
}

struct Response {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;
};

// Sends `request` verbatim (then half-closes if `shut_wr`) and reads the
// response up to EOF.
Response Http(int port, const std::string& request, bool shut_wr = false) {
  const int fd = Connect(port);
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t r = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (r <= 0) break;
    sent += static_cast<size_t>(r);
  }
  if (shut_wr) ::shutdown(fd, SHUT_WR);
  std::string raw;
  char buf[65536];
  for (ssize_t r; (r = ::recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, static_cast<size_t>(r));
  ::close(fd);
  Response response;
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos || raw.compare(0, 9, "HTTP/1.1 ") != 0) return response;
  response.status = std::atoi(raw.c_str() + 9);
  response.head = raw.substr(0, end + 2);
  response.body = raw.substr(end + 4);
  return response;
}

Response Get(int port, const std::string& target, const std::string& method = "GET") {
  return Http(port, method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: https://ui.perfetto.dev\r\n\r\n");
}

// Runs ServePerfettoTrace on a free port in a thread.
class ServerThread {
 public:
  explicit ServerThread(const std::string& path, int timeout_s = 30) {
    PerfettoLinkOptions options;
    options.port = 0;
    options.timeout_s = timeout_s;  // a safety net: a broken server fails the test, never hangs it
    options.out = &out_;
    options.on_listening = [this](int port) {
      std::lock_guard<std::mutex> lock(mu_);
      port_ = port;
      cv_.notify_all();
    };
    thread_ = std::thread([this, path, options] {
      Status status = ServePerfettoTrace(path, options);
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      done_ = true;
      cv_.notify_all();
    });
  }
  ~ServerThread() { thread_.join(); }

  int port() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, 10s, [this] { return port_ != 0 || done_; });
    return port_;
  }
  bool DoneWithin(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [this] { return done_; });
  }
  Status Join() {
    thread_.join();
    thread_ = std::thread([] {});
    return status_;
  }
  std::string printed() const { return out_.str(); }  // only after Join()

 private:
  std::ostringstream out_;
  std::mutex mu_;
  std::condition_variable cv_;
  int port_ = 0;
  bool done_ = false;
  Status status_;
  std::thread thread_;
};

bool HasHeader(const Response& r, const std::string& header) {
  return r.head.find("\r\n" + header + "\r\n") != std::string::npos;
}

TEST(PerfettoLinkTest, ServesTheTraceOnceWithCorsAndPrintsTheLink) {
  TempDir dir;
  const std::string bytes = TraceBytes();
  ServerThread server(WriteFile(dir.path() / kName, bytes));
  const int port = server.port();
  ASSERT_NE(port, 0);

  const Response r = Get(port, std::string("/") + kName);
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(HasHeader(r, "Access-Control-Allow-Origin: *")) << r.head;
  EXPECT_TRUE(HasHeader(r, "Content-Type: application/json")) << r.head;
  EXPECT_TRUE(HasHeader(r, "Content-Length: " + std::to_string(bytes.size()))) << r.head;
  EXPECT_EQ(r.head.find("Content-Encoding"), std::string::npos) << r.head;
  EXPECT_TRUE(r.body == bytes) << "body differs: " << r.body.size() << " vs " << bytes.size() << " bytes";

  const Status status = server.Join();
  EXPECT_TRUE(status.ok()) << status.message();
  // JAX's line first, as it prints it; then how long the wait lasts.
  const std::string printed = server.printed();
  const std::string first = printed.substr(0, printed.find('\n') + 1);
  EXPECT_EQ(first, "Open URL in browser: https://ui.perfetto.dev/#!/?url=http://127.0.0.1:" + std::to_string(port) +
                       "/" + kName + "\n");
  EXPECT_NE(printed.find("waiting up to 30 s", first.size()), std::string::npos) << printed;
}

// The native trace (what stop_trace serves now): the same, as binary.
TEST(PerfettoLinkTest, ServesTheNativeTraceAsBinary) {
  TempDir dir;
  const std::string bytes = "\x0a\x02\x50\x01" + TraceBytes(100000);
  ServerThread server(WriteFile(dir.path() / "perfetto_trace.pb", bytes));
  const int port = server.port();
  ASSERT_NE(port, 0);
  const Response r = Get(port, "/perfetto_trace.pb");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(HasHeader(r, "Content-Type: application/octet-stream")) << r.head;
  EXPECT_TRUE(HasHeader(r, "Access-Control-Allow-Origin: *")) << r.head;
  EXPECT_TRUE(r.body == bytes);
  EXPECT_TRUE(server.Join().ok());
  EXPECT_NE(server.printed().find("url=http://127.0.0.1:" + std::to_string(port) + "/perfetto_trace.pb\n"),
            std::string::npos)
      << server.printed();
}

TEST(PerfettoLinkTest, OtherPathsAndMethodsGet404AndTheServerKeepsWaiting) {
  TempDir dir;
  WriteFile(dir.path() / "other.json", "secret");
  const std::string bytes = TraceBytes(1000);
  ServerThread server(WriteFile(dir.path() / kName, bytes));
  const int port = server.port();
  ASSERT_NE(port, 0);

  for (const char* target : {"/../etc/passwd", "/%2e%2e/etc/passwd", "/", "/other.json", "/etc/passwd",
                             "/%2F..%2Fother.json", "/perfetto_trace.json.gz/..", "//perfetto_trace.json.gz",
                             "/perfetto_trace.json.gz%00", "/perfetto_trace.json.gz%"}) {
    const Response r = Get(port, target);
    EXPECT_EQ(r.status, 404) << target;
    EXPECT_TRUE(HasHeader(r, "Access-Control-Allow-Origin: *")) << r.head;
    EXPECT_EQ(r.body.find("secret"), std::string::npos);
    EXPECT_EQ(r.body.find("root:"), std::string::npos);
  }
  // Perfetto UI's trace_processor RPC probe, with a body we never read.
  EXPECT_EQ(Http(port, "POST /status HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello").status, 404);
  EXPECT_EQ(Get(port, std::string("/") + kName, "POST").status, 404);
  EXPECT_EQ(Get(port, std::string("/") + kName, "DELETE").status, 404);
  EXPECT_FALSE(server.DoneWithin(200ms));

  // The right GET, with a query, ends it.
  const Response r = Get(port, std::string("/") + kName + "?cache=no");
  EXPECT_EQ(r.status, 200);
  EXPECT_TRUE(r.body == bytes);
  const Status status = server.Join();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(PerfettoLinkTest, HeadOptionsAndMalformedRequestsDoNotEndTheWait) {
  TempDir dir;
  const std::string bytes = TraceBytes(1000);
  ServerThread server(WriteFile(dir.path() / kName, bytes));
  const int port = server.port();
  ASSERT_NE(port, 0);

  const Response head = Get(port, std::string("/") + kName, "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_TRUE(HasHeader(head, "Content-Length: 1000")) << head.head;
  EXPECT_TRUE(head.body.empty());

  const Response options = Get(port, std::string("/") + kName, "OPTIONS");
  EXPECT_EQ(options.status, 204);
  EXPECT_TRUE(HasHeader(options, "Access-Control-Allow-Origin: *")) << options.head;

  EXPECT_EQ(Http(port, "garbage\r\n\r\n").status, 400);
  EXPECT_EQ(Http(port, "GET /perfetto_trace.json.gz\r\n\r\n").status, 400);       // no version
  EXPECT_EQ(Http(port, "GET  /perfetto_trace.json.gz HTTP/1.1\r\n\r\n").status, 400);
  EXPECT_EQ(Http(port, "GET /perfetto_trace.json.gz SPDY/3\r\n\r\n").status, 400);
  EXPECT_EQ(Http(port, "GET /perfetto_trace.json.gz HTTP/1.1\r\nX: " + std::string(9000, 'x')).status,
            400);  // head too large
  EXPECT_EQ(Http(port, "GET /perfetto_trace.json.gz HTTP/1.1\r\nHost", /*shut_wr=*/true).status,
            400);  // cut short by the client
  EXPECT_FALSE(server.DoneWithin(200ms));

  EXPECT_EQ(Get(port, std::string("/") + kName).status, 200);
  const Status status = server.Join();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(PerfettoLinkTest, SilentClientsDoNotHangTheServer) {
  TempDir dir;
  ServerThread server(WriteFile(dir.path() / kName, TraceBytes(100)));
  const int port = server.port();
  ASSERT_NE(port, 0);

  ::close(Connect(port));  // connects, sends nothing, disconnects
  const int idle = Connect(port);  // connects and sends nothing: dropped after the head timeout
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Get(port, std::string("/") + kName).status, 200);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 9s);
  ::close(idle);
  const Status status = server.Join();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(PerfettoLinkTest, ClientThatHangsUpMidTransferDoesNotKillTheServer) {
  TempDir dir;
  const std::string bytes = TraceBytes(8 * 1024 * 1024);
  ServerThread server(WriteFile(dir.path() / kName, bytes));
  const int port = server.port();
  ASSERT_NE(port, 0);

  const int fd = Connect(port);
  const std::string request = std::string("GET /") + kName + " HTTP/1.1\r\n\r\n";
  ASSERT_EQ(::send(fd, request.data(), request.size(), MSG_NOSIGNAL), static_cast<ssize_t>(request.size()));
  char buf[1024];
  EXPECT_GT(::recv(fd, buf, sizeof buf, 0), 0);
  ::close(fd);  // with unread data: a RST, so the server sees EPIPE/ECONNRESET
  EXPECT_FALSE(server.DoneWithin(300ms));

  EXPECT_TRUE(Get(port, std::string("/") + kName).body == bytes);
  const Status status = server.Join();
  EXPECT_TRUE(status.ok()) << status.message();
}

TEST(PerfettoLinkTest, TimeoutWithoutClientIsDeadlineExceeded) {
  TempDir dir;
  const std::string path = WriteFile(dir.path() / kName, TraceBytes(100));
  PerfettoLinkOptions options;
  options.port = 0;
  options.timeout_s = 1;
  std::ostringstream out;
  options.out = &out;
  const auto start = std::chrono::steady_clock::now();
  const Status status = ServePerfettoTrace(path, options);
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(status.message().find("timeout"), std::string::npos) << status.message();
  EXPECT_GE(elapsed, 900ms);
  EXPECT_LT(elapsed, 3s);
}

TEST(PerfettoLinkTest, PortInUseIsUnavailableNamingThePort) {
  TempDir dir;
  const std::string path = WriteFile(dir.path() / kName, TraceBytes(100));
  const int busy = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(busy, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(busy, 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(busy, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int port = ntohs(addr.sin_port);

  PerfettoLinkOptions options;
  options.port = port;
  std::ostringstream out;
  options.out = &out;
  const Status status = ServePerfettoTrace(path, options);
  ::close(busy);
  EXPECT_EQ(status.code(), StatusCode::kUnavailable);
  EXPECT_NE(status.message().find("port " + std::to_string(port) + " is in use"), std::string::npos)
      << status.message();
  EXPECT_TRUE(out.str().empty());
}

TEST(PerfettoLinkTest, MissingFileIsNotFoundBeforeBinding) {
  TempDir dir;
  PerfettoLinkOptions options;
  options.port = 0;
  bool listened = false;
  options.on_listening = [&](int) { listened = true; };
  std::ostringstream out;
  options.out = &out;
  const Status status = ServePerfettoTrace((dir.path() / kName).string(), options);
  EXPECT_EQ(status.code(), StatusCode::kNotFound);
  EXPECT_FALSE(listened);
  EXPECT_EQ(ServePerfettoTrace(dir.path().string(), options).code(), StatusCode::kNotFound);  // a directory
}

TEST(PerfettoLinkTest, BadOptionsAreInvalidArgument) {
  TempDir dir;
  const std::string path = WriteFile(dir.path() / kName, TraceBytes(100));
  PerfettoLinkOptions options;
  options.port = 70000;
  EXPECT_EQ(ServePerfettoTrace(path, options).code(), StatusCode::kInvalidArgument);
  options.port = 0;
  options.bind_address = "localhost";  // numeric only
  EXPECT_EQ(ServePerfettoTrace(path, options).code(), StatusCode::kInvalidArgument);
}

// The wait never touches the program's signal handling: a library that
// replaced SIGINT's handler would take Ctrl-C away from the program.
TEST(PerfettoLinkTest, NoSignalHandlerIsInstalledAndTheCancelHookEndsTheWait) {
  TempDir dir;
  struct sigaction before {};
  ASSERT_EQ(::sigaction(SIGINT, nullptr, &before), 0);
  std::atomic<bool> cancel{false};
  std::atomic<bool> handler_changed{false};
  PerfettoLinkOptions options;
  options.port = 0;
  options.timeout_s = 30;  // safety net
  std::ostringstream out;
  options.out = &out;
  options.on_listening = [&](int) {
    struct sigaction during {};
    ::sigaction(SIGINT, nullptr, &during);
    handler_changed = during.sa_handler != before.sa_handler;
    cancel = true;
  };
  options.cancelled = [&] { return cancel.load(); };
  const Status status = ServePerfettoTrace(WriteFile(dir.path() / kName, TraceBytes(100)), options);
  EXPECT_EQ(status.code(), StatusCode::kCancelled) << status.ToString();
  EXPECT_FALSE(handler_changed.load()) << "SIGINT's handler was replaced while waiting";
}

// stop_trace must not block forever by default, and says how long it waits.
TEST(PerfettoLinkTest, TheWaitIsBoundedByDefaultAndSaysSo) {
  EXPECT_GT(PerfettoLinkOptions{}.timeout_s, 0);
  EXPECT_EQ(profiler::TraceOptions{}.perfetto_link_timeout_s, PerfettoLinkOptions{}.timeout_s);
  TempDir dir;
  ServerThread server(WriteFile(dir.path() / kName, TraceBytes(100)), 1);
  const Status status = server.Join();
  EXPECT_EQ(status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(server.printed().find("waiting up to 1 s"), std::string::npos) << server.printed();
}

}  // namespace
}  // namespace spyglass::sinks
