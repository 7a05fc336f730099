// Creating an output file and reporting what went wrong, shared by the
// exporters: a full disk or an I/O error surfaces from close() too.
#pragma once

#include <functional>
#include <string>

#include "spyglass/status.h"

namespace spyglass::exporter {

// Creates (truncates) `path` and calls `write(fd)`, which returns 0 or the
// errno of its failure. Returns Internal "cannot create/write <path>: <why>".
Status WriteOutputFile(const std::string& path, const std::function<int(int fd)>& write);

}  // namespace spyglass::exporter
