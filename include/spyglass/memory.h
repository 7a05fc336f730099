// Memory profiles: allocation tracking with stacks, pprof snapshots.
// Implemented in src/memory/.
#pragma once
