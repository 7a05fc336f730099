#include "commands.h"

namespace spyglass::cli {

void AddMemoryCommands(CLI::App& app) { (void)app; }

}  // namespace spyglass::cli
