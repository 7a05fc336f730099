// Subcommands of the spyglass CLI, one file each; main.cc wires them up.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace spyglass::report {
struct ReportInput;
struct FlameOptions;
}  // namespace spyglass::report

namespace spyglass::cli {

// `spyglass collect`: remote capture (tools/spyglass/collect_command.cc).
// `cancelled` ends the Perfetto link's wait when it returns true.
void AddCollectCommand(CLI::App& app, std::function<bool()> cancelled = {});
// `spyglass collect ARGS...` as a function returning the exit status: the one
// parser of both the CLI and `python -m spyglass.collect_profile`.
int RunCollectCommand(const std::string& program, const std::vector<std::string>& args,
                      std::function<bool()> cancelled = {});
// `spyglass memtop`, `memdiff` (tools/spyglass/memory_commands.cc).
void AddMemoryCommands(CLI::App& app);
// What reads `path` when the command given it cannot (summary, else memtop
// or memdiff): "'PATH' is a memory profile (pprof), not a trace: read it with
// `spyglass memtop`...", the like for a memory timeline or (from memtop)
// a trace; "" for anything else (tools/spyglass/memory_commands.cc).
std::string OtherCommandFor(const std::string& path, bool from_summary);
// `spyglass summary`, `diff` (tools/spyglass/summary_command.cc).
void AddSummaryCommands(CLI::App& app);
// `spyglass report` (tools/spyglass/report_command.cc).
void AddReportCommand(CLI::App& app);
// What the report page shows besides the timeline (report_command.cc): the
// run's summary, the memory profiles (`memory_files`, else memory.*.prof
// near the run), the CPU profiles and memory timelines near it; `progress`
// is told what is read. False, with a message on stderr after `command`, if
// the summary or a named profile cannot be read. `spyglass view` shows them too.
// A summary already in `in` is kept (not read again).
bool AddRunPanels(const std::string& command, const std::string& run, const std::string& first_file,
                  const std::vector<std::string>& memory_files, const report::FlameOptions& options,
                  report::ReportInput* in, const std::function<void(const std::string&)>& progress);
// `spyglass view` (tools/spyglass/view_command.cc).
void AddViewCommand(CLI::App& app);
// `spyglass run` (tools/spyglass/run_command.cc).
void AddRunCommand(CLI::App& app);
// The arguments for CLI11 when they hold `run`: those before the program,
// which `run` keeps with its own arguments (CLI11 would take the program's
// options for run's).
std::vector<char*> SplitRunProgram(CLI::App& app, int argc, char** argv);

// The exit status of a parse that threw: a CLI11 usage error is 2, as every
// usage error of the CLI (CLI11's own codes are 100 and up); help and
// version 0; a command's RuntimeError its own status. Prints what CLI11 says.
int ExitStatus(CLI::App& app, const CLI::ParseError& e);

}  // namespace spyglass::cli
