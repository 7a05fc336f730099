#include "export/trace_json/trace_json_writer.h"

#include "export/output_file.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <functional>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

namespace spyglass::exporter {
namespace {

// Stats that tsl's exporter treats as internal and hides from args.
bool IsInternalStat(std::string_view name) {
  return name == "_r" || name == "_p" || name == "_pt" || name == "_c" || name == "_ct" || name == "flops" ||
         name == "program_id" || name == "symbol_id";
}

// The pid of a host plane merged from another process, "/host:CPU [<pid>]"; 0 otherwise.
int64_t MergedHostPid(const model::Plane& p) {
  constexpr std::string_view prefix = "/host:CPU [";
  if (p.name.size() <= prefix.size() + 1 || p.name.compare(0, prefix.size(), prefix) != 0 || p.name.back() != ']')
    return 0;
  int64_t pid = 0;
  const char* b = p.name.data() + prefix.size();
  auto r = std::from_chars(b, p.name.data() + p.name.size(), pid);
  return r.ec == std::errc() && *r.ptr == ']' && pid > 0 ? pid : 0;
}

// Which planes go into the JSON: the host plane and the device planes of one
// kind (GPU, else TPU, else custom), as tsl does; the memory counter planes
// ride with the host.
std::vector<const model::Plane*> ExportedPlanes(const model::Space& space) {
  std::vector<const model::Plane*> out;
  if (const model::Plane* host = space.find_plane(model::kHostPlaneName)) out.push_back(host);
  // Host planes merged from other processes ("/host:CPU [<pid>]", subprocesses and multi-host captures).
  for (const model::Plane& p : space.planes)
    if (MergedHostPid(p) != 0) out.push_back(&p);
  for (std::string_view prefix : {model::kGpuPlanePrefix, model::kTpuPlanePrefix, model::kCustomPlanePrefix}) {
    size_t before = out.size();
    for (const model::Plane& p : space.planes)
      if (p.name.rfind(prefix, 0) == 0) out.push_back(&p);
    if (out.size() > before) break;
  }
  return out;
}

// Output buffer that hands full blocks to a sink (gzip file or string).
class JsonOut {
 public:
  explicit JsonOut(std::function<bool(const char*, size_t)> sink) : sink_(std::move(sink)) { buf_.reserve(kBlock + 8192); }

  void raw(std::string_view s) {
    buf_.append(s);
    maybe_flush();
  }
  void ch(char c) { buf_.push_back(c); }
  // Opens the next element of traceEvents: a comma goes before every element
  // but the first, so the array needs no trailing `{}` (speedscope rejects one).
  void event(std::string_view head) {
    if (!first_event_) buf_.push_back(',');
    first_event_ = false;
    raw(head);
  }
  void u64(uint64_t v) {
    char tmp[24];
    buf_.append(tmp, std::to_chars(tmp, tmp + sizeof tmp, v).ptr);
  }
  void i64(int64_t v) {
    char tmp[24];
    buf_.append(tmp, std::to_chars(tmp, tmp + sizeof tmp, v).ptr);
  }
  // Picoseconds as exact decimal microseconds ("12.345678"); no rounding.
  void micros_from_ps(int64_t ps) {
    if (ps < 0) {
      ch('-');
      ps = -ps;
    }
    u64(static_cast<uint64_t>(ps / 1000000));
    int64_t frac = ps % 1000000;
    if (frac == 0) return;
    char digits[7];
    for (int i = 5; i >= 0; --i) {
      digits[i] = static_cast<char>('0' + frac % 10);
      frac /= 10;
    }
    int n = 6;
    while (digits[n - 1] == '0') --n;
    ch('.');
    buf_.append(digits, n);
  }
  // A JSON string literal; invalid UTF-8 becomes U+FFFD so the file always parses.
  void str(std::string_view s) {
    ch('"');
    for (size_t i = 0; i < s.size(); ++i) {
      unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == '"' || c == '\\') {
        ch('\\');
        ch(static_cast<char>(c));
      } else if (c < 0x20) {
        static const char* hex = "0123456789abcdef";
        buf_.append("\\u00");
        ch(hex[c >> 4]);
        ch(hex[c & 15]);
      } else if (c < 0x80) {
        ch(static_cast<char>(c));
      } else {
        size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 ? 2 : 0;
        bool valid = len != 0 && c < 0xf5 && i + len <= s.size();
        for (size_t k = 1; valid && k < len; ++k) valid = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
        if (valid) {
          buf_.append(s.substr(i, len));
          i += len - 1;
        } else {
          buf_.append("\\ufffd");
        }
      }
    }
    ch('"');
    maybe_flush();
  }
  bool finish() { return flush() && ok_; }

