// metro quantize IN.gguf OUT.gguf --type q2_k|q3_k|q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k|f16|bf16|f32
//
// Rewrites every 2-D weight matrix in another block format (dequantize with the scalar
// reference, quantize with the scalar reference); 1-D tensors (norms, biases) stay as they
// are. Metadata is copied unchanged but for general.file_type. Requantizing an already
// quantized file adds the new format's error to the old one: meant for same-shaped files to
// benchmark and test with, not for producing models to serve.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <map>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"

namespace metro::cli {
namespace {

// GGUF general.file_type values (llama_ftype) for the formats metro writes.
const std::map<std::string, std::pair<kernels::DType, uint32_t>>& formats() {
  static const std::map<std::string, std::pair<kernels::DType, uint32_t>> m = {
      {"f32", {kernels::DType::kF32, 0}},   {"f16", {kernels::DType::kF16, 1}},
      {"q4_0", {kernels::DType::kQ4_0, 2}}, {"q4_1", {kernels::DType::kQ4_1, 3}},
      {"q8_0", {kernels::DType::kQ8_0, 7}}, {"q5_0", {kernels::DType::kQ5_0, 8}},
      {"q5_1", {kernels::DType::kQ5_1, 9}}, {"q4_k", {kernels::DType::kQ4_K, 15}},
      {"q5_k", {kernels::DType::kQ5_K, 17}}, {"q6_k", {kernels::DType::kQ6_K, 18}},
      {"q2_k", {kernels::DType::kQ2_K, 10}}, {"q3_k", {kernels::DType::kQ3_K, 11}},
      {"bf16", {kernels::DType::kBF16, 32}},
  };
  return m;
}

}  // namespace

int cmd_quantize(int argc, char** argv) {
  CLI::App app{"Rewrite a GGUF model's weight matrices in another format", "metro quantize"};
  std::string in_path, out_path, type_name;
  app.add_option("input", in_path, "GGUF file to read")->required();
  app.add_option("output", out_path, "GGUF file to write")->required();
  app.add_option("--type", type_name, "target format of 2-D weights")->required();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  std::transform(type_name.begin(), type_name.end(), type_name.begin(), ::tolower);
  auto it = formats().find(type_name);
  if (it == formats().end()) return fail("quantize", invalid_argument("unknown --type '" + type_name + "'"));
  const kernels::DType target = it->second.first;
  auto in = gguf::File::open(in_path);
  if (!in.ok()) return fail("quantize", in.status());

  gguf::Writer w;
  for (const auto& kv : in->metadata()) {
    if (kv.key == "general.file_type") continue;
    if (kv.key == "general.alignment") {
      w.set_alignment(static_cast<uint32_t>(*kv.value.as_uint()));
      continue;
    }
    w.add_value(kv.key, kv.value);
  }
  w.add_u32("general.file_type", it->second.second);
  const int64_t block = kernels::traits(target).block_size;
  std::vector<float> row;
  size_t converted = 0, kept = 0;
  for (const auto& t : in->tensors()) {
    std::vector<uint64_t> dims(t.ne, t.ne + t.n_dims);
    auto src_type = kernels::dtype_from_ggml(t.type());
    const bool matrix = t.n_dims == 2 && src_type && static_cast<int64_t>(t.ne[0]) % block == 0;
    if (!matrix) {
      auto st = w.add_tensor(t.name, t.type(), dims, {t.data, t.n_bytes});
      if (!st.ok()) return fail("quantize", st);
      ++kept;
      continue;
    }
    const int64_t cols = static_cast<int64_t>(t.ne[0]), rows = static_cast<int64_t>(t.ne[1]);
    const size_t in_rb = kernels::row_bytes(*src_type, cols), out_rb = kernels::row_bytes(target, cols);
    std::vector<uint8_t> out(out_rb * static_cast<size_t>(rows));
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      kernels::dequantize_row_ref(*src_type, t.data + static_cast<size_t>(r) * in_rb, row.data(), cols);
      kernels::quantize_row_ref(target, row.data(), out.data() + static_cast<size_t>(r) * out_rb, cols);
    }
    auto st = w.add_tensor(t.name, kernels::traits(target).ggml, dims, out);
    if (!st.ok()) return fail("quantize", st);
    ++converted;
  }
  auto st = w.write(out_path);
  if (!st.ok()) return fail("quantize", st);
  std::fprintf(stderr, "metro quantize: %zu matrices to %s, %zu tensors kept\n", converted,
               std::string(kernels::dtype_name(target)).c_str(), kept);
  return 0;
}

}  // namespace metro::cli
