#include "base/cpu_features.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace metro {
namespace {

// Counts distinct (physical id, core id) pairs from /proc/cpuinfo; falls back to the
// number of online CPUs when the file lacks them (containers, VMs).
std::pair<int, int> count_cores() {
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  int logical = online > 0 ? static_cast<int>(online) : 1;
  std::ifstream in("/proc/cpuinfo");
  std::set<std::pair<int, int>> cores;
  int phys = -1, core = -1;
  std::string line;
  while (std::getline(in, line)) {
    auto value = [&]() { return std::stoi(line.substr(line.find(':') + 1)); };
    try {
      if (line.rfind("physical id", 0) == 0) phys = value();
      if (line.rfind("core id", 0) == 0) core = value();
    } catch (...) {
      continue;
    }
    if (line.empty()) {
      if (core >= 0) cores.insert({phys, core});
      phys = core = -1;
    }
  }
  if (core >= 0) cores.insert({phys, core});
  int physical = cores.empty() ? logical : static_cast<int>(cores.size());
  if (physical > logical) physical = logical;
  return {physical, logical};
}

CpuFeatures detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  f.sse42 = __builtin_cpu_supports("sse4.2");
  f.avx = __builtin_cpu_supports("avx");
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512vnni = __builtin_cpu_supports("avx512vnni");
  // F16C and AVX-VNNI are not names every compiler's __builtin_cpu_supports knows: ask CPUID.
  unsigned eax, ebx, ecx, edx;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(1), "c"(0));
  f.f16c = (ecx >> 29) & 1u;
  __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(0), "c"(0));
  if (eax >= 7) {
    __asm__ volatile("cpuid" : "=a"(eax), "=b"(ebx), "=c"(ecx), "=d"(edx) : "a"(7), "c"(1));
    f.avxvnni = (eax >> 4) & 1u;
  }
#endif
  // METRO_CPU=baseline hides every extension past SSE4.2, so the scalar kernels run: for
  // comparing against them on a real model, and for machines where a SIMD path misbehaves.
  if (const char* env = std::getenv("METRO_CPU"); env && std::string(env) == "baseline") {
    f.avx = f.avx2 = f.fma = f.f16c = false;
    f.avx512f = f.avx512bw = f.avx512vl = f.avx512vnni = f.avxvnni = false;
  }
  auto [physical, logical] = count_cores();
  f.physical_cores = physical;
  f.logical_cpus = logical;
  return f;
}

}  // namespace

std::string CpuFeatures::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512vnni");
  add(avxvnni, "avxvnni");
  return s;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures kFeatures = detect();
  return kFeatures;
}

}  // namespace metro
