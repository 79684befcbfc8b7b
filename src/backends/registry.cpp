#include "backends/registry.h"

#include <charconv>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "kernels/kernel_set.h"

namespace metro::backends {

std::shared_ptr<Backend> default_backend() { return make_cpu_backend(kernels::active_kernel_set()); }

std::vector<std::shared_ptr<Backend>> available_backends() {
  std::vector<std::shared_ptr<Backend>> all;
  for (const kernels::KernelSet* set : kernels::kernel_sets()) all.push_back(make_cpu_backend(*set));
  if (cuda_device_count() > 0) {
    auto cuda = make_cuda_backend(0);
    if (cuda.ok()) all.push_back(std::move(cuda).value());
  }
  return all;
}

Expected<std::shared_ptr<Backend>> make_backend(std::string_view device) {
  if (device == "cpu") return default_backend();
  if (device == "cuda" || device.starts_with("cuda:")) {
    int index = 0;
    if (device.size() > 4) {
      const std::string_view num = device.substr(5);
      const auto [end, ec] = std::from_chars(num.data(), num.data() + num.size(), index);
      if (num.empty() || ec != std::errc() || end != num.data() + num.size() || index < 0) {
        return invalid_argument("--device: '" + std::string(device) + "' is not cuda:N");
      }
    }
    if (!cuda_compiled()) {
      return unavailable("--device cuda: this build of metro has no CUDA backend (configure with -DMETRO_CUDA=ON)");
    }
    const int n = cuda_device_count();
    if (n == 0) return unavailable("--device cuda: no CUDA device is present on this machine");
    if (index >= n) {
      return unavailable("--device " + std::string(device) + ": this machine has " + std::to_string(n) +
                         " CUDA device(s)");
    }
    return make_cuda_backend(index);
  }
  return invalid_argument("--device must be " + device_names() + ", not '" + std::string(device) + "'");
}

std::string device_names() { return "cpu|cuda"; }

}  // namespace metro::backends
