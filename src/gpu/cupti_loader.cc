#include "gpu/cupti_loader.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <set>

namespace spyglass::gpu {
namespace {

const char* const kSonames[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
const char* const kWheelDirs[] = {"nvidia/cu13/lib", "nvidia/cuda_cupti/lib"};

bool IsDir(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// site-packages directories of the running Python (from the mapped files:
// an extension module or libpython lies under them) and of the environments
// the variables name.
std::vector<std::string> SitePackages() {
  std::set<std::string> out;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  int lines = 0;
  while (std::getline(maps, line) && ++lines < 100000) {
    for (const char* marker : {"/site-packages/", "/dist-packages/"}) {
      size_t at = line.find(marker);
      size_t slash = line.find('/');
      if (at != std::string::npos && slash != std::string::npos && slash < at)
        out.insert(line.substr(slash, at + std::string(marker).size() - 1 - slash));
    }
  }
  for (const char* var : {"VIRTUAL_ENV", "CONDA_PREFIX"}) {
    std::string prefix = Env(var);
    if (prefix.empty()) continue;
    for (const char* minor : {"3.14", "3.13", "3.12", "3.11", "3.10", "3.9"}) {
      std::string d = prefix + "/lib/python" + minor + "/site-packages";
      if (IsDir(d)) out.insert(d);
    }
  }
  return {out.begin(), out.end()};
}

}  // namespace

std::vector<std::string> CuptiCandidates() {
  std::vector<std::string> c;
  std::string override_path = Env("SPYGLASS_CUPTI_PATH");
  if (!override_path.empty()) {
    if (IsDir(override_path))
      for (const char* so : kSonames) c.push_back(override_path + "/" + so);
    else
      c.push_back(override_path);
  }
  for (const std::string& sp : SitePackages())
    for (const char* d : kWheelDirs)
      for (const char* so : kSonames) c.push_back(sp + "/" + d + "/" + so);
  for (const char* so : kSonames) c.push_back(so);  // LD_LIBRARY_PATH, ld.so.cache, system dirs
  std::vector<std::string> roots;
  for (const char* var : {"CUDA_HOME", "CUDA_PATH"})
    if (!Env(var).empty()) roots.push_back(Env(var));
  roots.push_back("/usr/local/cuda");
  for (const std::string& r : roots)
    for (const char* sub : {"/extras/CUPTI/lib64/", "/lib64/"})
      for (const char* so : kSonames) c.push_back(r + sub + so);
  return c;
}

Loaded LoadCupti() {
  Loaded out;
  // A copy already in the process first: two libcupti copies would both
  // attach to the driver.
  for (const char* so : kSonames)
    if (void* h = dlopen(so, RTLD_NOW | RTLD_NOLOAD)) {
      out.handle = h;
      out.path = so;
      return out;
    }
  std::string tried, last_error;
  for (const std::string& path : CuptiCandidates()) {
    bool is_file = path.find('/') != std::string::npos;
    struct stat st;
    if (is_file && stat(path.c_str(), &st) != 0) {
      tried += "\n  " + path + " (absent)";
      continue;
    }
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      out.handle = h;
      out.path = path;
      return out;
    }
    const char* e = dlerror();
    last_error = e ? e : "?";
    tried += "\n  " + path + (is_file ? " (" + last_error + ")" : " (dynamic loader: LD_LIBRARY_PATH=" +
                                                                     (Env("LD_LIBRARY_PATH").empty() ? std::string("<unset>") : Env("LD_LIBRARY_PATH")) + ", ld.so.cache)");
  }
  out.error = "libcupti not found. Searched:" + tried +
              "\nFix: pip install nvidia-cuda-cupti (CUDA 13; nvidia-cuda-cupti-cu12 for CUDA 12) in this Python, "
              "or add the CUDA toolkit's extras/CUPTI/lib64 to LD_LIBRARY_PATH, or set SPYGLASS_CUPTI_PATH to "
              "the library or its directory.";
  return out;
}

void* LoadDriver(std::string* error) {
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD)) return h;
  if (void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) return h;
  const char* e = dlerror();
  // dlerror() already names the library ("libcuda.so.1: cannot open ...").
  *error = std::string("no NVIDIA driver (") + (e ? e : "libcuda.so.1: not found") + ")";
  return nullptr;
}

}  // namespace spyglass::gpu
