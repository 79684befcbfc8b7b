// What the CPU we run on can do; read once at start to pick kernel tables.
#pragma once

#include <string>

namespace metro {

struct CpuFeatures {
  bool sse42 = false;
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avxvnni = false;
  int physical_cores = 1;
  int logical_cpus = 1;

  // AVX2 + FMA + F16C: the level metro's main SIMD kernels need.
  bool has_avx2_level() const { return avx2 && fma && f16c; }
  std::string describe() const;
};

// Detected once and cached (immutable after first call).
const CpuFeatures& cpu_features();

}  // namespace metro