 private:
  static constexpr size_t kBlock = 1 << 20;
  void maybe_flush() {
    if (buf_.size() >= kBlock) flush();
  }
  bool flush() {
    if (!buf_.empty() && ok_) ok_ = sink_(buf_.data(), buf_.size());
    buf_.clear();
    return ok_;
  }
  std::function<bool(const char*, size_t)> sink_;
  bool first_event_ = true;
  std::string buf_;
  bool ok_ = true;
};

void WriteArgs(JsonOut& o, const model::Plane& plane, const model::EventMetadata& md,
               const std::vector<model::Stat>* stats) {
  if (md.stats.empty() && (stats == nullptr || stats->empty())) return;
  // Keys sorted; event stats override metadata stats of the same name.
  std::map<std::string_view, std::string> args;
  auto add = [&](const model::Stat& s) {
    const std::string& key = plane.stat_name(s);
    if (!IsInternalStat(key)) args[key] = plane.stat_text(s);
  };
  for (const model::Stat& s : md.stats) add(s);
  if (stats)
    for (const model::Stat& s : *stats) add(s);
  if (args.empty()) return;
  o.raw(",\"args\":{");
  bool first = true;
  for (const auto& [k, v] : args) {
    if (!first) o.ch(',');
    first = false;
    o.str(k);
    o.ch(':');
    o.str(v);
  }
  o.ch('}');
}

// Events on a counter line (XSpace's "_counters_", e.g. the memory tracer's
// live bytes per device) become Chrome counter events: {"ph":"C","name":
// <event name>,"args":{<stat>: <number>}}; Perfetto shows a counter track.
constexpr std::string_view kCounterLineName = "_counters_";
void WriteCounters(JsonOut& o, const model::Plane& plane, int64_t pid, const model::Line& l, int64_t line_ps) {
  for (const model::Event& e : l.events) {
    const model::EventMetadata& md = plane.event_metadata()[e.metadata_id];
    o.event("{\"ph\":\"C\",\"pid\":");
    o.i64(pid);
    o.raw(",\"ts\":");
    o.micros_from_ps(line_ps + e.offset_ps);
    o.raw(",\"name\":");
    o.str(md.display_name.empty() ? md.name : md.display_name);
    o.raw(",\"args\":{");
    bool first = true;
    if (const auto* stats = l.stats_of(e)) {
      for (const model::Stat& st : *stats) {
        if (st.kind != model::StatKind::kInt64 && st.kind != model::StatKind::kUint64 && st.kind != model::StatKind::kDouble)
          continue;
        if (!first) o.ch(',');
        first = false;
        o.str(plane.stat_name(st));
        o.ch(':');
        o.raw(plane.stat_text(st));
      }
    }
    o.raw("}}");
  }
}

void WriteJson(const model::Space& space, const TraceJsonOptions& options, JsonOut& o) {
  o.raw("{\"displayTimeUnit\":\"ns\",");
  if (!options.perfetto) o.raw("\"metadata\":{\"highres-ticks\":true},");
  o.raw("\"traceEvents\":[");
  std::vector<const model::Plane*> planes = ExportedPlanes(space);
  auto pid_of = [](const model::Plane& p) {
    if (p.name == model::kHostPlaneName) return int64_t{kHostPid};
    if (int64_t merged = MergedHostPid(p)) return merged;
    return 1 + p.id;
  };
  // Metadata events: process and thread names and sort order.
  for (const model::Plane* p : planes) {
    int64_t pid = pid_of(*p);
    if (!p->name.empty()) {
      o.event("{\"ph\":\"M\",\"pid\":");
      o.i64(pid);
      o.raw(",\"name\":\"process_name\",\"args\":{\"name\":");
      o.str(p->name);
      o.raw("}}");
    }
    for (const model::Stat& s : p->stats) {
      if (s.kind == model::StatKind::kString && p->stat_name(s) == "process_name") {
        // Perfetto and chrome://tracing show labels beside the process name.
        o.event("{\"ph\":\"M\",\"pid\":");
        o.i64(pid);
        o.raw(",\"name\":\"process_labels\",\"args\":{\"labels\":");
        int64_t os_pid = MergedHostPid(*p) ? MergedHostPid(*p) : int64_t{getpid()};
        o.str(s.str + " (pid " + std::to_string(os_pid) + ")");
        o.raw("}}");
      }
    }
    o.event("{\"ph\":\"M\",\"pid\":");
    o.i64(pid);
    o.raw(",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":");
    o.i64(pid);
    o.raw("}}");
    int64_t sort_index = 0;
    for (const model::Line& l : p->lines) {
      if (l.name == kCounterLineName) continue;  // counters are process-level tracks, not threads
      uint32_t tid = static_cast<uint32_t>(l.display_id ? l.display_id : l.id);
      const std::string& name = l.display_name.empty() ? l.name : l.display_name;
      ++sort_index;
      if (!name.empty()) {
        o.event("{\"ph\":\"M\",\"pid\":");
        o.i64(pid);
        o.raw(",\"tid\":");
        o.u64(tid);
        o.raw(",\"name\":\"thread_name\",\"args\":{\"name\":");
        o.str(name);
        o.raw("}}");
      }
      o.event("{\"ph\":\"M\",\"pid\":");
      o.i64(pid);
      o.raw(",\"tid\":");
      o.u64(tid);
      o.raw(",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":");
      o.i64(p->name == model::kHostPlaneName || MergedHostPid(*p) ? sort_index : int64_t{tid});
      o.raw("}}");
    }
  }
  // Complete events.
  for (const model::Plane* p : planes) {
    int64_t pid = pid_of(*p);
    const auto& metadata = p->event_metadata();
    for (const model::Line& l : p->lines) {
      uint32_t tid = static_cast<uint32_t>(l.display_id ? l.display_id : l.id);
      int64_t line_ps = l.timestamp_ns * 1000;
      if (l.name == kCounterLineName) {
        WriteCounters(o, *p, pid, l, line_ps);
        continue;
      }
      for (const model::Event& e : l.events) {
        const model::EventMetadata& md = metadata[e.metadata_id];
        o.event("{\"ph\":\"X\",\"pid\":");
        o.i64(pid);
        o.raw(",\"tid\":");
        o.u64(tid);
        o.raw(",\"ts\":");
        o.micros_from_ps(line_ps + e.offset_ps);
        o.raw(",\"dur\":");
        o.micros_from_ps(std::max<int64_t>(e.duration_ps, 1));
        o.raw(",\"name\":");
        o.str(md.display_name.empty() ? md.name : md.display_name);
        WriteArgs(o, *p, md, l.stats_of(e));
        o.raw("}");
      }
    }
  }
  // What the recorder dropped is shown on the timeline, not only in a log.
  if (const model::Plane* host = space.find_plane(model::kHostPlaneName)) {
    for (const model::Stat& s : host->stats) {
      if (host->stat_name(s) == "dropped_events" && s.u64 > 0) {
        o.event("{\"ph\":\"i\",\"s\":\"g\",\"pid\":");
        o.i64(kHostPid);
        o.raw(",\"tid\":0,\"ts\":0,\"name\":");
        o.str("spyglass: " + std::to_string(s.u64) + " events dropped (buffer bound reached)");
        o.raw("}");
      }
    }
  }
  o.raw("]}");
}

}  // namespace

std::string TraceJsonString(const model::Space& space, const TraceJsonOptions& options) {
  std::string out;
  JsonOut o([&](const char* p, size_t n) {
    out.append(p, n);
    return true;
  });
  WriteJson(space, options, o);
  o.finish();
  return out;
}

namespace {

// Compresses and writes blocks on its own thread, so that formatting JSON
// and deflating it (the two halves of the export's cost) run in parallel.
// At most kMaxQueued blocks wait, so memory stays bounded.
class GzipFileWriter {
 public:
  GzipFileWriter(int fd, int level) : fd_(fd) {
    // windowBits 15 + 16: gzip framing.
    ok_ = deflateInit2(&z_, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK;
    initialized_ = ok_;
    if (ok_) worker_ = std::thread([this] { Run(); });
  }
  ~GzipFileWriter() {
    Finish();
    if (initialized_) deflateEnd(&z_);
  }

  bool Push(const char* p, size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    space_cv_.wait(lock, [&] { return queue_.size() < kMaxQueued || !ok_; });
    if (!ok_) return false;
    std::string block;
    if (!free_.empty()) {
      block = std::move(free_.back());
      free_.pop_back();
    }
    block.assign(p, n);
    queue_.push_back(std::move(block));
    data_cv_.notify_one();
    return true;
  }

  // Flushes the stream; returns false (with errno_) on any failure.
  bool Finish() {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        done_ = true;
      }
      data_cv_.notify_one();
      worker_.join();
    }
    return ok_;
  }
  int error() const { return errno_; }

 private:
  static constexpr size_t kMaxQueued = 4;

  void Run() {
    std::string out(1 << 18, '\0');
    for (;;) {
      std::string block;
      bool last = false;
      {
        std::unique_lock<std::mutex> lock(mu_);
        data_cv_.wait(lock, [&] { return !queue_.empty() || done_; });
        if (queue_.empty()) last = true;
        else {
          block = std::move(queue_.front());
          queue_.pop_front();
        }
      }
      space_cv_.notify_one();
      bool ok = Deflate(block, last ? Z_FINISH : Z_NO_FLUSH, out);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!last) free_.push_back(std::move(block));
        if (!ok) ok_ = false;
      }
      if (!ok) space_cv_.notify_all();
      if (last || !ok) return;
    }
  }

