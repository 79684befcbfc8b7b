// The CUDA backend: weights, the KV arena and the step's activations in the memory of one
// NVIDIA GPU, every op of a step run by kernels on one stream (docs/cuda.md). A build
// without CUDA (METRO_CUDA=OFF) still has these functions: they report no device.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "backends/backend.h"
#include "base/status.h"

namespace metro::backends {

// Whether this build holds the CUDA backend.
bool cuda_compiled();

// CUDA devices usable at run time: 0 in a build without CUDA, without a driver, or when
// the runtime reports an error.
int cuda_device_count();

// A CUDA backend on device `device` (its name is "cuda-sm" and the compute capability,
// e.g. "cuda-sm90"); unavailable when there is no such device or the build has no CUDA.
Expected<std::shared_ptr<Backend>> make_cuda_backend(int device = 0);

// What `metro inspect --device cuda` reports of a device.
struct CudaDeviceInfo {
  std::string name;           // e.g. "NVIDIA H200"
  size_t memory_bytes = 0;    // global memory
  int major = 0, minor = 0;   // compute capability
  int multiprocessors = 0;
};
Expected<CudaDeviceInfo> cuda_device_info(int device = 0);

}  // namespace metro::backends
