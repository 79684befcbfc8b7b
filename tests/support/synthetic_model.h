// Small llama-family GGUF models with random weights, written by metro's GGUF writer, for
// tests of the forward pass against the reference forward pass.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/dtype.h"
#include "model/model.h"

namespace metro::testing {

struct SyntheticModelSpec {
  std::string arch = "llama";
  uint32_t n_embd = 256;
  uint32_t n_layer = 2;
  uint32_t n_head = 4;
  uint32_t n_head_kv = 2;
  uint32_t n_ff = 512;
  uint32_t n_vocab = 300;   // rows of the embedding and output matrices
  uint32_t n_tokens = 0;    // tokens in tokenizer.ggml.tokens; 0: n_vocab
  bool write_vocab_size = true;  // the {arch}.vocab_size key (= n_vocab)
  uint32_t n_ctx = 512;
  float rope_base = 10000.0f;
  kernels::DType matrix_type = kernels::DType::kF16;  // every 2-D weight
  kernels::DType embd_type = kernels::DType::kF16;
  bool tied_output = true;
  bool qkv_bias = false;
  bool qk_norm = false;   // per-head query and key norms (blk.N.attn_{q,k}_norm.weight)
  uint32_t head_dim = 0;  // 0: n_embd / n_head; otherwise written as attention.key_length
  bool post_norms = false;  // gemma3's post_attention_norm / post_ffw_norm
  bool fused = false;     // phi3's layout: attn_qkv.weight, and gate then up rows in ffn_up.weight
  uint32_t sliding_window = 0;  // written as attention.sliding_window when not 0
  float yarn_factor = 0;  // > 1: rope.scaling.type yarn with this factor
  uint32_t yarn_orig_ctx = 0;
  // phi3's LongRoPE: rope_factors_short / _long (fixed values, short near 1, long growing to
  // ~20 over the pairs) and rope.scaling.original_context_length when not 0.
  uint32_t longrope_orig_ctx = 0;
  float rope_attn_factor = 0;  // written as rope.scaling.attn_factor when not 0
  // Written as attn_logit_softcapping / final_logit_softcapping when not negative.
  float attn_softcap = -1;
  float final_softcap = -1;
  // Mixture of experts when n_expert > 0: every layer's FFN is a router and n_expert experts
  // n_ff_exp wide (3-D ffn_{gate,up,down}_exps tensors of expert_type), and a shared
  // expert n_ff_shexp wide when that is not 0 (with its sigmoid gate when shexp_gate).
  uint32_t n_expert = 0;
  uint32_t n_expert_used = 2;
  uint32_t n_ff_exp = 128;
  uint32_t n_ff_shexp = 0;
  bool shexp_gate = true;
  kernels::DType expert_type = kernels::DType::kF16;
  int expert_weights_norm = -1;  // written as expert_weights_norm when 0 or 1
  uint32_t expert_gating = 0;    // written as expert_gating_func when not 0
  uint64_t seed = 1;
  // Columns [begin, end) of every layer's attention output and FFN down projections set to
  // zero (whole blocks: what makes one tensor-parallel rank's partial sums exactly 0).
  struct Cols {
    uint32_t begin = 0, end = 0;
  };
  Cols zero_attn_output_cols, zero_ffn_down_cols;
};

// The GGUF bytes of such a model (a byte-level-free minimal "gpt2" vocabulary included).
std::vector<uint8_t> make_synthetic_model(const SyntheticModelSpec& spec);

// Such a model loaded on the default backend, beside the bytes it was parsed from (a test
// failure and a null model when it does not load).
struct LoadedSynthetic {
  std::vector<uint8_t> bytes;
  std::unique_ptr<model::Model> model;
};
LoadedSynthetic load_synthetic(const SyntheticModelSpec& spec);

// A qwen3moe (QK norms, untied head) of 8 experts of 96, 2 per token, every matrix `type`.
SyntheticModelSpec qwen3moe_spec(kernels::DType type);

// n token ids below `vocab`, from a generator seeded with `seed`.
std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed);

}  // namespace metro::testing
