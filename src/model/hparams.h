// Hyperparameters of a llama-family model, read and validated from GGUF metadata.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/ops.h"

namespace metro::model {

enum class RopeType : uint8_t {
  kNormal,  // rotate adjacent pairs (x[2i], x[2i+1]): llama GGUFs (Q/K permuted at conversion)
  kNeox,    // rotate halves (x[i], x[i + n_rot/2]): qwen2 and others
};

enum class RopeScaling : uint8_t { kNone, kLinear, kYarn };

// How a mixture-of-experts router turns its scores into probabilities (GGUF
// `{arch}.expert_gating_func` values).
enum class ExpertGating : uint8_t { kSoftmax = 1, kSigmoid = 2 };

// How an encoder turns its tokens' final states into one vector (GGUF `{arch}.pooling_type`
// values).
enum class Pooling : uint8_t { kMean = 1, kCls = 2 };

struct HParams {
  // "llama", "mistral", "qwen2", "qwen3", "phi3", "gemma", "gemma2", "gemma3", "qwen2moe", "qwen3moe", "granite",
  // "olmo2", "bert", "nomic-bert"
  std::string architecture;
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
  float rms_eps = 1e-5f;  // the norms' epsilon (an encoder's layer norms' too)
  float rope_freq_base = 10000.0f;
  RopeType rope_type = RopeType::kNormal;
  RopeScaling rope_scaling = RopeScaling::kNone;
  float rope_scale_factor = 1.0f;  // context multiplier for linear and YaRN scaling
  uint32_t rope_orig_ctx = 0;      // YaRN, LongRoPE: the context before extension
  float yarn_beta_fast = 32.0f;    // YaRN: pairs turning more often than this keep their frequency
  float yarn_beta_slow = 1.0f;     // YaRN: pairs turning less often than this are interpolated
  float rope_attn_factor = 1.0f;   // factor on cos and sin (rope.scaling.attn_factor); YaRN's on top of its own
  // phi3 LongRoPE: per-pair frequency factors rope_factors_short / rope_factors_long, the
  // long ones for a context per sequence past rope_orig_ctx (as llama.cpp picks them).
  bool has_longrope = false;
  bool has_rope_freq_factors = false;  // llama3-style per-dimension factors (rope_freqs.weight)
  bool tied_output = false;            // no output.weight: the token embedding is the head
  bool has_qkv_bias = false;           // qwen2
  bool has_qk_norm = false;            // per-head RMS norms of Q and K before RoPE (qwen3)
  bool qk_norm_full = false;           // olmo2: those norms span all of Q and all of K, not each head
  // olmo2: no norm before attention or the FFN (blk.N.attn_norm / ffn_norm); they read the
  // stream itself and their outputs are normed (post norms) before they join it.
  bool pre_norms = true;
  bool fused_qkv = false;              // one attn_qkv.weight: Q rows, then K, then V (phi3)
  bool fused_gate_up = false;          // ffn_up.weight holds the gate rows, then the up rows (phi3)
  uint32_t sliding_window = 0;         // attention window in tokens; 0: none
  // The gemma family: embeddings times sqrt(n_embd) and a GELU-gated FFN (all); RMS norms of
  // the attention and FFN outputs before they join the stream (gemma2, gemma3); sliding-window
  // layers, all but every swa_pattern-th (gemma2: every other one; gemma3: five of six,
  // rotating with their own base and no scaling).
  float embd_scale = 1.0f;
  bool has_post_norms = false;  // blk.N.post_attention_norm / post_ffw_norm
  bool gelu_ffn = false;
  uint32_t swa_pattern = 0;           // 0: every layer alike
  float rope_freq_base_local = 0.0f;  // the sliding-window layers' base; 0: the global rotation
  // Soft-capping (gemma2; gemma3 files that ask for the final one): a value s becomes
  // cap * tanh(s / cap), for the scaled attention scores before the softmax and for the
  // output logits. 0: none.
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // The factor on q·k; 0: 1/sqrt(head_dim). The 27B gemma2 and gemma3 models scale by
  // 1/sqrt(n_embd / n_head) instead (their head_dim is not n_embd / n_head); granite files
  // give theirs.
  float attn_scale = 0.0f;
  // granite: each attention and FFN output is multiplied by residual_scale before it joins
  // the stream, and the logits are divided by logit_scale.
  float residual_scale = 1.0f;
  float logit_scale = 1.0f;
  // bert: an encoder. Bidirectional attention over the whole input (it must be computed in
  // one step, and no prefix of it can be reused), learned position and token-type
  // embeddings, layer norms with biases after each sublayer, biases on every product, an
  // exact-GELU FFN without a gate, no output head: it makes embeddings only.
  bool encoder = false;
  // nomic-bert: an encoder that rotates queries and keys (NeoX pairs) instead of adding
  // learned positions, with a fused QKV matrix and a SiLU-gated FFN, biases optional.
  bool encoder_rope = false;
  Pooling pooling = Pooling::kMean;
  // Mixture of experts (qwen2moe, qwen3moe; llama and mistral files with experts: Mixtral).
  // Each layer's FFN is a router (blk.N.ffn_gate_inp) picking n_expert_used of n_expert
  // expert FFNs n_ff_exp wide (blk.N.ffn_{gate,up,down}_exps, one 3-D tensor each), their
  // outputs summed with the router's probabilities as weights (rescaled to sum 1 when
  // expert_weights_norm); qwen2moe adds a shared expert n_ff_shexp wide
  // (blk.N.ffn_{gate,up,down}_shexp) scaled by a sigmoid gate (blk.N.ffn_gate_inp_shexp).
  uint32_t n_expert = 0;  // 0: a dense FFN
  uint32_t n_expert_used = 0;
  uint32_t n_ff_exp = 0;
  uint32_t n_ff_shexp = 0;  // 0: no shared expert
  bool has_shexp_gate = false;
  bool expert_weights_norm = false;
  ExpertGating expert_gating = ExpertGating::kSoftmax;

