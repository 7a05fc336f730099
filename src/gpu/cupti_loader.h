// Finding and opening libcupti and the CUDA driver at run time (dlopen):
// libspyglass never links CUDA and runs on machines without it (spec GPU.md §6).
#pragma once

#include <string>
#include <vector>

namespace spyglass::gpu {

// The places libcupti is looked for, in order (spec GPU.md §6.3):
//   $SPYGLASS_CUPTI_PATH (a file or a directory),
//   a copy already loaded in the process (by SONAME, RTLD_NOLOAD),
//   the pip wheels (nvidia/cu13/lib, nvidia/cuda_cupti/lib) in the
//     site-packages of the running Python, $VIRTUAL_ENV and $CONDA_PREFIX,
//   the dynamic loader's search ($LD_LIBRARY_PATH, ld.so.cache) by SONAME,
//   $CUDA_HOME, $CUDA_PATH and /usr/local/cuda: extras/CUPTI/lib64, lib64.
std::vector<std::string> CuptiCandidates();

struct Loaded {
  void* handle = nullptr;
  std::string path;   // what was opened
  std::string error;  // when handle is null: every place searched and the fix
};
// Opens the first candidate that loads.
Loaded LoadCupti();
// The driver, libcuda.so.1: the copy already loaded, else loads it. Null with
// `*error` set when there is no NVIDIA driver.
void* LoadDriver(std::string* error);

}  // namespace spyglass::gpu
