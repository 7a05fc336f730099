#include "commands.h"

namespace spyglass::cli {

void AddCollectCommand(CLI::App& app) { (void)app; }

}  // namespace spyglass::cli
