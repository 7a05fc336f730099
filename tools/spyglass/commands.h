// Subcommands of the spyglass CLI, one file each; main.cc wires them up.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

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
// `spyglass summary`, `diff` (tools/spyglass/summary_command.cc).
void AddSummaryCommands(CLI::App& app);
// `spyglass report` (tools/spyglass/report_command.cc).
void AddReportCommand(CLI::App& app);
// `spyglass run` (tools/spyglass/run_command.cc).
void AddRunCommand(CLI::App& app);
// The arguments for CLI11 when they hold `run`: those before the program,
// which `run` keeps with its own arguments (CLI11 would take the program's
// options for run's).
std::vector<char*> SplitRunProgram(CLI::App& app, int argc, char** argv);

}  // namespace spyglass::cli
