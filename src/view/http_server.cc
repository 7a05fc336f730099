#include "view/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace spyglass::view {
namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

void WriteAll(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    data.remove_prefix(static_cast<size_t>(n));
  }
}

void Respond(int fd, const HttpResponse& r) {
  std::string head = "HTTP/1.1 " + std::to_string(r.status) + " " + Reason(r.status) + "\r\n";
  head += "Content-Type: " + r.content_type + "\r\nContent-Length: " + std::to_string(r.body.size()) +
          "\r\nConnection: close\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
          "Referrer-Policy: no-referrer\r\n\r\n";
  WriteAll(fd, head);
  WriteAll(fd, r.body);
}

HttpResponse Error(int status, std::string why) { return {status, "text/plain; charset=utf-8", std::move(why) + "\n"}; }

int Hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool Decode(std::string_view in, std::string* out) {
  out->clear();
  for (size_t i = 0; i < in.size(); i++) {
    if (in[i] == '%') {
      if (i + 2 >= in.size()) return false;
      int a = Hex(in[i + 1]), b = Hex(in[i + 2]);
      if (a < 0 || b < 0) return false;
      out->push_back(static_cast<char>(a * 16 + b));
      i += 2;
    } else {
      out->push_back(in[i] == '+' ? ' ' : in[i]);
    }
  }
  return true;
}

// Compares in time independent of where they differ.
bool SameToken(std::string_view a, std::string_view b) {
  if (a.size() != b.size() || a.empty()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); i++) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

}  // namespace

std::string RandomToken() {
  unsigned char bytes[16] = {};
  if (FILE* f = std::fopen("/dev/urandom", "rb")) {
    size_t got = std::fread(bytes, 1, sizeof bytes, f);
    std::fclose(f);
    if (got != sizeof bytes) std::abort();  // no token is better than a guessable one
  } else {
    std::abort();
  }
  std::string out;
  char buf[3];
  for (unsigned char b : bytes) {
    std::snprintf(buf, sizeof buf, "%02x", b);
    out += buf;
  }
  return out;
}