  // Reads `{arch}.*` keys; validates ranges and consistency against the tensors present.
  // Architectures other than those of is_supported_architecture are refused by name.
  static Expected<HParams> from_gguf(const gguf::File& file);

  uint32_t n_gqa() const { return n_head / n_head_kv; }
  float attention_scale() const {
    return attn_scale > 0.0f ? attn_scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
  }
  bool is_moe() const { return n_expert > 0; }
  // The hidden width of the FFN a tensor-parallel rank slices: each expert's when routed.
  uint32_t ffn_width() const { return is_moe() ? n_ff_exp : n_ff; }
  // Bytes of KV cache one token of context needs, all layers, at `bytes_per_elem`.
  uint64_t kv_bytes_per_token(double bytes_per_elem) const {
    return static_cast<uint64_t>(2.0 * n_layer * n_head_kv * head_dim * bytes_per_elem);
  }
  // Whether layer il is a sliding-window layer with the local rotation.
  bool is_local_layer(uint32_t il) const { return swa_pattern > 0 && il % swa_pattern < swa_pattern - 1; }
  // Layer il's attention window in tokens (0: full causal attention): gemma3's local layers,
  // or every layer of a model with a window and no pattern (mistral).
  // Whether a context of n_ctx tokens per sequence (0: the trained one) takes LongRoPE's
  // long factors.
  bool long_rope(int n_ctx) const {
    return has_longrope && static_cast<uint32_t>(n_ctx > 0 ? n_ctx : static_cast<int>(n_ctx_train)) > rope_orig_ctx;
  }
  uint32_t layer_window(uint32_t il) const {
    if (sliding_window == 0) return 0;
    return swa_pattern == 0 || is_local_layer(il) ? sliding_window : 0;
  }
};

// The rotary embedding these parameters describe; `freq_factors` (rope_freqs.weight, n_rot/2
// values) or null.
kernels::RopeConfig rope_config(const HParams& hp, const float* freq_factors);
// The rotation of the sliding-window layers: rope_freq_base_local unscaled, or the global
// rotation when that is 0.
kernels::RopeConfig local_rope_config(const HParams& hp);

// Whether an architecture name is one metro runs.
bool is_supported_architecture(const std::string& arch);

}  // namespace metro::model
