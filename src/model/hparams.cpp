#include "model/hparams.h"

#include <cmath>
#include <string>

#include "kernels/encoder.h"

namespace metro::model {

bool is_supported_architecture(const std::string& arch) {
  return arch == "llama" || arch == "qwen2" || arch == "qwen3" || arch == "mistral" || arch == "phi3" ||
         arch == "gemma" || arch == "gemma2" || arch == "gemma3" || arch == "qwen2moe" || arch == "qwen3moe" ||
         arch == "granite" || arch == "olmo2" || arch == "bert" || arch == "nomic-bert";
}

namespace {

Status bad(const std::string& msg) { return data_loss("model metadata: " + msg); }

// Reads a positive u32 `{arch}.suffix` (required).
Expected<uint32_t> req_u32(const gguf::File& f, const std::string& key, uint32_t max) {
  METRO_ASSIGN_OR_RETURN(uint32_t v, f.get_u32(key));
  if (v == 0 || v > max) {
    return bad("'" + key + "' = " + std::to_string(v) + " is outside [1, " +
               std::to_string(max) + "]");
  }
  return v;
}

Expected<uint32_t> opt_u32(const gguf::File& f, const std::string& key, uint32_t dflt,
                           uint32_t max) {
  if (!f.has(key)) return dflt;
  return req_u32(f, key, max);
}

// The vocabulary and the rows of the output and embedding matrices must match one for one
// (docs/reliability.md 39). A row without a token could be sampled and would print as
// nothing; a token without a row would index past the matrix. GGUF converters pad a
// vocabulary (to a multiple of 64 or 128, say) by listing placeholder tokens for the extra
// rows, so the list always covers every row; no metadata declares rows past the list to be
// padding, and such a file is refused rather than guessed at. Shapes otherwise are checked
// when the weights are bound.
Status check_vocabulary_rows(const gguf::File& f, uint32_t n_vocab) {
  const gguf::Value* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->is_array()) return {};  // no vocabulary in the file
  const uint64_t n_tokens = tokens->array_size();
  for (const char* name : {"output.weight", "token_embd.weight"}) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (t == nullptr || t->n_dims != 2 || t->ne[1] == n_tokens) continue;
    const std::string rows = std::to_string(t->ne[1]), toks = std::to_string(n_tokens);
    return bad("tensor '" + std::string(name) + "' has " + rows +
               " rows but the vocabulary (tokenizer.ggml.tokens) has " + toks + " tokens: " +
               (t->ne[1] > n_tokens ? "rows " + toks + " and up have no token to print"
                                    : "tokens " + rows + " and up have no row"));
  }
  if (n_tokens != n_vocab) {
    return bad("vocab_size is " + std::to_string(n_vocab) + " but the vocabulary (tokenizer.ggml.tokens) has " +
               std::to_string(n_tokens) + " tokens");
  }
  return {};
}

// Kernels' and buffers' bounds on a router: experts per layer and per token.
constexpr uint32_t kMaxExperts = 512;
constexpr uint32_t kMaxExpertsUsed = 64;

