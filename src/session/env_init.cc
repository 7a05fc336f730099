// Compiled into libspyglass.so only (not the CLI, the Python extension or the
// tests, which carry the same objects): a program linked with libspyglass, or
// one that loads it (the heap hook under `spyglass run`, dlopen), honours the
// SPYGLASS_* environment from load to exit (session/env_start.h).
#include "session/env_start.h"

namespace {

__attribute__((constructor)) void SpyglassStartFromEnvironment() {
  spyglass::session::StartFromEnvironment(spyglass::profiler::ProfileOptions{}, /*stop_at_exit=*/true);
}

}  // namespace
