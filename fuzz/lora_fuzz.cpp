// libFuzzer target: a LoRA adapter (untrusted GGUF bytes) merged into a small fixed model
// must be refused with an error or merged, never crash, hang or read out of bounds.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "kernels/dtype.h"
#include "kernels/quant_ref.h"
#include "model/lora.h"

namespace {

// The shapes of tests/fixtures/lora/llama_tiny.gguf's adapted matrices (its adapter is a
// seed), attn_q in Q8_0 and the others in F16.
std::vector<uint8_t> base_bytes() {
  metro::gguf::Writer w;
  w.add_string("general.architecture", "llama");
  const struct {
    const char* name;
    uint64_t n_in, n_out;
    metro::kernels::DType type;
  } mats[] = {{"attn_q", 64, 64, metro::kernels::DType::kQ8_0},
              {"attn_v", 64, 32, metro::kernels::DType::kF16},
              {"ffn_up", 64, 128, metro::kernels::DType::kF16},
              {"ffn_down", 128, 64, metro::kernels::DType::kF16}};
  for (int il = 0; il < 2; ++il) {
    for (const auto& m : mats) {
      std::vector<float> v(m.n_in * m.n_out);
      for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 7) * 0.01f - 0.03f;
      const size_t rb = metro::kernels::row_bytes(m.type, static_cast<int64_t>(m.n_in));
      std::vector<uint8_t> bytes(rb * m.n_out);
      for (uint64_t r = 0; r < m.n_out; ++r) {
        metro::kernels::quantize_row_ref(m.type, v.data() + r * m.n_in, bytes.data() + r * rb,
                                         static_cast<int64_t>(m.n_in));
      }
      const std::string name = "blk." + std::to_string(il) + "." + m.name + ".weight";
      (void)w.add_tensor(name, metro::kernels::traits(m.type).ggml, {m.n_in, m.n_out}, bytes);
    }
  }
  return w.serialize();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<uint8_t> base_data = base_bytes();
  static const auto base = metro::gguf::File::parse(base_data);
  if (!base.ok()) return 0;
  auto adapter = metro::gguf::File::parse(std::span<const uint8_t>(data, size));
  if (!adapter.ok()) return 0;
  const metro::gguf::File* files[] = {&*adapter};
  const metro::model::LoraSpec specs[] = {{"fuzz", 0.5f}};
  (void)metro::model::merge_lora(*base, files, specs);
  return 0;
}
