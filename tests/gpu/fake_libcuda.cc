// A stand-in for the NVIDIA driver (libcuda.so.1) for the remote-capture test
// of GPU planes: one GPU, the few entry points the GPU tracer calls. Found by
// dlopen through LD_LIBRARY_PATH; nothing of it is NVIDIA's.
#include <cstring>

extern "C" {
int cuInit(unsigned) { return 0; }
int cuDeviceGetCount(int* n) {
  *n = 1;
  return 0;
}
int cuDeviceGetName(char* name, int len, int) {
  std::strncpy(name, "Spyglass Fake GPU", static_cast<size_t>(len));
  return 0;
}
int cuDeviceGetAttribute(int* v, int attr, int) {
  switch (attr) {
    case 13: *v = 1980000; return 0;  // clock rate, kHz
    case 16: *v = 132; return 0;      // SMs
    case 36: *v = 2619000; return 0;  // memory clock, kHz
    case 37: *v = 6144; return 0;     // bus width, bits
    case 75: *v = 9; return 0;        // compute capability
    case 76: *v = 0; return 0;
    default: *v = 0; return 0;
  }
}
int cuDeviceTotalMem_v2(unsigned long* bytes, int) {
  *bytes = 141ul << 30;
  return 0;
}
}
