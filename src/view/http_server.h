// A small HTTP/1.1 server for `spyglass view`: bound to 127.0.0.1 only,
// GET only, one request per connection, every request checked for the
// session's token (403 without it) and for a Host naming the loopback
// (403: a web page cannot reach it through DNS rebinding). Bounded: the
// request head's size and header count, the connections served at once
// (past them: 503), the time a client may take to send its request.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "spyglass/status.h"

namespace spyglass::view {

struct HttpRequest {
  std::string path;                           // percent-decoded, without the query
  std::map<std::string, std::string> query;  // percent-decoded
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

struct HttpOptions {
  int port = 0;  // 0: a free one
  std::string token;
  size_t max_request_bytes = 8192;  // the request line and headers
  size_t max_headers = 64;
  int max_connections = 8;  // served at once; more wait in the kernel's backlog... up to one queue as deep
  int io_timeout_ms = 5000;
};

class HttpServer {
 public:
  using Handler = std::function<HttpResponse(const HttpRequest&)>;
  ~HttpServer() { Stop(); }
  Status Start(const HttpOptions& options, Handler handler);
  int port() const { return port_; }
  void Stop();
  // Counted for tests: requests refused (4xx/5xx from the server itself).
  uint64_t refused() const { return refused_.load(); }

 private:
  void AcceptLoop();
  void Worker();
  void Serve(int fd);
  HttpOptions options_;
  Handler handler_;
  int listen_fd_ = -1, port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  std::thread acceptor_;
  std::vector<std::thread> workers_;
};

// A random token of 32 hex digits (from /dev/urandom).
std::string RandomToken();

}  // namespace spyglass::view
