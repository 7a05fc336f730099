#include "sinks/perfetto_link.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <mutex>
#include <string_view>
#include <thread>

namespace spyglass::sinks {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kTick = std::chrono::milliseconds(100);    // how often waits re-check Ctrl-C / deadline
constexpr auto kHeadTimeout = std::chrono::seconds(5);    // a client must send its request head by then
constexpr auto kStallTimeout = std::chrono::seconds(30);  // ... and must not stop reading for longer
constexpr auto kLingerTimeout = std::chrono::seconds(1);  // draining the client after our response
constexpr size_t kMaxHead = 8 * 1024;
constexpr Clock::time_point kNever = Clock::time_point::max();

class Fd {  // owns a file descriptor
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { if (fd_ >= 0) ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// Result of one step of serving. kDrop: this connection is over (peer gone,
// too slow); the others end the whole call.
enum class Step { kReady, kDrop, kInterrupted, kDeadline, kFileError };

struct Server {
  int file_fd;
  std::string name;  // basename of the trace file
  Clock::time_point deadline;
  int timeout_s;
  const std::function<bool()>* cancelled;  // may be empty
};

// The cancellation hook of the call being served (one per thread).
thread_local const std::function<bool()>* t_cancelled = nullptr;

Status StopStatus(Step step, const Server& s) {
  switch (step) {
    case Step::kInterrupted:
      return CancelledError("stopped waiting for ui.perfetto.dev to fetch " + s.name + " (cancelled)");
    case Step::kDeadline:
      return DeadlineExceededError(s.name + " was not fetched within the timeout of " +
                                   std::to_string(s.timeout_s) + " s");
    case Step::kFileError:
      return InternalError("reading " + s.name + " failed while serving it (was it modified?)");
    default:
      return Status::Ok();
  }
}

// Waits for `events` on `fd` until `until`, in ticks, so that the caller's
// cancellation hook and the call's deadline are seen while nothing happens.
Step WaitFor(int fd, short events, Clock::time_point until, Clock::time_point deadline) {
  for (;;) {
    if (t_cancelled && *t_cancelled && (*t_cancelled)()) return Step::kInterrupted;
    const auto now = Clock::now();
    if (now >= deadline) return Step::kDeadline;
    if (now >= until) return Step::kDrop;
    const auto left = std::min({until, deadline, now + kTick}) - now;
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count()));
    if (r > 0) return Step::kReady;  // also POLLHUP/POLLERR: the next recv/send reports those
    if (r < 0 && errno != EINTR) return Step::kDrop;
  }
}

Step SendAll(int fd, const char* data, size_t n, Clock::time_point deadline) {
  auto stall = Clock::now() + kStallTimeout;
  while (n > 0) {
    // MSG_NOSIGNAL: a dead peer gives EPIPE instead of killing us with SIGPIPE.
    const ssize_t r = ::send(fd, data, n, MSG_NOSIGNAL);
    if (r > 0) {
      data += r;
      n -= static_cast<size_t>(r);
      stall = Clock::now() + kStallTimeout;
    } else if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Step w = WaitFor(fd, POLLOUT, stall, deadline); w != Step::kReady) return w;
    } else if (!(r < 0 && errno == EINTR)) {
      return Step::kDrop;  // EPIPE, ECONNRESET, ...
    }
  }
  return Step::kReady;
}

Step SendFile(int fd, const Server& s, off_t size) {
  char buf[64 * 1024];
  for (off_t offset = 0; offset < size;) {
    const ssize_t r = ::pread(s.file_fd, buf, std::min<off_t>(sizeof buf, size - offset), offset);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return Step::kFileError;  // error, or the file shrank below Content-Length
    if (Step w = SendAll(fd, buf, static_cast<size_t>(r), s.deadline); w != Step::kReady) return w;
    offset += r;
  }
  return Step::kReady;
}

// Reads the request head. kReady: `head` holds a complete head, or something
// malformed to answer with 400 (over kMaxHead, or cut short by the client).
Step ReadHead(int fd, std::string& head, Clock::time_point deadline) {
  const auto until = Clock::now() + kHeadTimeout;
  char buf[2048];
  while (head.size() < kMaxHead && head.find("\r\n\r\n") == std::string::npos &&
         head.find("\n\n") == std::string::npos) {
    if (Step w = WaitFor(fd, POLLIN, until, deadline); w != Step::kReady) return w;
    const ssize_t r = ::recv(fd, buf, std::min(sizeof buf, kMaxHead - head.size()), 0);
    if (r > 0) {
      head.append(buf, static_cast<size_t>(r));
    } else if (r == 0) {
      return head.empty() ? Step::kDrop : Step::kReady;  // a connect-and-close needs no answer
    } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Step::kDrop;
    }
  }
  return Step::kReady;
}

