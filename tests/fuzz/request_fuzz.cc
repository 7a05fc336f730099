// Fuzzes what a client's Profile / Terminate request reaches before any
// capture starts: the options conversion and checks (PrepareCapture), the
// Terminate id check, and the path policy, against a server confined to a
// temporary root (allowed_log_root). An input is a serialized
// tensorflow.ProfileRequest, or, when it starts with 'R', raw fields
// (repository_root, session_id, host, Terminate id) separated by '\x01'.
// "@ROOT@" at the start of a repository_root stands for the temporary root,
// so that seeds and mutations reach paths the policy accepts.
//
// Invariants (a violation aborts, which the driver reports as a crash):
// errors are short (bounded quotes of the input); an accepted target lies
// under the root, within the path bounds; writing it creates nothing outside
// the root.
#include <sys/stat.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

#include <google/protobuf/stubs/logging.h>

#include "common/quote.h"
#include "profiler_service.pb.h"
#include "server/path_policy.h"
#include "server/request_policy.h"

namespace {

namespace fs = std::filesystem;
using namespace spyglass;
using namespace spyglass::server;

// Longest error message: the unknown-key message lists the known keys
// (about 700 bytes) beside bounded quotes.
constexpr size_t kMaxMessageBytes = 2048;
// A fixed "now", so that runs are reproducible (start_timestamp_ns is relative to it).
constexpr uint64_t kNowNs = 1700000000000000000ull;

struct Env {
  std::string base;     // a fresh temporary directory
  std::string root;     // base/root: the server's allowed_log_root
  std::string outside;  // base/outside: must stay empty
  profiler::ServerOptions server;
  size_t written = 0;  // accepted targets written (reported at exit: the policy's accepting side is reached)
};

Env& env() {
  static Env* e = [] {
    auto* e = new Env;
    std::string tmpl = (fs::temp_directory_path() / "spyglass-request-fuzz-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    e->base = tmpl;
    e->root = e->base + "/root";
    e->outside = e->base + "/outside";
    fs::create_directory(e->root);
    fs::create_directory(e->outside);
    e->server.allowed_log_root = e->root;
    google::protobuf::SetLogHandler(nullptr);  // invalid UTF-8 in strings is logged otherwise, once per input
    std::atexit([] {
      std::fprintf(stderr, "request_fuzz: %zu accepted targets written under the root\n", env().written);
      std::error_code ec;
      fs::remove_all(env().base, ec);
    });
    return e;
  }();
  return *e;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "request_fuzz: invariant broken: %s\n", what);
    std::abort();
  }
}

std::string Rooted(std::string path) {
  if (path.rfind("@ROOT@", 0) == 0) path = env().root + path.substr(6);
  return path;
}

void CheckError(const Status& s) {
  if (s.ok()) return;
  Check(s.message().size() <= kMaxMessageBytes, "an error message longer than the bound");
}

// An accepted target: under the root and within bounds; writing it creates
// files only under the root. The root is emptied again afterwards.
void CheckTarget(const ProfileTarget& t) {
  Env& e = env();
  Check(t.file.rfind(e.root + "/", 0) == 0, "a target outside allowed_log_root");
  Check(t.file.size() < kMaxProfilePathBytes, "a target path over the bound");
  Check(t.file.find("/../") == std::string::npos && t.file.find("/./") == std::string::npos, "a '.' or '..' in a target");
  Status s = WriteProfileFile(t, "x");
  CheckError(s);
  if (s.ok()) {
    struct stat st;
    Check(lstat(t.file.c_str(), &st) == 0 && S_ISREG(st.st_mode), "the written file is not where the target says");
    ++env().written;
  }
  std::error_code ec;
  Check(fs::is_empty(e.outside, ec), "something was created outside allowed_log_root");
  size_t top = 0;
  for (auto it = fs::directory_iterator(e.base, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++top;
  Check(top == 2, "something was created beside allowed_log_root");
  for (auto it = fs::directory_iterator(e.root, ec); !ec && it != fs::directory_iterator(); it.increment(ec))
    fs::remove_all(it->path(), ec);
}

void RunRequest(const uint8_t* data, size_t size) {
  tensorflow::ProfileRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return;
  req.set_repository_root(Rooted(req.repository_root()));
  PreparedCapture p;
  Status s = PrepareCapture(env().server, req, kNowNs, &p);
  CheckError(s);
  if (s.ok()) {
    Check(p.options.start_timestamp_ns == 0, "a prepared capture kept its start timestamp");
    Check(p.delay_ns / 1000000 <= env().server.max_start_delay_ms, "a delay over the bound");
    Check(p.options.buffer_bytes_per_thread <= env().server.max_buffer_bytes_per_thread, "a buffer over the ceiling");
    Check(p.session_id.size() <= kMaxNameBytes, "a session id over the bound");
    if (!req.emit_xspace()) CheckTarget(p.target);
  }
  CheckError(CheckTerminateId(req.session_id()));
}

void RunRawFields(const uint8_t* data, size_t size) {
  std::string fields[4];
  size_t f = 0;
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0x01 && f < 3) ++f;
    else fields[f].push_back(static_cast<char>(data[i]));
  }
  ProfileTarget t;
  Status s = ResolveProfileFile(Rooted(fields[0]), fields[1], fields[2], env().root, &t);
  CheckError(s);
  if (s.ok()) CheckTarget(t);
  std::string stem;
  CheckError(HostFileStem(fields[2], &stem));
  CheckError(CheckTerminateId(fields[3]));
  Check(QuoteInput(fields[3]).size() <= kQuotedInputBytes + 32, "a quote over the bound");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 0 && data[0] == 'R') RunRawFields(data, size);
  else RunRequest(data, size);
  return 0;
}
