// The end of the exporters' worker pools (the Perfetto trace's and the trace
// JSON's parallel encoders): on leaving the scope, also when encoding
// throws (bad_alloc), `stop` is set under `mu`, every worker waiting on `cv`
// is woken, and all are joined.
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

namespace spyglass::exporter {

class JoinWorkers {
 public:
  JoinWorkers(std::vector<std::thread>& pool, std::mutex& mu, std::condition_variable& cv, bool& stop)
      : pool_(pool), mu_(mu), cv_(cv), stop_(stop) {}
  JoinWorkers(const JoinWorkers&) = delete;
  JoinWorkers& operator=(const JoinWorkers&) = delete;
  ~JoinWorkers() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : pool_) t.join();
  }

 private:
  std::vector<std::thread>& pool_;
  std::mutex& mu_;
  std::condition_variable& cv_;
  bool& stop_;
};

}  // namespace spyglass::exporter