// The mixture-of-experts keys (HParams::n_expert and after). llama.cpp's choices where a
// file is silent: qwen2moe keeps the chosen probabilities as they are, qwen3moe and
// Mixtral rescale them to sum 1; an `expert_weights_norm` key overrides.
Status read_experts(const gguf::File& f, const std::string& a, HParams& h) {
  const bool moe_arch = h.architecture == "qwen2moe" || h.architecture == "qwen3moe";
  if (f.has(a + "expert_count")) {
    METRO_ASSIGN_OR_RETURN(h.n_expert, f.get_u32(a + "expert_count"));
  }
  if (h.n_expert == 0) {
    if (moe_arch) return bad("a " + h.architecture + " model needs '" + a + "expert_count' above 0");
    return {};
  }
  if (h.encoder || h.architecture.starts_with("gemma") || h.architecture == "phi3" || h.fused_gate_up) {
    return unimplemented("experts in a " + h.architecture + " model");
  }
  if (h.n_expert > kMaxExperts) {
    return unimplemented(std::to_string(h.n_expert) + " experts per layer (at most " + std::to_string(kMaxExperts) + ")");
  }
  METRO_ASSIGN_OR_RETURN(h.n_expert_used, req_u32(f, a + "expert_used_count", h.n_expert));
  if (h.n_expert_used > kMaxExpertsUsed) {
    return unimplemented(std::to_string(h.n_expert_used) + " experts per token (at most " +
                         std::to_string(kMaxExpertsUsed) + ")");
  }
  const uint32_t dflt_ff = h.architecture == "qwen2moe" ? h.n_ff / h.n_expert_used : h.n_ff;
  METRO_ASSIGN_OR_RETURN(h.n_ff_exp, opt_u32(f, a + "expert_feed_forward_length", dflt_ff, 1u << 20));
  if (h.n_ff_exp == 0) return bad("the experts' feed-forward length is 0");
  h.expert_weights_norm = h.architecture != "qwen2moe";
  if (f.has(a + "expert_weights_norm")) {
    METRO_ASSIGN_OR_RETURN(h.expert_weights_norm, f.get_bool(a + "expert_weights_norm"));
  }
  if (f.has(a + "expert_gating_func")) {
    METRO_ASSIGN_OR_RETURN(uint32_t g, f.get_u32(a + "expert_gating_func"));
    if (g != 1 && g != 2) {
      return unimplemented("expert gating function " + std::to_string(g) + " (softmax = 1 and sigmoid = 2 are supported)");
    }
    h.expert_gating = static_cast<ExpertGating>(g);
  }
  for (const char* key : {"expert_group_count", "leading_dense_block_count"}) {
    if (f.has(a + key)) return unimplemented("'" + a + key + "' (expert groups and dense leading layers)");
  }
  if (f.find_tensor("blk.0.exp_probs_b.bias") != nullptr) {
    return unimplemented("a router selection bias (blk.N.exp_probs_b)");
  }
  if (f.find_tensor("blk.0.ffn_gate_shexp.weight") != nullptr) {
    const uint32_t dflt_sh = h.n_ff;
    METRO_ASSIGN_OR_RETURN(h.n_ff_shexp, opt_u32(f, a + "expert_shared_feed_forward_length", dflt_sh, 1u << 20));
    h.has_shexp_gate = f.find_tensor("blk.0.ffn_gate_inp_shexp.weight") != nullptr;
  } else if (h.architecture == "qwen2moe") {
    return bad("a qwen2moe model needs a shared expert; tensor 'blk.0.ffn_gate_shexp.weight' is missing");
  }
  return {};
}

}  // namespace

