#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "gguf/gguf.h"
#include "kernels/quant_ref.h"
#include "support/synthetic_model.h"
#include "support/test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;

TEST(QuantizeCli, RewritesMatricesAndKeepsEverythingElse) {
  metro::testing::SyntheticModelSpec spec;
  spec.matrix_type = kernels::DType::kF16;
  TempFile in, out;
  in.write(metro::testing::make_synthetic_model(spec));
  auto r = run_metro({"quantize", in.path(), out.path(), "--type", "q8_0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto a = gguf::File::open(in.path());
  auto b = gguf::File::open(out.path());
  ASSERT_TRUE(a.ok() && b.ok()) << b.status().message();
  // Metadata: the same keys with the same values, file_type added.
  for (const auto& kv : a->metadata()) {
    const gguf::Value* v = b->find(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->to_display_string(1 << 20), kv.value.to_display_string(1 << 20)) << kv.key;
  }
  EXPECT_EQ(*b->get_u32("general.file_type"), 7u);
  ASSERT_EQ(a->tensors().size(), b->tensors().size());
  for (const auto& t : a->tensors()) {
    const gguf::TensorInfo* u = b->find_tensor(t.name);
    ASSERT_NE(u, nullptr);
    EXPECT_EQ(u->shape_string(), t.shape_string());
    if (t.n_dims == 2) {
      EXPECT_EQ(u->type(), gguf::GgmlType::kQ8_0) << t.name;
      // Values are the originals within Q8_0's rounding.
      const int64_t n = static_cast<int64_t>(t.ne[0]);
      std::vector<float> x(static_cast<size_t>(n)), y(static_cast<size_t>(n));
      kernels::dequantize_row_ref(kernels::DType::kF16, t.data, x.data(), n);
      kernels::dequantize_row_ref(kernels::DType::kQ8_0, u->data, y.data(), n);
      for (int64_t i = 0; i < n; i += 32) {
        float amax = 0;
        for (int64_t k = i; k < i + 32; ++k) amax = std::max(amax, std::fabs(x[static_cast<size_t>(k)]));
        for (int64_t k = i; k < i + 32; ++k) {
          ASSERT_NEAR(y[static_cast<size_t>(k)], x[static_cast<size_t>(k)], amax / 127 * 0.5 + amax * 1e-3);
        }
      }
    } else {
      EXPECT_EQ(u->type(), t.type());
      EXPECT_EQ(0, std::memcmp(u->data, t.data, t.n_bytes));
    }
  }
  auto bad = run_metro({"quantize", in.path(), out.path(), "--type", "q3_x"});
  EXPECT_EQ(bad.exit_code, 1);
}

}  // namespace
}  // namespace metro
