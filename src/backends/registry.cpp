#include "backends/registry.h"

#include "backends/cpu/cpu_backend.h"
#include "kernels/kernel_set.h"

namespace metro::backends {

std::shared_ptr<Backend> default_backend() { return make_cpu_backend(kernels::active_kernel_set()); }

std::vector<std::shared_ptr<Backend>> available_backends() {
  std::vector<std::shared_ptr<Backend>> all;
  for (const kernels::KernelSet* set : kernels::kernel_sets()) all.push_back(make_cpu_backend(*set));
  return all;
}

}  // namespace metro::backends
