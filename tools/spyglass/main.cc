// The spyglass command-line tool. Subcommands are thin clients over the library.
#include <iostream>
#include <vector>

#include "commands.h"
#include "spyglass/profiler.h"

int main(int argc, char** argv) {
  CLI::App app{"spyglass: where does the time go, who holds the memory"};
  app.set_version_flag("--version", std::string("spyglass ") + spyglass::version());
  app.require_subcommand(0, 1);
  app.footer(
      "Traces are written by programs linked with libspyglass (spyglass::profiler::start_trace) to\n"
      "<log_dir>/plugins/profile/<run>/: open <host>.trace.json.gz or perfetto_trace.pb in\n"
      "https://ui.perfetto.dev, or run `xprof --logdir <log_dir>` for XProf; in the terminal:\n"
      "`spyglass summary <log_dir>` and `spyglass diff <base> <new>`.");
  spyglass::cli::AddCollectCommand(app);
  spyglass::cli::AddMemoryCommands(app);
  spyglass::cli::AddSummaryCommands(app);
  spyglass::cli::AddReportCommand(app);
  spyglass::cli::AddViewCommand(app);
  spyglass::cli::AddRunCommand(app);
  std::vector<char*> args = spyglass::cli::SplitRunProgram(app, argc, argv);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::ParseError& e) {
    return spyglass::cli::ExitStatus(app, e);
  }
  if (app.get_subcommands().empty()) {
    // No command: a usage error, as with a wrong one.
    std::cerr << app.help() << "spyglass: a command is required\n";
    return 2;
  }
  return 0;
}