Expected<HParams> HParams::from_gguf(const gguf::File& f) {
  HParams h;
  METRO_ASSIGN_OR_RETURN(std::string_view arch, f.get_string("general.architecture"));
  h.architecture = std::string(arch);
  if (!is_supported_architecture(h.architecture)) {
    return unimplemented("architecture '" + h.architecture.substr(0, 64) +
                         "' is not supported (llama, mistral, qwen2, qwen3, phi3, gemma, gemma2, gemma3, qwen2moe, qwen3moe, "
                         "granite, olmo2, bert, nomic-bert are)");
  }
  if (auto n = f.get_string("general.name"); n.ok()) h.name = std::string(*n);
  const std::string a = h.architecture + ".";

  METRO_ASSIGN_OR_RETURN(h.n_embd, req_u32(f, a + "embedding_length", 1u << 16));
  METRO_ASSIGN_OR_RETURN(h.n_layer, req_u32(f, a + "block_count", 1024));
  METRO_ASSIGN_OR_RETURN(h.n_head, req_u32(f, a + "attention.head_count", 1024));
  METRO_ASSIGN_OR_RETURN(h.n_head_kv, opt_u32(f, a + "attention.head_count_kv", h.n_head, 1024));
  METRO_ASSIGN_OR_RETURN(h.n_ff, req_u32(f, a + "feed_forward_length", 1u << 20));
  METRO_ASSIGN_OR_RETURN(h.n_ctx_train, opt_u32(f, a + "context_length", 2048, 1u << 24));

  if (h.n_head % h.n_head_kv != 0) {
    return bad("head_count " + std::to_string(h.n_head) + " is not a multiple of head_count_kv " +
               std::to_string(h.n_head_kv));
  }
  const bool explicit_dim = f.has(a + "attention.key_length");
  if (!explicit_dim && h.n_embd % h.n_head != 0) {
    return bad("embedding_length " + std::to_string(h.n_embd) +
               " is not a multiple of head_count " + std::to_string(h.n_head));
  }
  METRO_ASSIGN_OR_RETURN(h.head_dim,
                         opt_u32(f, a + "attention.key_length", h.n_embd / h.n_head, 1024));
  METRO_ASSIGN_OR_RETURN(h.head_dim_v, opt_u32(f, a + "attention.value_length", h.head_dim, 1024));
  if (h.head_dim_v != h.head_dim) return unimplemented("value_length differs from key_length");
  if (h.head_dim % 2 != 0) return bad("head dimension " + std::to_string(h.head_dim) + " is odd");
  // The attention kernels hold a head in registers and stack tiles of at most 256 values.
  if (h.head_dim > 256) {
    return unimplemented("head dimension " + std::to_string(h.head_dim) + " is above the 256 the attention kernels take");
  }
  METRO_ASSIGN_OR_RETURN(h.n_rot, opt_u32(f, a + "rope.dimension_count", h.head_dim, h.head_dim));
  if (h.n_rot % 2 != 0) return bad("rope.dimension_count is odd");

  if (h.architecture == "bert" || h.architecture == "nomic-bert") {
    h.encoder = true;
    h.encoder_rope = h.architecture == "nomic-bert";
    h.rms_eps = 1e-12f;
    if (f.has(a + "attention.layer_norm_epsilon")) {
      METRO_ASSIGN_OR_RETURN(h.rms_eps, f.get_f32(a + "attention.layer_norm_epsilon"));
      if (!(h.rms_eps > 0.0f && h.rms_eps < 1.0f)) return bad("layer norm epsilon out of range");
    }
    if (h.n_head_kv != h.n_head) return unimplemented("an encoder with grouped key/value heads");
    if (h.n_ctx_train > static_cast<uint32_t>(kernels::kMaxEncoderTokens)) {
      return unimplemented("an encoder context of " + std::to_string(h.n_ctx_train) + " tokens (at most " +
                           std::to_string(kernels::kMaxEncoderTokens) + ")");
    }
    if (f.has(a + "pooling_type")) {
      METRO_ASSIGN_OR_RETURN(uint32_t pt, f.get_u32(a + "pooling_type"));
      if (pt == 2) {
        h.pooling = Pooling::kCls;
      } else if (pt != 1) {
        return unimplemented("pooling type " + std::to_string(pt) + " (mean = 1 and CLS = 2 are supported)");
      }
    }
  }
  if (f.has(a + "attention.layer_norm_rms_epsilon")) {
    METRO_ASSIGN_OR_RETURN(h.rms_eps, f.get_f32(a + "attention.layer_norm_rms_epsilon"));
    if (!(h.rms_eps > 0.0f && h.rms_eps < 1.0f)) return bad("rms epsilon out of range");
  }
  if (f.has(a + "rope.freq_base")) {
    METRO_ASSIGN_OR_RETURN(h.rope_freq_base, f.get_f32(a + "rope.freq_base"));
    if (!(h.rope_freq_base > 1.0f && std::isfinite(h.rope_freq_base))) {
      return bad("rope.freq_base out of range");
    }
  }
  if (f.has(a + "rope.scaling.type")) {
    METRO_ASSIGN_OR_RETURN(std::string_view st, f.get_string(a + "rope.scaling.type"));
    if (st == "linear") {
      h.rope_scaling = RopeScaling::kLinear;
    } else if (st == "yarn") {
      h.rope_scaling = RopeScaling::kYarn;
    } else if (st != "none") {
      return unimplemented("rope scaling type '" + std::string(st.substr(0, 32)) + "'");
    }
  }
  if (h.rope_scaling != RopeScaling::kNone && f.has(a + "rope.scaling.factor")) {
    METRO_ASSIGN_OR_RETURN(h.rope_scale_factor, f.get_f32(a + "rope.scaling.factor"));
    if (!(h.rope_scale_factor >= 1.0f && h.rope_scale_factor <= 1024.0f)) {
      return bad("rope.scaling.factor out of range");
    }
  }
  auto opt_f32 = [&](const std::string& key, float& v, float lo, float hi) -> Status {
    if (!f.has(key)) return {};
    METRO_ASSIGN_OR_RETURN(v, f.get_f32(key));
    if (!(v >= lo && v <= hi)) return bad("'" + key + "' out of range");
    return {};
  };
  // A factor on cos and sin (so on every attention score, squared) with any scaling: YaRN's
  // own on top of its ln-rule, phi3's LongRoPE one alone.
  METRO_RETURN_IF_ERROR(opt_f32(a + "rope.scaling.attn_factor", h.rope_attn_factor, 0.01f, 100.0f));
  // phi3's LongRoPE: two sets of per-pair frequency factors, the long one for contexts past
  // the original.
  h.has_longrope = f.find_tensor("rope_factors_long.weight") != nullptr;
  if (h.has_longrope && f.find_tensor("rope_factors_short.weight") == nullptr) {
    return bad("tensor 'rope_factors_long.weight' needs 'rope_factors_short.weight' beside it");
  }
  if (h.rope_scaling == RopeScaling::kYarn || h.has_longrope) {
    METRO_ASSIGN_OR_RETURN(h.rope_orig_ctx, opt_u32(f, a + "rope.scaling.original_context_length", h.n_ctx_train,
                                                    1u << 24));
  }
  if (h.rope_scaling == RopeScaling::kYarn) {
    METRO_RETURN_IF_ERROR(opt_f32(a + "rope.scaling.yarn_beta_fast", h.yarn_beta_fast, 0.01f, 1e4f));
    METRO_RETURN_IF_ERROR(opt_f32(a + "rope.scaling.yarn_beta_slow", h.yarn_beta_slow, 0.01f, 1e4f));
    if (h.yarn_beta_slow >= h.yarn_beta_fast) return bad("rope.scaling.yarn_beta_slow must be below yarn_beta_fast");
    if (h.has_longrope) return bad("LongRoPE factors with YaRN scaling");
  }
  // The Qwen families rotate halves; llama and mistral GGUFs had Q and K permuted for
  // adjacent pairs at conversion.
  const bool gemma = h.architecture == "gemma" || h.architecture == "gemma2" || h.architecture == "gemma3";
  h.rope_type = h.architecture == "qwen2" || h.architecture == "qwen3" || h.architecture == "phi3" || gemma ||
                        h.architecture == "qwen2moe" || h.architecture == "qwen3moe" || h.architecture == "nomic-bert" ||
                        h.architecture == "olmo2"
                    ? RopeType::kNeox
                    : RopeType::kNormal;
  if (h.architecture == "gemma2") h.sliding_window = 4096;  // gemma2's window where the file is silent
  if (f.has(a + "attention.sliding_window")) {
    METRO_ASSIGN_OR_RETURN(h.sliding_window, f.get_u32(a + "attention.sliding_window"));
  }
  if (gemma) {
    h.embd_scale = std::sqrt(static_cast<float>(h.n_embd));
    h.gelu_ffn = true;
  }
  // The 27B models of gemma2 (46 layers) and gemma3 (62) scale queries by the model width
  // per head, which is not their head_dim.
  if ((h.architecture == "gemma2" && h.n_layer == 46) || (h.architecture == "gemma3" && h.n_layer == 62)) {
    h.attn_scale = 1.0f / std::sqrt(static_cast<float>(h.n_embd / h.n_head));
  }
  auto softcap = [&](const std::string& key, float dflt, float& v) -> Status {
    v = dflt;
    if (f.has(key)) {
      METRO_ASSIGN_OR_RETURN(v, f.get_f32(key));
    }
    if (!(v >= 0.0f && v <= 1e6f)) return bad("'" + key + "' out of range");
    return {};
  };
  if (h.architecture == "gemma2") {
    h.has_post_norms = true;
    if (h.sliding_window > 0) {
      // Every other layer windowed, from the first; they rotate as the global layers do.
      METRO_ASSIGN_OR_RETURN(h.swa_pattern, opt_u32(f, a + "attention.sliding_window_pattern", 2, 1024));
      if (f.has(a + "rope.freq_base_swa")) {
        METRO_ASSIGN_OR_RETURN(h.rope_freq_base_local, f.get_f32(a + "rope.freq_base_swa"));
        if (!(h.rope_freq_base_local > 1.0f && std::isfinite(h.rope_freq_base_local))) {
          return bad("rope.freq_base_swa out of range");
        }
      }
    }
    METRO_RETURN_IF_ERROR(softcap(a + "attn_logit_softcapping", 50.0f, h.attn_softcap));
    METRO_RETURN_IF_ERROR(softcap(a + "final_logit_softcapping", 30.0f, h.final_softcap));
  }
  if (h.architecture == "granite") {
    // llama's layer with four factors: on the embeddings, on q·k (instead of 1/sqrt of the
    // head size), on each sublayer's output before it joins the stream, and the logits
    // divided by the last (which the file must give). 0 in the file means none, as
    // llama.cpp reads it.
    auto factor = [&](const std::string& key, bool required, float& v) -> Status {
      if (!f.has(key)) return required ? bad("'" + key + "' missing") : Status{};
      float x = 0.0f;
      METRO_ASSIGN_OR_RETURN(x, f.get_f32(key));
      if (!(std::isfinite(x) && x >= 0.0f && x <= 1e6f) || (required && x == 0.0f)) {
        return bad("'" + key + "' out of range");
      }
      if (x > 0.0f) v = x;
      return {};
    };
    METRO_RETURN_IF_ERROR(factor(a + "embedding_scale", false, h.embd_scale));
    METRO_RETURN_IF_ERROR(factor(a + "attention.scale", false, h.attn_scale));
    METRO_RETURN_IF_ERROR(factor(a + "residual_scale", false, h.residual_scale));
    METRO_RETURN_IF_ERROR(factor(a + "logit_scale", true, h.logit_scale));
  }
  if (h.architecture == "gemma3") {
    h.has_post_norms = true;
    METRO_RETURN_IF_ERROR(softcap(a + "final_logit_softcapping", 0.0f, h.final_softcap));
    if (h.sliding_window > 0) {
      // By default five sliding-window layers to each global one; they rotate at their own
      // base (10000 unless the file says) and unscaled.
      h.swa_pattern = 6;
      if (f.has(a + "attention.sliding_window_pattern")) {
        METRO_ASSIGN_OR_RETURN(h.swa_pattern, req_u32(f, a + "attention.sliding_window_pattern", 1024));
      }
      h.rope_freq_base_local = 10000.0f;
      if (f.has(a + "rope.freq_base_swa")) {
        METRO_ASSIGN_OR_RETURN(h.rope_freq_base_local, f.get_f32(a + "rope.freq_base_swa"));
        if (!(h.rope_freq_base_local > 1.0f && std::isfinite(h.rope_freq_base_local))) {
          return bad("rope.freq_base_swa out of range");
        }
      }
    }
  }

  if (f.has(a + "vocab_size")) {
    METRO_ASSIGN_OR_RETURN(h.n_vocab, req_u32(f, a + "vocab_size", 1u << 22));
  } else {
    METRO_ASSIGN_OR_RETURN(size_t nv, f.get_array_size("tokenizer.ggml.tokens"));
    if (nv == 0 || nv > (1u << 22)) return bad("vocabulary size out of range");
    h.n_vocab = static_cast<uint32_t>(nv);
  }
  METRO_RETURN_IF_ERROR(check_vocabulary_rows(f, h.n_vocab));

  // Consistency with the tensors present (docs/reliability.md 4): a layer count far above the
  // tensors in the file is refused here, with the first missing tensor's name.
  if (h.architecture == "olmo2") {
    // Norms after attention and the FFN only, and query and key norms over the whole
    // projections.
    h.pre_norms = false;
    h.has_post_norms = true;
    h.qk_norm_full = true;
    if (h.sliding_window > 0) {
      return unimplemented("olmo2 files with sliding-window layers (Olmo 3's layout) are not supported");
    }
  }
  for (uint32_t il = 0; il < h.n_layer; ++il) {
    std::string name = "blk." + std::to_string(il) +
                       (h.encoder ? ".attn_output_norm.weight" : h.pre_norms ? ".attn_norm.weight" : ".post_attention_norm.weight");
    if (!f.find_tensor(name)) {
      return bad("block_count is " + std::to_string(h.n_layer) + " but tensor '" + name +
                 "' is missing");
    }
  }
  h.tied_output = !h.encoder && f.find_tensor("output.weight") == nullptr;
  h.has_qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  h.has_qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  h.fused_qkv = f.find_tensor("blk.0.attn_qkv.weight") != nullptr;
  h.fused_gate_up = !h.encoder && f.find_tensor("blk.0.ffn_gate.weight") == nullptr && f.find_tensor("blk.0.ffn_up.weight") != nullptr;
  if (f.find_tensor("blk.0.rope_factors_long.weight") != nullptr) {
    return unimplemented("per-layer LongRoPE factors (blk.N.rope_factors_long); one global pair is supported");
  }
  if (h.architecture == "olmo2" && !h.has_qk_norm) {
    return bad("an olmo2 model needs query and key norms; tensor 'blk.0.attn_q_norm.weight' is missing");
  }
  if ((h.architecture == "qwen3" || h.architecture == "qwen3moe") && !h.has_qk_norm) {
    return bad("a " + h.architecture + " model needs per-head query and key norms; tensor 'blk.0.attn_q_norm.weight' is missing");
  }
  METRO_RETURN_IF_ERROR(read_experts(f, a, h));
  if (!h.pre_norms && h.is_moe()) {
    // The router and the experts read the normed stream, which a layer without pre-norms
    // does not make.
    return unimplemented(h.architecture + " with experts is not supported");
  }
  h.has_rope_freq_factors = f.find_tensor("rope_freqs.weight") != nullptr;
  return h;
}

