// Hyperparameters of a llama-family model, read and validated from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf.h"

namespace metro::model {

enum class RopeType : uint8_t {
  kNormal,  // rotate adjacent pairs (x[2i], x[2i+1]): llama GGUFs (Q/K permuted at conversion)
  kNeox,    // rotate halves (x[i], x[i + n_rot/2]): qwen2 and others
};

enum class RopeScaling : uint8_t { kNone, kLinear, kYarn };

struct HParams {
  std::string architecture;  // "llama", "qwen2", ...
  std::string name;          // general.name, may be empty
  uint32_t n_ctx_train = 0;
  uint32_t n_embd = 0;
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;
  uint32_t head_dim = 0;  // per head, for K and Q (n_embd / n_head unless the file says)
  uint32_t head_dim_v = 0;
  uint32_t n_ff = 0;
  uint32_t n_vocab = 0;
  uint32_t n_rot = 0;  // rotary dimensions per head
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  RopeType rope_type = RopeType::kNormal;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scale_factor = 1.0f;  // context multiplier for linear scaling
  bool has_rope_freq_factors = false;  // llama3-style per-dimension factors (rope_freqs.weight)
  bool tied_output = false;            // no output.weight: the token embedding is the head
  bool has_qkv_bias = false;           // qwen2

  // Reads `{arch}.*` keys; validates ranges and consistency against the tensors present.
  // Architectures other than the llama family are refused by name.
  static Expected<HParams> from_gguf(const gguf::File& file);

  uint32_t n_gqa() const { return n_head / n_head_kv; }
  // Bytes of KV cache one token of context needs, all layers, at `bytes_per_elem`.
  uint64_t kv_bytes_per_token(double bytes_per_elem) const {
    return static_cast<uint64_t>(2.0 * n_layer * n_head_kv * head_dim * bytes_per_elem);
  }
};

// Whether an architecture name is one metro runs.
bool is_supported_architecture(const std::string& arch);

}  // namespace metro::model
