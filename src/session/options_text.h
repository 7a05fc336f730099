// ProfileOptions from text (SPYGLASS_OPTIONS=key=value,..., `spyglass run`):
// one place that knows which keys exist and what type each takes.
#pragma once

#include <string_view>

#include "spyglass/options.h"

namespace spyglass::profiler {

// Sets `key` from its text `value`: a ProfileOptions field (host_tracer_level,
// python_tracer_level, device_tracer_level, session_id, buffer_bytes_per_thread,
// buffer_bytes_total) or an advanced_configuration key, typed as that key is
// (bool: true/false/1/0/yes/no, int: decimal digits, string: as given).
// InvalidArgument names the key and quotes a bounded prefix of the value.
Status SetOptionFromText(std::string_view key, std::string_view value, ProfileOptions* options);

}  // namespace spyglass::profiler