kernels::RopeConfig local_rope_config(const HParams& hp) {
  if (hp.rope_freq_base_local <= 0.0f) return rope_config(hp, nullptr);
  kernels::RopeConfig rc;
  rc.head_dim = static_cast<int>(hp.head_dim);
  rc.n_rot = static_cast<int>(hp.n_rot);
  rc.freq_base = hp.rope_freq_base_local;
  rc.mode = hp.rope_type == RopeType::kNeox ? kernels::RopeMode::kNeox : kernels::RopeMode::kNormal;
  return rc;
}

kernels::RopeConfig rope_config(const HParams& hp, const float* freq_factors) {
  kernels::RopeConfig rc;
  rc.head_dim = static_cast<int>(hp.head_dim);
  rc.n_rot = static_cast<int>(hp.n_rot);
  rc.freq_base = hp.rope_freq_base;
  rc.linear_scale = hp.rope_scaling == RopeScaling::kLinear ? hp.rope_scale_factor : 1.0f;
  rc.freq_factors = freq_factors;
  rc.mode = hp.rope_type == RopeType::kNeox ? kernels::RopeMode::kNeox : kernels::RopeMode::kNormal;
  if (hp.rope_scaling == RopeScaling::kYarn) {
    rc.yarn.factor = hp.rope_scale_factor;
    rc.yarn.orig_ctx = static_cast<int>(hp.rope_orig_ctx);
    rc.yarn.beta_fast = hp.yarn_beta_fast;
    rc.yarn.beta_slow = hp.yarn_beta_slow;
    rc.yarn.attn_factor = hp.rope_attn_factor;
  } else {
    rc.attn_factor = hp.rope_attn_factor;
  }
  return rc;
}

}  // namespace metro::model