  bool Deflate(const std::string& in, int flush, std::string& out) {
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
    z_.avail_in = static_cast<uInt>(in.size());
    do {
      z_.next_out = reinterpret_cast<Bytef*>(out.data());
      z_.avail_out = static_cast<uInt>(out.size());
      deflate(&z_, flush);
      size_t have = out.size() - z_.avail_out;
      const char* p = out.data();
      while (have > 0) {
        ssize_t w = ::write(fd_, p, have);
        if (w < 0) {
          if (errno == EINTR) continue;
          errno_ = errno;
          return false;
        }
        p += w;
        have -= static_cast<size_t>(w);
      }
    } while (z_.avail_out == 0);
    return true;
  }

  int fd_;
  z_stream z_{};
  bool initialized_ = false;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable data_cv_, space_cv_;
  std::deque<std::string> queue_;
  std::vector<std::string> free_;
  bool done_ = false;
  bool ok_ = false;
  int errno_ = 0;
};

}  // namespace

Status WriteTraceJsonGz(const model::Space& space, const std::string& path, const TraceJsonOptions& options) {
  return WriteOutputFile(path, [&](int fd) {
    GzipFileWriter gz(fd, options.gzip_level);
    JsonOut o([&](const char* p, size_t n) { return gz.Push(p, n); });
    WriteJson(space, options, o);
    bool ok = o.finish();
    ok = gz.Finish() && ok;
    return ok ? 0 : (gz.error() ? gz.error() : EIO);
  });
}

}  // namespace spyglass::exporter