// Splits "METHOD SP target SP HTTP/1.x" out of a complete head; false if malformed.
bool ParseRequest(const std::string& head, std::string& method, std::string& target) {
  if (head.find("\r\n\r\n") == std::string::npos && head.find("\n\n") == std::string::npos) return false;
  std::string_view line(head.data(), head.find_first_of("\r\n"));
  const size_t a = line.find(' ');
  const size_t b = a == line.npos ? line.npos : line.find(' ', a + 1);
  if (a == 0 || b == line.npos || b == a + 1 || line.find(' ', b + 1) != line.npos) return false;
  if (line.substr(b + 1).substr(0, 7) != "HTTP/1.") return false;
  method = line.substr(0, a);
  target = line.substr(a + 1, b - a - 1);
  const auto is_upper = [](char c) { return c >= 'A' && c <= 'Z'; };
  const auto is_ctl = [](char c) { return static_cast<unsigned char>(c) < 0x21 || c == 0x7f; };
  return std::all_of(method.begin(), method.end(), is_upper) &&
         std::none_of(target.begin(), target.end(), is_ctl);
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// True iff `target` names the trace: "/<name>", percent-encoded or not, any
// ?query ignored. Only the single open file is ever served, so decoding cannot
// reach another one ("/%2e%2e/x" decodes to "/../x", which is not "/<name>").
bool IsTracePath(std::string_view target, const std::string& name) {
  target = target.substr(0, target.find('?'));
  std::string decoded;
  for (size_t i = 0; i < target.size(); ++i) {
    if (target[i] != '%') { decoded += target[i]; continue; }
    if (i + 2 >= target.size()) return false;  // truncated escape
    const int hi = HexValue(target[i + 1]), lo = HexValue(target[i + 2]);
    if (hi < 0 || lo < 0) return false;
    decoded += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return decoded.size() == name.size() + 1 && decoded[0] == '/' && decoded.compare(1, name.size(), name) == 0;
}

std::string PercentEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

// Every response carries the CORS header that lets ui.perfetto.dev read it.
std::string ResponseHead(const std::string& status, const std::string& headers) {
  return "HTTP/1.1 " + status + "\r\nAccess-Control-Allow-Origin: *\r\n" + headers + "Connection: close\r\n\r\n";
}

std::string TextResponse(const std::string& status) {
  const std::string body = status + "\n";
  return ResponseHead(status, "Content-Type: text/plain\r\nContent-Length: " + std::to_string(body.size()) +
                                  "\r\n") + body;
}

// Answers one request. kReady: answered (`served` if it was a complete GET of
// the trace); kDrop: connection abandoned; others end the call.
Step HandleConnection(int fd, const Server& s, bool& served) {
  std::string head, method, target;
  if (Step w = ReadHead(fd, head, s.deadline); w != Step::kReady) return w;
  std::string response;
  off_t body_size = -1;  // >= 0: stream the trace after `response`
  if (!ParseRequest(head, method, target)) {
    response = TextResponse("400 Bad Request");
  } else if (method == "OPTIONS") {
    response = ResponseHead("204 No Content",
                            "Access-Control-Allow-Methods: GET\r\nAccess-Control-Allow-Headers: *\r\n");
  } else if ((method == "GET" || method == "HEAD") && IsTracePath(target, s.name)) {
    struct stat st {};
    if (::fstat(s.file_fd, &st) != 0) return Step::kFileError;
    // Sent as stored, without Content-Encoding (a .json.gz: Perfetto gunzips
    // itself); the UI tells the formats apart by content.
    const bool json = s.name.size() >= 8 && s.name.compare(s.name.size() - 8, 8, ".json.gz") == 0;
    response = ResponseHead("200 OK", std::string("Content-Type: ") +
                                          (json ? "application/json" : "application/octet-stream") +
                                          "\r\nContent-Length: " +
                                          std::to_string(st.st_size) + "\r\n");
    if (method == "GET") body_size = st.st_size;
  } else {
    // Other paths, and POST: Perfetto UI probes port 9001 for a trace_processor
    // RPC server with POST; a 404 makes it fall back to fetching the URL.
    response = TextResponse("404 Not Found");
  }
  Step w = SendAll(fd, response.data(), response.size(), s.deadline);
  if (w == Step::kReady && body_size >= 0) {
    w = SendFile(fd, s, body_size);
    served = w == Step::kReady;
  }
  return w;
}

// Half-closes, then drains what the client still sends for a moment, so that
// closing with unread input does not send a RST that can make the client drop
// the tail of our response.
void LingeringClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  const auto until = Clock::now() + kLingerTimeout;
  char buf[4096];
  while (WaitFor(fd, POLLIN, until, kNever) == Step::kReady) {
    const ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)) break;
  }
}

