// A target with a planted bug, to check that the driver finds crashes: it
// aborts on inputs starting with "FUZ!", one bit flip away from the seed "FUZ ".
#include <cstdint>
#include <cstdlib>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size >= 4 && std::memcmp(data, "FUZ!", 4) == 0) std::abort();
  return 0;
}
