#include "session/tracer.h"

#include <algorithm>
#include <mutex>
#include <new>

namespace spyglass::session {
namespace {

struct Entry {
  std::string name;
  int rank;
  TracerFactory factory;
  TracerOptionSpec options;
};

// Never destroyed: registrars of other libraries may run after our statics
// are gone, and sessions may be stopped from static destructors.
std::mutex& registry_mu() {
  static auto* m = new std::mutex;
  return *m;
}
// Kept sorted by (rank, name).
std::vector<Entry>& registry() {
  static auto* r = new std::vector<Entry>;
  return *r;
}

}  // namespace

bool RegisterTracer(const std::string& name, int rank, TracerFactory factory, TracerOptionSpec options) {
  std::lock_guard<std::mutex> lock(registry_mu());
  std::vector<Entry>& r = registry();
  for (const Entry& e : r)
    if (e.name == name) return false;
  auto at = std::upper_bound(r.begin(), r.end(), std::pair<int, const std::string&>(rank, name),
                             [](const auto& key, const Entry& e) {
                               return key.first != e.rank ? key.first < e.rank : key.second < e.name;
                             });
  r.insert(at, Entry{name, rank, std::move(factory), std::move(options)});
  return true;
}

std::vector<OptionKey> RegisteredOptionKeys() {
  std::vector<OptionKey> keys;
  std::lock_guard<std::mutex> lock(registry_mu());
  for (const Entry& e : registry()) keys.insert(keys.end(), e.options.keys.begin(), e.options.keys.end());
  return keys;
}

Status ValidateTracerOptions(const profiler::ProfileOptions& options) {
  std::vector<std::function<Status(const profiler::ProfileOptions&)>> checks;
  {
    std::lock_guard<std::mutex> lock(registry_mu());
    for (const Entry& e : registry())
      if (e.options.validate) checks.push_back(e.options.validate);
  }
  for (const auto& check : checks)
    if (Status s = check(options); !s.ok()) return s;
  return Status::Ok();
}

std::vector<std::unique_ptr<Tracer>> CreateTracers(const profiler::ProfileOptions& options) {
  std::vector<std::unique_ptr<Tracer>> tracers;
  std::lock_guard<std::mutex> lock(registry_mu());
  for (const Entry& e : registry())
    if (auto t = e.factory(options)) tracers.push_back(std::move(t));
  return tracers;
}

void TracerRegistryAfterForkChild() { new (&registry_mu()) std::mutex; }

}  // namespace spyglass::session
