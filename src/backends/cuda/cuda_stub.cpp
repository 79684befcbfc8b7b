// The CUDA backend's entry points in a build without CUDA: no device, a clear refusal.
#include "backends/cuda/cuda_backend.h"

#ifndef METRO_HAVE_CUDA

namespace metro::backends {

bool cuda_compiled() { return false; }

int cuda_device_count() { return 0; }

Expected<std::shared_ptr<Backend>> make_cuda_backend(int) {
  return unavailable("this build of metro has no CUDA backend (configure with -DMETRO_CUDA=ON where nvcc is found)");
}

Expected<CudaDeviceInfo> cuda_device_info(int) {
  return unavailable("this build of metro has no CUDA backend (configure with -DMETRO_CUDA=ON where nvcc is found)");
}

}  // namespace metro::backends

#endif
