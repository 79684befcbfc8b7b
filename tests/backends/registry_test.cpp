// Which backends a machine offers and what `--device` selects: the CPU always, the CUDA
// backend exactly when the build has it and a device answers; any other name, or CUDA
// where there is none, is a clear error rather than a crash. Runs on every machine.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"
#include "support/test_util.h"

namespace metro::backends {
namespace {

bool is_cuda(const std::shared_ptr<Backend>& b) { return std::string(b->name()).starts_with("cuda-"); }

TEST(BackendRegistry, CpuIsTheDefaultDevice) {
  auto b = make_backend("cpu");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ((*b)->name(), default_backend()->name());
}

TEST(BackendRegistry, UnknownDevicesAreRefusedByName) {
  for (const char* name : {"", "gpu", "CUDA", "cuda:", "cuda:x", "cuda:-1", "cpu0"}) {
    auto b = make_backend(name);
    ASSERT_FALSE(b.ok()) << name;
    EXPECT_NE(b.status().message().find("--device"), std::string::npos) << b.status().message();
  }
}

TEST(BackendRegistry, CudaIsOfferedExactlyWhenADeviceIsPresent) {
  const int n = cuda_device_count();
  if (!cuda_compiled()) {
    EXPECT_EQ(n, 0);
  }
  const auto all = available_backends();
  const auto cuda = std::count_if(all.begin(), all.end(), is_cuda);
  EXPECT_EQ(cuda, n > 0 ? 1 : 0);
  auto b = make_backend("cuda");
  if (n == 0) {
    ASSERT_FALSE(b.ok());
    EXPECT_NE(b.status().message().find("CUDA"), std::string::npos) << b.status().message();
    std::printf("no CUDA device here (%s): --device cuda is refused with: %s\n",
                cuda_compiled() ? "built with CUDA" : "built without CUDA", b.status().message().c_str());
  } else {
    ASSERT_TRUE(b.ok()) << b.status().message();
    EXPECT_TRUE(is_cuda(*b)) << (*b)->name();
    auto info = cuda_device_info(0);
    ASSERT_TRUE(info.ok()) << info.status().message();
    EXPECT_GT(info->memory_bytes, 0u);
    EXPECT_EQ(std::string((*b)->name()), "cuda-sm" + std::to_string(info->major) + std::to_string(info->minor));
  }
  EXPECT_FALSE(make_backend("cuda:" + std::to_string(n)).ok());
}

// The CLI refuses --device cuda without a device with a message and exit code 1.
TEST(BackendRegistry, CliRefusesAMissingDeviceCleanly) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present: nothing to refuse";
  REQUIRE_MODEL();
  const auto r = metro::testing::run_metro(
      {"bench", "-m", metro::testing::default_model_path(), "--device", "cuda", "-p", "8", "-n", "2", "-r", "1"});
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_EQ(r.signal, 0);
  EXPECT_NE(r.err.find("--device cuda"), std::string::npos) << r.err;
  const auto bad = metro::testing::run_metro({"bench", "-m", metro::testing::default_model_path(), "--device", "tpu"});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
}

}  // namespace
}  // namespace metro::backends
