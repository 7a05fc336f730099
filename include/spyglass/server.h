// The profiler server (remote capture) and subprocess registration.
// Implemented in src/server/.
#pragma once
