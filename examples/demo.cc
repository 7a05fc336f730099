// Demo: profiles a few training-like steps of matrix work and shows where the
// trace went and how to open it.
//
//   spyglass_demo [log_dir] [--steps N] [--perfetto-link]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <spyglass/profiler.h>

namespace prof = spyglass::profiler;

namespace {

struct Matrix {
  int n;
  std::vector<float> v;
  explicit Matrix(int n) : n(n), v(size_t(n) * n) {}
  float& at(int i, int j) { return v[size_t(i) * n + j]; }
  float at(int i, int j) const { return v[size_t(i) * n + j]; }
};

Matrix matmul(const Matrix& a, const Matrix& b) {
  prof::TraceAnnotation scope("matmul", {{"n", a.n}});
  Matrix c(a.n);
  for (int i = 0; i < a.n; ++i)
    for (int k = 0; k < a.n; ++k) {
      float x = a.at(i, k);
      for (int j = 0; j < a.n; ++j) c.at(i, j) += x * b.at(k, j);
    }
  return c;
}

void relu(Matrix& m) {
  prof::TraceAnnotation scope("relu");
  for (float& x : m.v) x = x > 0 ? x : 0;
}

float loss(const Matrix& m) {
  prof::TraceAnnotation scope("loss");
  double s = 0;
  for (float x : m.v) s += double(x) * x;
  return float(std::sqrt(s / m.v.size()));
}

Matrix load_batch(int step, int n) {
  prof::TraceAnnotation scope("load_batch", {{"step", step}});
  Matrix m(n);
  for (int i = 0; i < n * n; ++i) m.v[size_t(i)] = std::sin(float(i + step)) * 0.5f;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string log_dir = "/tmp/spyglass-demo";
  int steps = 5;
  prof::TraceOptions options;
  options.create_perfetto_trace = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--perfetto-link")) options.create_perfetto_link = true;
    else log_dir = argv[i];
  }
  prof::set_process_name("spyglass_demo");
  prof::set_thread_name("trainer");

  if (spyglass::Status s = prof::start_trace(log_dir, options); !s.ok()) {
    std::fprintf(stderr, "start_trace: %s\n", s.ToString().c_str());
    return 1;
  }
  const int n = 160;
  Matrix w1 = load_batch(-1, n), w2 = load_batch(-2, n);
  // A loader thread prepares the next batch while the trainer computes.
  Matrix next = load_batch(0, n);
  auto train_step = prof::annotate_function(
      [&](const Matrix& x) {
        Matrix h = matmul(x, w1);
        relu(h);
        Matrix y = matmul(h, w2);
        return loss(y);
      },
      "train_step", {{"model", "mlp"}, {"layers", 2}});
  for (int step = 0; step < steps; ++step) {
    prof::StepTraceAnnotation step_scope("train", step);
    Matrix batch = std::move(next);
    std::thread loader([&, step] {
      prof::set_thread_name("loader");
      next = load_batch(step + 1, n);
    });
    float l = train_step(batch);
    {
      prof::TraceAnnotation wait("wait_for_loader");
      loader.join();
    }
    std::printf("step %d loss %.4f\n", step, l);
  }
  if (spyglass::Status s = prof::stop_trace(); !s.ok()) {
    std::fprintf(stderr, "stop_trace: %s\n", s.ToString().c_str());
    return 1;
  }
  prof::TraceFiles files = prof::last_trace_files();
  prof::TraceStats stats = prof::last_trace_stats();
  std::printf(
      "\nRecorded %llu events on %llu threads (%llu dropped).\n"
      "Trace written to %s\n"
      "  %s\n  %s\n  %s\n"
      "Open it:\n"
      "  Perfetto: open https://ui.perfetto.dev and drop %s on it\n"
      "            (or rerun with --perfetto-link to serve it at 127.0.0.1:9001)\n"
      "  XProf:    pip install xprof && xprof --logdir %s   (then http://localhost:8791)\n"
      "  Here, no UI: spyglass summary %s   or   spyglass report %s -o report.html\n",
      (unsigned long long)stats.events, (unsigned long long)stats.threads, (unsigned long long)stats.dropped_events,
      files.run_dir.c_str(), files.xplane_path.c_str(), files.trace_json_path.c_str(),
      files.perfetto_trace_path.c_str(), files.perfetto_trace_path.c_str(), log_dir.c_str(), files.run_dir.c_str(),
      files.run_dir.c_str());
  return 0;
}
