// Subcommands of the spyglass CLI, one file each; main.cc wires them up.
#pragma once

#include <CLI/CLI.hpp>

namespace spyglass::cli {

// `spyglass collect`: remote capture (tools/spyglass/collect_command.cc).
void AddCollectCommand(CLI::App& app);
// `spyglass memtop`, `memdiff`, `run` (tools/spyglass/memory_commands.cc).
void AddMemoryCommands(CLI::App& app);

}  // namespace spyglass::cli