Status HttpServer::Start(const HttpOptions& options, Handler handler) {
  options_ = options;
  handler_ = std::move(handler);
  if (options_.token.empty()) return InvalidArgumentError("the view server needs a token");
  if (options_.max_connections < 1) options_.max_connections = 1;
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return InternalError(std::string("socket: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // never another interface
  addr.sin_port = htons(static_cast<uint16_t>(options_.port));
  if (options_.port < 0 || options_.port > 65535 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    std::string why = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    return InvalidArgumentError("cannot listen on 127.0.0.1:" + std::to_string(options_.port) + ": " + why);
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  for (int i = 0; i < options_.max_connections; i++) workers_.emplace_back([this] { Worker(); });
  acceptor_ = std::thread([this] { AcceptLoop(); });
  return Status::Ok();
}

void HttpServer::Stop() {
  if (stop_.exchange(true)) return;
  cv_.notify_all();
  if (acceptor_.joinable()) acceptor_.join();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  for (int fd : queue_) ::close(fd);
  queue_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void HttpServer::AcceptLoop() {
  while (!stop_.load()) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    timeval tv{options_.io_timeout_ms / 1000, (options_.io_timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    std::unique_lock<std::mutex> lock(mu_);
    if (queue_.size() >= static_cast<size_t>(options_.max_connections)) {
      lock.unlock();
      refused_++;
      Respond(fd, Error(503, "too many connections at once"));
      ::close(fd);
      continue;
    }
    queue_.push_back(fd);
    lock.unlock();
    cv_.notify_one();
  }
}

void HttpServer::Worker() {
  for (;;) {
    int fd;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_.load() || !queue_.empty(); });
      if (stop_.load()) return;
      fd = queue_.front();
      queue_.pop_front();
    }
    Serve(fd);
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
  }
}

void HttpServer::Serve(int fd) {
  auto refuse = [&](int status, std::string why) {
    refused_++;
    Respond(fd, Error(status, std::move(why)));
  };
  // The request head, up to its blank line; anything past it is ignored
  // (a GET has no body; one announced is refused below).
  std::string head;
  char buf[2048];
  size_t end = std::string::npos;
  while (end == std::string::npos) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return refuse(408, "the request took too long");
    if (n == 0) return;  // closed before a whole request: nothing to answer
    size_t from = head.size() >= 3 ? head.size() - 3 : 0;
    head.append(buf, static_cast<size_t>(n));
    end = head.find("\r\n\r\n", from);
    if (end == std::string::npos && head.size() > options_.max_request_bytes)
      return refuse(431, "request head over " + std::to_string(options_.max_request_bytes) + " bytes");
  }
  if (end > options_.max_request_bytes)
    return refuse(431, "request head over " + std::to_string(options_.max_request_bytes) + " bytes");
  head.resize(end);
  for (char c : head)
    if (c == '\0') return refuse(400, "a NUL byte in the request");
  size_t line_end = head.find("\r\n");
  std::string_view line = std::string_view(head).substr(0, line_end);
  size_t sp1 = line.find(' '), sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1) return refuse(400, "malformed request line");
  std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                   version = line.substr(sp2 + 1);
  if (version != "HTTP/1.1" && version != "HTTP/1.0") return refuse(400, "not HTTP/1.x");
  if (method != "GET") return refuse(405, "only GET is served");
  if (target.empty() || target[0] != '/') return refuse(400, "the target must be a path");
  // Headers: counted, Host checked, no body.
  size_t headers = 0;
  std::string host;
  bool has_host = false;
  std::string_view rest = line_end == std::string::npos ? std::string_view() : std::string_view(head).substr(line_end + 2);
  while (!rest.empty()) {
    size_t e = rest.find("\r\n");
    std::string_view h = rest.substr(0, e);
    rest = e == std::string_view::npos ? std::string_view() : rest.substr(e + 2);
    if (++headers > options_.max_headers)
      return refuse(431, "more than " + std::to_string(options_.max_headers) + " headers");
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0) return refuse(400, "malformed header");
    std::string name = Lower(h.substr(0, colon));
    std::string_view value = h.substr(colon + 1);
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    if (name == "host") {
      if (has_host) return refuse(400, "two Host headers");
      has_host = true;
      host = Lower(value);
    } else if (name == "transfer-encoding" || (name == "content-length" && value != "0")) {
      return refuse(413, "a GET with a body");
    }
  }
  // A browser sends the name it connected to: a rebound DNS name is refused.
  const std::string port = ":" + std::to_string(port_);
  if (version == "HTTP/1.1" && !has_host) return refuse(400, "no Host header");
  if (has_host && host != "127.0.0.1" + port && host != "localhost" + port)
    return refuse(403, "this server answers only at 127.0.0.1" + port);

  HttpRequest req;
  size_t q = target.find('?');
  if (!Decode(target.substr(0, q), &req.path)) return refuse(400, "bad escape in the path");
  if (q != std::string_view::npos) {
    std::string_view query = target.substr(q + 1);
    while (!query.empty()) {
      size_t amp = query.find('&');
      std::string_view kv = query.substr(0, amp);
      query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
      size_t eq = kv.find('=');
      std::string k, v;
      if (!Decode(kv.substr(0, eq), &k) || (eq != std::string_view::npos && !Decode(kv.substr(eq + 1), &v)))
        return refuse(400, "bad escape in the query");
      req.query[k] = v;
    }
  }
  auto token = req.query.find("token");
  if (token == req.query.end() || !SameToken(token->second, options_.token))
    return refuse(403, "a token is required (use the URL that spyglass view printed)");
  HttpResponse r;
  try {
    r = handler_(req);
  } catch (const std::exception& e) {
    r = Error(500, std::string("internal error: ") + e.what());
  }
  Respond(fd, r);
}

}  // namespace spyglass::view