Status Serve(const std::string& trace_path, const PerfettoLinkOptions& o) {
  const auto start = Clock::now();
  if (o.port < 0 || o.port > 65535) return InvalidArgumentError("invalid port " + std::to_string(o.port));
  if (o.timeout_s < 0) return InvalidArgumentError("timeout_s must be >= 0");
  const size_t slash = trace_path.find_last_of('/');
  const std::string name = slash == std::string::npos ? trace_path : trace_path.substr(slash + 1);
  if (name.empty()) return InvalidArgumentError("trace path has no file name: '" + trace_path + "'");

  Fd file(::open(trace_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (file.get() < 0) return NotFoundError("cannot open trace " + trace_path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(file.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return NotFoundError("trace " + trace_path + " is not a regular file");

  sockaddr_storage addr{};
  socklen_t addr_len = 0;
  auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, o.bind_address.c_str(), &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons(static_cast<uint16_t>(o.port));
    addr_len = sizeof *v4;
  } else if (::inet_pton(AF_INET6, o.bind_address.c_str(), &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons(static_cast<uint16_t>(o.port));
    addr_len = sizeof *v6;
  } else {
    return InvalidArgumentError("bind_address '" + o.bind_address + "' is not a numeric IP address");
  }
  Fd sock(::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) return InternalError(std::string("socket() failed: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(sock.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(sock.get(), reinterpret_cast<sockaddr*>(&addr), addr_len) != 0) {
    if (errno == EADDRINUSE) {
      return UnavailableError("port " + std::to_string(o.port) +
                              " is in use; another Perfetto link or a trace_processor_shell --httpd "
                              "may still be running there: stop it (ui.perfetto.dev expects port 9001)");
    }
    return UnavailableError("cannot bind " + o.bind_address + ":" + std::to_string(o.port) + ": " +
                            std::strerror(errno));
  }
  if (::listen(sock.get(), 16) != 0) return InternalError(std::string("listen() failed: ") + std::strerror(errno));
  addr_len = sizeof addr;
  if (::getsockname(sock.get(), reinterpret_cast<sockaddr*>(&addr), &addr_len) != 0)
    return InternalError(std::string("getsockname() failed: ") + std::strerror(errno));
  const int port = ntohs(addr.ss_family == AF_INET ? v4->sin_port : v6->sin6_port);

  // The page must be pointed at a loopback address it can reach (JAX: 127.0.0.1).
  std::string host = o.bind_address;
  if (host == "0.0.0.0" || host == "::") host = "127.0.0.1";
  else if (addr.ss_family == AF_INET6) host = "[" + host + "]";

  std::ostream& out = o.out != nullptr ? *o.out : std::cout;
  out << "Open URL in browser: https://ui.perfetto.dev/#!/?url=http://" << host << ":" << port << "/"
      << PercentEncode(name) << std::endl;
  out << "(served once; waiting "
      << (o.timeout_s > 0 ? "up to " + std::to_string(o.timeout_s) + " s" : std::string("without a time limit"))
      << " for the browser. The files are already written: stopping the wait or the program loses nothing.)"
      << std::endl;
  if (o.on_listening) o.on_listening(port);

  const Server server{file.get(), name, o.timeout_s > 0 ? start + std::chrono::seconds(o.timeout_s) : kNever,
                      o.timeout_s, &o.cancelled};
  struct HookScope {  // this call's hook, for WaitFor
    explicit HookScope(const std::function<bool()>* h) { t_cancelled = h; }
    ~HookScope() { t_cancelled = nullptr; }
  } hook(server.cancelled);
  for (;;) {  // one connection at a time, as Python's HTTPServer
    if (Step w = WaitFor(sock.get(), POLLIN, kNever, server.deadline); w != Step::kReady)
      return StopStatus(w, server);
    const int c = ::accept4(sock.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c < 0) {
      // Out of fds/memory: back off instead of spinning on a listener that stays readable.
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
        std::this_thread::sleep_for(kTick);
      continue;
    }
    Fd conn(c);
    bool served = false;
    const Step step = HandleConnection(conn.get(), server, served);
    if (step == Step::kReady) LingeringClose(conn.get());
    if (served) return Status::Ok();
    if (step != Step::kReady && step != Step::kDrop) return StopStatus(step, server);
  }
}

}  // namespace

Status ServePerfettoTrace(const std::string& trace_path, const PerfettoLinkOptions& options) {
  try {  // bad_alloc, or an exception from `out` / `on_listening`: report, never throw
    return Serve(trace_path, options);
  } catch (const std::exception& e) {
    return InternalError(std::string("serving the Perfetto link failed: ") + e.what());
  } catch (...) {
    return InternalError("serving the Perfetto link failed");
  }
}

}  // namespace spyglass::sinks
