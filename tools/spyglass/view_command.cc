// `spyglass view RUN`: the report page of a run of any size, served from
// 127.0.0.1 (src/view/): the run is indexed once, streamed, and the page
// asks for what it shows as it is zoomed.
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <future>
#include <iostream>
#include <pthread.h>
#include <spawn.h>
#include <unistd.h>

#include "commands.h"
#include "report/flame.h"
#include "report/report.h"
#include "spyglass/profile_reader.h"
#include "view/http_server.h"
#include "view/view_app.h"
#include "view/view_index.h"

namespace spyglass::cli {
namespace {

volatile std::sig_atomic_t stop_requested = 0;
void OnStop(int) { stop_requested = 1; }

// $XDG_CACHE_HOME/spyglass/view, or ~/.cache/spyglass/view; empty if neither is known.
std::string CacheDir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/spyglass/view";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.cache/spyglass/view";
  return "";
}

int RunView(const std::string& run, int port, bool open_browser, int max_connections,
            const std::vector<std::string>& memory_files, bool all_frames, bool use_cache, uint64_t cache_max_mib) {
  std::vector<std::string> files;
  if (Status s = profile::FindProfileFiles(run, &files); !s.ok()) {
    std::cerr << "spyglass view: " << s.message() << "\n";
    return 1;
  }
  std::cerr << "spyglass view: indexing " << files.size() << " file" << (files.size() == 1 ? "" : "s") << " of " << run << "\n";
  // SIGINT and SIGTERM wait, blocked (in the threads started after too:
  // they inherit the mask), until the index is built and its files are
  // gone; sigsuspend takes them then: none is lost between a check and a wait.
  std::signal(SIGINT, OnStop);
  std::signal(SIGTERM, OnStop);
  sigset_t stop_signals, unblocked;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &unblocked);
  // The summary and the flame graphs, as spyglass report shows them: read
  // while the index is built (each reads the file once, in bounded memory).
  report::ReportInput page;
  page.title = run;
  report::FlameOptions flame_options;
  flame_options.fold_interpreter = !all_frames;
  // The summary of unchanged files comes from the cache, beside their index.
  view::CacheOptions cache;
  cache.dir = use_cache ? CacheDir() : "";
  cache.max_bytes = cache_max_mib << 20;
  const std::string cache_key = cache.dir.empty() ? "" : view::CacheKey(files);
  const view::CacheOptions quiet = cache;  // (a refused directory is said once, by Build)
  const bool summary_cached = view::ReadCachedText(quiet, cache_key, "summary", &page.summary_json);
  cache.say = [](const std::string& what) { std::cerr << "spyglass view: " << what << "\n"; };
  std::future<bool> panels = std::async(std::launch::async, [&] {
    return AddRunPanels("spyglass view", run, files.front(), memory_files, flame_options, &page,
                        [](const std::string& what) { std::cerr << "spyglass view: " << what << "\n"; });
  });
  // The server starts first: the URL is printed at once, and the page shows
  // the index's progress until the timeline is ready.
  view::ViewIndex index;
  view::BuildProgress progress;
  std::atomic<const view::ViewApp*> ready{nullptr};
  view::HttpServer server;
  view::HttpOptions options;
  options.port = port;
  options.token = view::RandomToken();
  options.max_connections = max_connections;
  Status started = server.Start(options, [&ready, &progress](const view::HttpRequest& r) {
    const view::ViewApp* app = ready.load(std::memory_order_acquire);
    return app != nullptr ? app->Handle(r) : view::IndexingResponse(r, progress);
  });
  if (!started.ok()) {
    std::cerr << "spyglass view: " << started.message() << "\n";
    panels.wait();
    return 1;
  }
  std::string url = "http://127.0.0.1:" + std::to_string(server.port()) + "/?token=" + options.token;
  std::cout << url << std::endl;
  if (open_browser) {
    // The URL holds the token: given as an argument, never through a shell.
    pid_t child = 0;
    char* argv[] = {const_cast<char*>("xdg-open"), url.data(), nullptr};
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    posix_spawnattr_setsigmask(&attr, &unblocked);  // not this process's blocked signals
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK);
    int spawned = posix_spawnp(&child, "xdg-open", nullptr, &attr, argv, environ);
    posix_spawnattr_destroy(&attr);
    if (spawned != 0)
      std::cerr << "spyglass view: could not start xdg-open; open the URL above\n";
  }
  Status built = index.Build(files, &progress, &cache);
  if (!panels.get()) return 1;
  if (built.ok() && !summary_cached && !cache_key.empty() && view::CacheKey(files) == cache_key)
    view::WriteCachedText(quiet, cache_key, "summary", page.summary_json);
  if (!built.ok()) {
    std::cerr << "spyglass view: " << built.message() << "\n";
    return 1;
  }
  view::ViewApp app(&index, std::move(page));
  ready.store(&app, std::memory_order_release);
  std::cerr << "spyglass view: " << index.timeline().events << " events on " << index.timeline().tracks.size()
            << " threads, an index of " << (index.index_bytes() >> 20)
            << " MiB; ready at the URL above, serving until interrupted (Ctrl-C)\n";
  while (!stop_requested) sigsuspend(&unblocked);
  server.Stop();
  return 0;
}

}  // namespace

void AddViewCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "view",
      "Serve a run's report page from this machine (127.0.0.1, a token in the URL): traces of any size, read on demand");
  static std::string run;
  static int port = 0, max_connections = 8;
  static bool open_browser = false, all_frames = false, no_cache = false;
  static uint64_t cache_max_mib = 4096;
  static std::vector<std::string> memory_files;
  cmd->add_option("run", run, "a run folder, a log dir (its newest run) or one .xplane.pb (Spyglass's or JAX's)")
      ->required();
  cmd->add_option("--port", port, "the port on 127.0.0.1 (default: a free one)")->check(CLI::Range(0, 65535));
  cmd->add_flag("--open", open_browser, "open the URL with xdg-open (default: only print it)");
  cmd->add_option("--max-connections", max_connections, "connections served at once (more get 503)")
      ->check(CLI::Range(1, 256));
  cmd->add_option("--memory", memory_files,
                  "memory profile(s) (.prof, pprof) to show as flame graphs; default: memory.*.prof in the run "
                  "folder and its log dir");
  cmd->add_flag("--all-frames", all_frames,
                "keep the interpreter's and the import system's frames in a Python program's flame graphs "
                "(folded away by default)");
  cmd->add_flag("--no-cache", no_cache,
                "index the run again, in a temporary file, instead of reusing (and keeping) its index in "
                "$XDG_CACHE_HOME/spyglass/view (default ~/.cache/spyglass/view)");
  cmd->add_option("--cache-max", cache_max_mib, "MiB that the cached indexes may take together (the least recently "
                                                "used go first; default 4096)")
      ->check(CLI::Range(uint64_t{0}, uint64_t{1} << 30));
  cmd->footer(
      "Prints the page's URL (http://127.0.0.1:PORT/?token=...) on stdout and serves until interrupted.\n"
      "Only this machine can connect, and only with the token: other local users cannot read the trace.\n"
      "The URL comes at once; the page shows the index's progress until the timeline is ready. The index is\n"
      "kept in a private cache (0700, refused if another user's or writable by others), keyed by the files'\n"
      "device, inode, size and mtime: a second view of an unchanged run opens at once.");
  cmd->callback([] { std::exit(RunView(run, port, open_browser, max_connections, memory_files, all_frames, !no_cache, cache_max_mib)); });
}

}  // namespace spyglass::cli
