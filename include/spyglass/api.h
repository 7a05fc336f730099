#pragma once

// SPYGLASS_API marks what libspyglass.so exports: the declarations of
// include/spyglass/*.h. The library is compiled with hidden visibility, so
// everything else in it (generated protobuf/gRPC code, server, model,
// exporters, session) is private to it and not part of its ABI.
#define SPYGLASS_API [[gnu::visibility("default")]]
