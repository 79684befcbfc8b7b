// Hugging Face decoders to GGUF: llama (and mistral, mixtral), qwen2, qwen3 (and qwen3_moe),
// phi3, gemma, gemma2, gemma3. See convert.h for what each carries over.
#include <cmath>
#include <cstring>
#include <map>
#include <regex>

#include "convert/convert_internal.h"
#include "convert/hf_tokenizer.h"

namespace metro::convert::detail {

namespace {

struct DecoderConfig {
  std::string arch;  // GGUF general.architecture
  uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_kv = 0, n_ff = 0, n_ctx = 0, n_vocab = 0, head_dim = 0;
  float eps = 1e-6f;
  float theta = 10000.0f;
  bool tied = false;
  bool qkv_bias = false;
  bool o_bias = false;
  bool qk_norm = false;
  // llama.cpp rotates adjacent pairs for the llama architecture, where Hugging Face rotates
  // the two halves of a head: the converter reorders Q's and K's rows to match.
  bool permute_qk = false;
  uint32_t sliding_window = 0;
  // gemma3: every swa_pattern-th layer global, the others windowed and rotated at their own
  // base; norms stored as an offset from 1 (Hugging Face multiplies by 1 + w, llama.cpp's
  // GGUF stores the factor itself).
  uint32_t swa_pattern = 0;
  float rope_local_base = 10000.0f;  // gemma3's; gemma2's windowed layers rotate as the others
  // gemma2: attention scores and logits capped by tanh (0: none).
  float attn_softcap = 0.0f, final_softcap = 0.0f;
  // granite: factors on the embeddings, on q·k, on each sublayer's output before it joins the
  // stream, and the logits divided by logit_scale.
  float embd_scale = 1.0f, attn_scale = 0.0f, residual_scale = 1.0f, logit_scale = 1.0f;
  // phi3: Q, K and V in one matrix (attn_qkv), gate and up in one (ffn_up, gate rows first),
  // a rotation of the first n_rot dimensions of each head (partial_rotary_factor), and
  // LongRoPE: per-pair factors for contexts up to and past rope_orig_ctx, with a factor on
  // cos and sin.
  bool fused = false;
  uint32_t n_rot = 0;  // 0: head_dim
  std::vector<float> longrope_short, longrope_long;
  float longrope_attn_factor = 1.0f;
  bool norm_plus_one = false;
  std::string rope_type;  // "", "linear", "yarn", "llama3"
  float rope_factor = 1.0f;
  uint32_t rope_orig_ctx = 0;
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
  std::optional<float> yarn_beta_fast, yarn_beta_slow;
  // Mixture of experts (qwen2_moe, qwen3_moe, mixtral): every layer's FFN is n_expert experts
  // of n_ff_exp, n_expert_used per token, their weights rescaled to sum 1 or not; qwen2_moe
  // adds a shared expert n_ff_shexp wide behind a sigmoid gate.
  uint32_t n_expert = 0, n_expert_used = 0, n_ff_exp = 0, n_ff_shexp = 0;
  bool expert_weights_norm = true;
};

// The experts of a mixture-of-experts config; every layer must be sparse.
Status moe_config(const json& c, const std::string& type, DecoderConfig& d) {
  const bool mixtral = type == "mixtral";
  METRO_ASSIGN_OR_RETURN(d.n_expert, cfg_u32(c, mixtral ? "num_local_experts" : "num_experts", 512));
  METRO_ASSIGN_OR_RETURN(d.n_expert_used, cfg_u32(c, "num_experts_per_tok", 64));
  if (d.n_expert_used > d.n_expert) return data_loss("config.json: more experts per token than experts");
  if (mixtral) {
    d.n_ff_exp = d.n_ff;  // Mixtral's intermediate_size is each expert's
  } else {
    METRO_ASSIGN_OR_RETURN(d.n_ff_exp, cfg_u32(c, "moe_intermediate_size", 1u << 20));
    // transformers' defaults: Qwen2-MoE keeps the chosen probabilities, Qwen3-MoE rescales.
    d.expert_weights_norm = cfg_bool(c, "norm_topk_prob", type != "qwen2_moe");
    if (type == "qwen2_moe") {
      METRO_ASSIGN_OR_RETURN(d.n_ff_shexp, cfg_u32(c, "shared_expert_intermediate_size", 1u << 20));
    }
    if (c.contains("mlp_only_layers") && c["mlp_only_layers"].is_array() && !c["mlp_only_layers"].empty()) {
      return unimplemented("config.json: mlp_only_layers (dense layers among the sparse ones) is not supported");
    }
    if (c.contains("decoder_sparse_step") && c["decoder_sparse_step"] != 1) {
      return unimplemented("config.json: decoder_sparse_step other than 1 (dense layers between sparse ones) is not supported");
    }
  }
  return {};
}

// Gemma 2's and 3's own settings: GELU (tanh) gating, windowed layers with a pattern (gemma3:
// with their own RoPE base), attention scaled by the head width (the 27B models: by the
// width per head, which is what llama.cpp derives from their layer count), soft-capping
// (gemma2; gemma3 may cap its logits).
Status gemma_config(const json& c, DecoderConfig& d) {
  const bool g1 = d.arch == "gemma", g2 = d.arch == "gemma2";
  // transformers runs Gemma's GELU in its tanh form unless hidden_activation says otherwise
  // (the first Gemma's hidden_act "gelu" included).
  std::string act = "gelu_pytorch_tanh";
  if (c.contains("hidden_activation") && c["hidden_activation"].is_string()) {
    act = c["hidden_activation"].get<std::string>();
  } else if (!g1 && c.contains("hidden_act") && c["hidden_act"].is_string()) {
    act = c["hidden_act"].get<std::string>();
  }
  if (act != "gelu_pytorch_tanh") {
    return unimplemented("config.json: hidden_activation '" + act.substr(0, 32) + "' (gelu_pytorch_tanh is supported)");
  }
  auto cap = [&](const char* key, float& v) -> Status {
    if (!c.contains(key) || c[key].is_null()) return {};
    METRO_ASSIGN_OR_RETURN(v, cfg_f32(c, key, 0.0f, 0.0f, 1e6f));
    return {};
  };
  METRO_RETURN_IF_ERROR(cap("final_logit_softcapping", d.final_softcap));
  METRO_RETURN_IF_ERROR(cap("attn_logit_softcapping", d.attn_softcap));
  if (!g2 && d.attn_softcap != 0.0f) {
    return unimplemented("config.json: attn_logit_softcapping in a " + d.arch + " model");
  }
  if (g1) {
    if (d.final_softcap != 0.0f) return unimplemented("config.json: final_logit_softcapping in a gemma model");
    d.norm_plus_one = true;
    d.tied = true;
    return {};
  }
  if (c.contains("query_pre_attn_scalar") && !c["query_pre_attn_scalar"].is_null()) {
    METRO_ASSIGN_OR_RETURN(uint32_t q, cfg_u32(c, "query_pre_attn_scalar", 1u << 16));
    const bool big = d.n_layer == (g2 ? 46u : 62u);  // the 27B models
    if (q != (big ? d.n_embd / d.n_head : d.head_dim)) {
      return unimplemented("config.json: query_pre_attn_scalar " + std::to_string(q) + " is not " +
                           (big ? "hidden_size / num_attention_heads" : "head_dim") +
                           ", the scale llama.cpp and metro give this model");
    }
  }
  METRO_ASSIGN_OR_RETURN(d.sliding_window, cfg_u32(c, "sliding_window", 1u << 24));
  if (!g2) {
    METRO_ASSIGN_OR_RETURN(d.rope_local_base, cfg_f32(c, "rope_local_base_freq", 10000.0f, 1.0f, 1e12f));
  }
  d.norm_plus_one = true;
  d.tied = true;
  if (g2) {
    // Every other layer windowed, from the first.
    d.swa_pattern = 2;
    if (c.contains("layer_types") && c["layer_types"].is_array()) {
      const json& lt = c["layer_types"];
      if (lt.size() != d.n_layer) return data_loss("config.json: layer_types does not list every layer");
      for (uint32_t il = 0; il < d.n_layer; ++il) {
        if (lt[il] != (il % 2 == 0 ? "sliding_attention" : "full_attention")) {
          return unimplemented("config.json: layer_types does not alternate windowed and global layers from the first");
        }
      }
    }
    return {};
  }
  // Which layers are global: every pattern-th one, from layer_types or sliding_window_pattern.
  if (c.contains("layer_types") && c["layer_types"].is_array()) {
    const json& lt = c["layer_types"];
    if (lt.size() != d.n_layer) return data_loss("config.json: layer_types does not list every layer");
    uint32_t first_full = 0;
    while (first_full < d.n_layer && lt[first_full] != "full_attention") ++first_full;
    d.swa_pattern = first_full + 1;
    for (uint32_t il = 0; il < d.n_layer; ++il) {
      const bool full = (il + 1) % d.swa_pattern == 0;
      if (lt[il] != (full ? "full_attention" : "sliding_attention")) {
        return unimplemented("config.json: layer_types is not one global layer every " + std::to_string(d.swa_pattern) +
                             ", the only arrangement metro runs");
      }
    }
  } else {
    d.swa_pattern = 6;
    if (c.contains("sliding_window_pattern")) {
      METRO_ASSIGN_OR_RETURN(d.swa_pattern, cfg_u32(c, "sliding_window_pattern", 1024));
    }
  }
  return {};
}

// Phi-3's own settings: the fused matrices, partial rotation and LongRoPE ("longrope", or
// "su" as the first Phi-3 configs call it), written as llama.cpp's phi3 converter writes it:
// the factors as rope_factors_short / rope_factors_long, the original context, and
// sqrt(1 + ln(max / original) / ln(original)) on cos and sin.
Status phi3_config(const json& c, DecoderConfig& d) {
  d.fused = true;
  d.n_rot = d.head_dim;
  if (c.contains("partial_rotary_factor") && !c["partial_rotary_factor"].is_null()) {
    METRO_ASSIGN_OR_RETURN(float f, cfg_f32(c, "partial_rotary_factor", 1.0f, 0.01f, 1.0f));
    const double rot = static_cast<double>(f) * d.head_dim;
    d.n_rot = static_cast<uint32_t>(std::lround(rot));
    if (std::fabs(rot - d.n_rot) > 1e-3 || d.n_rot == 0 || d.n_rot % 2 != 0) {
      return data_loss("config.json: partial_rotary_factor does not give an even number of rotated dimensions");
    }
  }
  if (!c.contains("rope_scaling") || !c["rope_scaling"].is_object()) return {};
  const json& rs = c["rope_scaling"];
  const std::string t = rs.value("rope_type", rs.value("type", std::string()));
  if (t.empty() || t == "default") return {};
  if (t != "longrope" && t != "su") {
    return unimplemented("config.json: a phi3 rope_scaling type '" + t.substr(0, 32) + "' (longrope is supported)");
  }
  for (const char* key : {"short_mscale", "long_mscale"}) {
    if (rs.contains(key) && !rs[key].is_null()) return unimplemented(std::string("config.json: rope_scaling's ") + key);
  }
  auto factors = [&](const char* key, std::vector<float>& out) -> Status {
    if (!rs.contains(key) || !rs[key].is_array() || rs[key].size() != d.n_rot / 2) {
      return data_loss(std::string("config.json: rope_scaling's ") + key + " must list n_rot / 2 = " +
                       std::to_string(d.n_rot / 2) + " numbers");
    }
    for (const json& v : rs[key]) {
      if (!v.is_number() || !(v.get<double>() > 0.0) || !std::isfinite(v.get<double>())) {
        return data_loss(std::string("config.json: rope_scaling's ") + key + " holds a value that is not a positive number");
      }
      out.push_back(v.get<float>());
    }
    return {};
  };
  METRO_RETURN_IF_ERROR(factors("short_factor", d.longrope_short));
  METRO_RETURN_IF_ERROR(factors("long_factor", d.longrope_long));
  const json& src = c.contains("original_max_position_embeddings") ? c : rs;
  METRO_ASSIGN_OR_RETURN(d.rope_orig_ctx, cfg_u32(src, "original_max_position_embeddings", 1u << 24));
  const double scale = static_cast<double>(d.n_ctx) / d.rope_orig_ctx;
  d.longrope_attn_factor =
      scale > 1.0 ? static_cast<float>(std::sqrt(1.0 + std::log(scale) / std::log(static_cast<double>(d.rope_orig_ctx))))
                  : 1.0f;
  return {};
}

Expected<DecoderConfig> decoder_config(const json& c, const std::string& type) {
  DecoderConfig d;
  const bool gemma3 = type == "gemma3_text" || type == "gemma3";
  const bool gemma = gemma3 || type == "gemma2" || type == "gemma";
  d.arch = type == "mistral" || type == "mixtral" ? "llama"
           : gemma3                                ? "gemma3"
           : type == "qwen3_moe"                   ? "qwen3moe"
           : type == "qwen2_moe"                   ? "qwen2moe"
                                                   : type;
  METRO_ASSIGN_OR_RETURN(d.n_embd, cfg_u32(c, "hidden_size", 1u << 16));
  METRO_ASSIGN_OR_RETURN(d.n_layer, cfg_u32(c, "num_hidden_layers", 1024));
  METRO_ASSIGN_OR_RETURN(d.n_head, cfg_u32(c, "num_attention_heads", 1024));
  d.n_kv = d.n_head;
  if (c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()) {
    METRO_ASSIGN_OR_RETURN(d.n_kv, cfg_u32(c, "num_key_value_heads", 1024));
  }
  METRO_ASSIGN_OR_RETURN(d.n_ff, cfg_u32(c, "intermediate_size", 1u << 20));
  METRO_ASSIGN_OR_RETURN(d.n_ctx, cfg_u32(c, "max_position_embeddings", 1u << 24));
  METRO_ASSIGN_OR_RETURN(d.n_vocab, cfg_u32(c, "vocab_size", 1u << 22));
  if (d.n_head % d.n_kv != 0) return data_loss("config.json: num_attention_heads is not a multiple of num_key_value_heads");
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    METRO_ASSIGN_OR_RETURN(d.head_dim, cfg_u32(c, "head_dim", 1024));
  } else {
    if (d.n_embd % d.n_head != 0) return data_loss("config.json: hidden_size is not a multiple of num_attention_heads");
    d.head_dim = d.n_embd / d.n_head;
  }
  if (d.head_dim % 2 != 0) return data_loss("config.json: the head width is odd");
  METRO_ASSIGN_OR_RETURN(d.eps, cfg_f32(c, "rms_norm_eps", 1e-6f, 1e-12f, 0.1f));
  METRO_ASSIGN_OR_RETURN(d.theta, cfg_f32(c, "rope_theta", 10000.0f, 1.0f, 1e12f));
  // transformers' defaults: llama, mistral, granite and olmo2 untied, the Qwen configs say, Gemma tied.
  d.tied = cfg_bool(c, "tie_word_embeddings", type != "llama" && type != "mistral" && type != "mixtral" &&
                                                  type != "granite" && type != "olmo2");
  if (gemma) {
    METRO_RETURN_IF_ERROR(gemma_config(c, d));
  } else {
    const std::string act = c.value("hidden_act", std::string("silu"));
    if (act != "silu") return unimplemented("config.json: hidden_act '" + act.substr(0, 32) + "' (silu is supported)");
  }
  if (cfg_bool(c, "mlp_bias", false)) return unimplemented("config.json: mlp_bias (biases on the FFN) is not supported");
  if (type == "qwen2" || type == "qwen2_moe") {
    d.qkv_bias = true;  // Qwen2's attention always has them
    if (cfg_bool(c, "use_sliding_window", false)) {
      return unimplemented("config.json: use_sliding_window (Qwen2's windowed layers) is not supported");
    }
  } else {
    d.qkv_bias = d.o_bias = cfg_bool(c, "attention_bias", false);
    if (d.o_bias) return unimplemented("config.json: attention_bias (biases on Q, K, V and the output) is not supported");
  }
  d.qk_norm = type == "qwen3" || type == "qwen3_moe" || gemma3 || type == "olmo2";
  if (type == "qwen3_moe" || type == "qwen2_moe" || type == "mixtral") METRO_RETURN_IF_ERROR(moe_config(c, type, d));
  d.permute_qk = d.arch == "llama" || d.arch == "granite";
  if (type == "granite") {
    // transformers' defaults are 1: attention_multiplier then replaces 1/sqrt(head_dim).
    METRO_ASSIGN_OR_RETURN(d.embd_scale, cfg_f32(c, "embedding_multiplier", 1.0f, 1e-6f, 1e6f));
    METRO_ASSIGN_OR_RETURN(d.attn_scale, cfg_f32(c, "attention_multiplier", 1.0f, 1e-6f, 1e6f));
    METRO_ASSIGN_OR_RETURN(d.residual_scale, cfg_f32(c, "residual_multiplier", 1.0f, 1e-6f, 1e6f));
    METRO_ASSIGN_OR_RETURN(d.logit_scale, cfg_f32(c, "logits_scaling", 1.0f, 1e-6f, 1e6f));
  }
  // A window below the context is kept (phi3's too: llama.cpp reads that key and ignores it).
  if ((type == "mistral" || type == "mixtral" || type == "phi3") && c.contains("sliding_window") &&
      c["sliding_window"].is_number_unsigned()) {
    const uint64_t w = c["sliding_window"].get<uint64_t>();
    if (w > 0 && w < d.n_ctx) d.sliding_window = static_cast<uint32_t>(w);
  }
  if (type == "phi3") METRO_RETURN_IF_ERROR(phi3_config(c, d));
  if (type != "phi3" && c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
    const json& rs = c["rope_scaling"];
    std::string t = rs.value("rope_type", rs.value("type", std::string()));
    if (t == "default") t.clear();
    if (!t.empty()) {
      if (t != "linear" && t != "yarn" && t != "llama3") {
        return unimplemented("config.json: rope_scaling type '" + t.substr(0, 32) + "' (linear, yarn and llama3 are supported)");
      }
      d.rope_type = t;
      METRO_ASSIGN_OR_RETURN(d.rope_factor, cfg_f32(rs, "factor", 0.0f, 1e-3f, 1e4f));
      if (t != "linear") {
        METRO_ASSIGN_OR_RETURN(d.rope_orig_ctx, cfg_u32(rs, "original_max_position_embeddings", 1u << 24));
      }
      if (t == "llama3") {
        METRO_ASSIGN_OR_RETURN(d.low_freq_factor, cfg_f32(rs, "low_freq_factor", 1.0f, 1e-3f, 1e4f));
        METRO_ASSIGN_OR_RETURN(d.high_freq_factor, cfg_f32(rs, "high_freq_factor", 4.0f, 1e-3f, 1e4f));
        if (!(d.high_freq_factor > d.low_freq_factor)) return data_loss("config.json: rope_scaling's high_freq_factor is not above low_freq_factor");
      }
      if (t == "yarn") {
        if (rs.contains("attention_factor") && !rs["attention_factor"].is_null()) {
          return unimplemented("config.json: yarn's attention_factor is not carried over");
        }
        if (rs.contains("beta_fast")) {
          METRO_ASSIGN_OR_RETURN(float v, cfg_f32(rs, "beta_fast", 32.0f, 0.01f, 1e4f));
          d.yarn_beta_fast = v;
        }
        if (rs.contains("beta_slow")) {
          METRO_ASSIGN_OR_RETURN(float v, cfg_f32(rs, "beta_slow", 1.0f, 0.01f, 1e4f));
          d.yarn_beta_slow = v;
        }
      }
    }
  }
  return d;
}

// llama.cpp's GGUF name of a decoder tensor; nullopt for tensors it does not keep (RoPE's
// cached frequencies, a head tied to the embedding); an error for anything else.
Expected<std::optional<std::string>> decoder_name(const std::string& hf_name, const DecoderConfig& d) {
  std::string hf = hf_name;
  if (d.arch == "gemma3") {
    // Gemma3ForConditionalGeneration: the language model under a prefix, the vision tower
    // and its projector beside it (not converted).
    if (hf.starts_with("vision_tower.") || hf.starts_with("multi_modal_projector.")) return std::optional<std::string>();
    if (hf.starts_with("language_model.")) hf = hf.substr(15);
    if (hf.starts_with("model.language_model.")) hf = "model." + hf.substr(21);
  }
  if (hf.ends_with("rotary_emb.inv_freq")) return std::optional<std::string>();
  if (hf == "model.embed_tokens.weight") return std::optional<std::string>("token_embd.weight");
  if (hf == "model.norm.weight") return std::optional<std::string>("output_norm.weight");
  if (hf == "lm_head.weight") return d.tied ? std::optional<std::string>() : std::optional<std::string>("output.weight");
  static const std::map<std::string, std::string> kGemmaNorms = {
      {"post_attention_layernorm", "post_attention_norm"},
      {"pre_feedforward_layernorm", "ffn_norm"},
      {"post_feedforward_layernorm", "post_ffw_norm"},
  };
  static const std::map<std::string, std::string> kLayer = {
      {"input_layernorm", "attn_norm"},  {"post_attention_layernorm", "ffn_norm"},
      {"self_attn.q_proj", "attn_q"},    {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},    {"self_attn.o_proj", "attn_output"},
      {"self_attn.q_norm", "attn_q_norm"}, {"self_attn.k_norm", "attn_k_norm"},
      {"self_attn.qkv_proj", "attn_qkv"}, {"mlp.gate_up_proj", "ffn_up"},
      {"mlp.gate_proj", "ffn_gate"},     {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},
  };
  static const std::regex kRe(R"(model\.layers\.(\d{1,4})\.(.+)\.(weight|bias))");
  std::smatch m;
  if (d.n_expert > 0 && std::regex_match(hf, m, kRe)) {
    // An expert's matrix: "blk.N.ffn_<x>_exps.weight#E", stacked when the file is written.
    static const std::regex kExpert(R"((?:mlp|block_sparse_moe)\.experts\.(\d{1,4})\.(gate_proj|up_proj|down_proj|w1|w2|w3))");
    std::smatch e;
    const std::string inner = m[2].str();
    if (std::regex_match(inner, e, kExpert) && m[3] == "weight") {
      static const std::map<std::string, std::string> kPart = {{"gate_proj", "gate"}, {"w1", "gate"}, {"up_proj", "up"},
                                                               {"w3", "up"},          {"down_proj", "down"}, {"w2", "down"}};
      return std::optional<std::string>("blk." + m[1].str() + ".ffn_" + kPart.at(e[2].str()) + "_exps.weight#" + e[1].str());
    }
    if ((inner == "mlp.gate" || inner == "block_sparse_moe.gate") && m[3] == "weight") {
      return std::optional<std::string>("blk." + m[1].str() + ".ffn_gate_inp.weight");
    }
    static const std::map<std::string, std::string> kShared = {{"mlp.shared_expert.gate_proj", "ffn_gate_shexp"},
                                                               {"mlp.shared_expert.up_proj", "ffn_up_shexp"},
                                                               {"mlp.shared_expert.down_proj", "ffn_down_shexp"},
                                                               {"mlp.shared_expert_gate", "ffn_gate_inp_shexp"}};
    if (auto it = kShared.find(inner); d.n_ff_shexp > 0 && it != kShared.end() && m[3] == "weight") {
      return std::optional<std::string>("blk." + m[1].str() + "." + it->second + ".weight");
    }
  }
  if (std::regex_match(hf, m, kRe)) {
    if (d.arch == "gemma3" || d.arch == "gemma2" || d.arch == "olmo2") {
      if (auto it = kGemmaNorms.find(m[2].str()); it != kGemmaNorms.end()) {
        return std::optional<std::string>("blk." + m[1].str() + "." + it->second + "." + m[3].str());
      }
    }
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) {
      return std::optional<std::string>("blk." + m[1].str() + "." + it->second + "." + m[3].str());
    }
  }
  return unimplemented("tensor '" + hf.substr(0, 128) + "' is not part of a " + d.arch + " decoder this converter knows");
}

// Rows of each head in llama.cpp's order: Hugging Face keeps a head's rotated pairs as its
// first and second halves (row i with row i + d/2); llama.cpp rotates rows 2i and 2i + 1.
std::vector<float> permute_heads(const std::vector<float>& v, uint32_t rows, uint32_t n_heads) {
  const size_t cols = v.size() / rows;
  const uint32_t hd = rows / n_heads, half = hd / 2;
  std::vector<float> out(v.size());
  for (uint32_t h = 0; h < n_heads; ++h) {
    for (uint32_t i = 0; i < half; ++i) {
      for (uint32_t j = 0; j < 2; ++j) {
        const size_t to = static_cast<size_t>(h) * hd + 2 * i + j;
        const size_t from = static_cast<size_t>(h) * hd + j * half + i;
        std::memcpy(out.data() + to * cols, v.data() + from * cols, cols * sizeof(float));
      }
    }
  }
  return out;
}

// Llama 3's RoPE scaling as per-frequency divisors (GGUF rope_freqs.weight): wavelengths
// longer than the original context / low_freq_factor are divided by the factor, those
// shorter than it / high_freq_factor kept, those between blended by where they fall.
std::vector<float> llama3_rope_factors(const DecoderConfig& d) {
  std::vector<float> out;
  const double lo_wavelen = d.rope_orig_ctx / static_cast<double>(d.low_freq_factor);
  const double hi_wavelen = d.rope_orig_ctx / static_cast<double>(d.high_freq_factor);
  for (uint32_t i = 0; i < d.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(static_cast<double>(d.theta), static_cast<double>(i) / d.head_dim);
    const double wavelen = 2.0 * M_PI / freq;
    double f = 1.0;
    if (wavelen > lo_wavelen) {
      f = d.rope_factor;
    } else if (wavelen >= hi_wavelen) {
      const double smooth = (d.rope_orig_ctx / wavelen - d.low_freq_factor) / (d.high_freq_factor - d.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / d.rope_factor + smooth);
    }
    out.push_back(static_cast<float>(f));
  }
  return out;
}

}  // namespace

Expected<Prepared> convert_decoder(const std::string& dir, const json& cfg, const std::string& type,
                                   const ConvertOptions& opts) {
  METRO_ASSIGN_OR_RETURN(DecoderConfig d, decoder_config(cfg, type));
  METRO_ASSIGN_OR_RETURN(Prepared out, start(dir, cfg, d.arch, opts));
  gguf::Writer& w = out.w;
  const std::string a = d.arch + ".";
  w.add_u32(a + "context_length", d.n_ctx);
  w.add_u32(a + "embedding_length", d.n_embd);
  w.add_u32(a + "block_count", d.n_layer);
  w.add_u32(a + "feed_forward_length", d.n_ff);
  w.add_u32(a + "attention.head_count", d.n_head);
  w.add_u32(a + "attention.head_count_kv", d.n_kv);
  w.add_f32(a + "attention.layer_norm_rms_epsilon", d.eps);
  w.add_f32(a + "rope.freq_base", d.theta);
  w.add_u32(a + "rope.dimension_count", d.n_rot > 0 ? d.n_rot : d.head_dim);
  if (d.head_dim * d.n_head != d.n_embd) {
    w.add_u32(a + "attention.key_length", d.head_dim);
    w.add_u32(a + "attention.value_length", d.head_dim);
  }
  w.add_u32(a + "vocab_size", d.n_vocab);
  if (d.n_expert > 0) {
    w.add_u32(a + "expert_count", d.n_expert);
    w.add_u32(a + "expert_used_count", d.n_expert_used);
    w.add_u32(a + "expert_feed_forward_length", d.n_ff_exp);
    // Written where it differs from what the architecture implies (qwen2moe: not rescaled).
    if (d.expert_weights_norm != (d.arch != "qwen2moe")) w.add_bool(a + "expert_weights_norm", d.expert_weights_norm);
    if (d.n_ff_shexp > 0) w.add_u32(a + "expert_shared_feed_forward_length", d.n_ff_shexp);
  }
  if (d.sliding_window > 0) w.add_u32(a + "attention.sliding_window", d.sliding_window);
  if (d.swa_pattern > 0) {
    w.add_u32(a + "attention.sliding_window_pattern", d.swa_pattern);
    if (d.arch == "gemma3") w.add_f32(a + "rope.freq_base_swa", d.rope_local_base);
  }
  if (d.arch == "gemma2") w.add_f32(a + "attn_logit_softcapping", d.attn_softcap);
  if (d.arch == "granite") {
    w.add_f32(a + "embedding_scale", d.embd_scale);
    w.add_f32(a + "attention.scale", d.attn_scale);
    w.add_f32(a + "residual_scale", d.residual_scale);
    w.add_f32(a + "logit_scale", d.logit_scale);
  }
  if (d.final_softcap > 0.0f) w.add_f32(a + "final_logit_softcapping", d.final_softcap);
  if (!d.longrope_long.empty()) {
    w.add_u32(a + "rope.scaling.original_context_length", d.rope_orig_ctx);
    w.add_f32(a + "rope.scaling.attn_factor", d.longrope_attn_factor);
  }
  if (d.rope_type == "linear" || d.rope_type == "yarn") {
    w.add_string(a + "rope.scaling.type", d.rope_type);
    w.add_f32(a + "rope.scaling.factor", d.rope_factor);
    if (d.rope_type == "yarn") {
      w.add_u32(a + "rope.scaling.original_context_length", d.rope_orig_ctx);
      if (d.yarn_beta_fast) w.add_f32(a + "rope.scaling.yarn_beta_fast", *d.yarn_beta_fast);
      if (d.yarn_beta_slow) w.add_f32(a + "rope.scaling.yarn_beta_slow", *d.yarn_beta_slow);
    }
  }
  TokenizerInfo tok;
  METRO_RETURN_IF_ERROR(write_hf_tokenizer(dir, w, &tok));
  if (tok.pre.empty()) return unimplemented("tokenizer.json: a decoder needs a byte-level BPE tokenizer; this one is WordPiece");
  if (tok.n_vocab != static_cast<int>(d.n_vocab)) {
    return data_loss("tokenizer.json has " + std::to_string(tok.n_vocab) + " tokens; config.json's vocab_size is " +
                     std::to_string(d.n_vocab));
  }

  const uint64_t q_rows = static_cast<uint64_t>(d.n_head) * d.head_dim, kv_rows = static_cast<uint64_t>(d.n_kv) * d.head_dim;
  std::map<std::string, std::vector<uint64_t>> want = {
      {"token_embd.weight", {d.n_vocab, d.n_embd}},
      {"output_norm.weight", {d.n_embd}},
  };
  if (!d.tied) want["output.weight"] = {d.n_vocab, d.n_embd};
  for (uint32_t il = 0; il < d.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    if (d.arch != "olmo2") {  // olmo2 norms only the sublayers' outputs
      want[p + "attn_norm.weight"] = {d.n_embd};
      want[p + "ffn_norm.weight"] = {d.n_embd};
    }
    if (d.arch == "gemma3" || d.arch == "gemma2" || d.arch == "olmo2") {
      want[p + "post_attention_norm.weight"] = {d.n_embd};
      want[p + "post_ffw_norm.weight"] = {d.n_embd};
    }
    if (d.fused) {
      want[p + "attn_qkv.weight"] = {q_rows + 2 * kv_rows, d.n_embd};
    } else {
      want[p + "attn_q.weight"] = {q_rows, d.n_embd};
      want[p + "attn_k.weight"] = {kv_rows, d.n_embd};
      want[p + "attn_v.weight"] = {kv_rows, d.n_embd};
    }
    want[p + "attn_output.weight"] = {d.n_embd, q_rows};
    if (d.qkv_bias) {
      want[p + "attn_q.bias"] = {q_rows};
      want[p + "attn_k.bias"] = {kv_rows};
      want[p + "attn_v.bias"] = {kv_rows};
    }
    if (d.qk_norm && d.arch == "olmo2") {  // over all of Q and all of K
      want[p + "attn_q_norm.weight"] = {q_rows};
      want[p + "attn_k_norm.weight"] = {kv_rows};
    } else if (d.qk_norm) {
      want[p + "attn_q_norm.weight"] = {d.head_dim};
      want[p + "attn_k_norm.weight"] = {d.head_dim};
    }
    if (d.n_expert > 0) {
      want[p + "ffn_gate_inp.weight"] = {d.n_expert, d.n_embd};
      for (uint32_t e = 0; e < d.n_expert; ++e) {
        const std::string x = "#" + std::to_string(e);
        want[p + "ffn_gate_exps.weight" + x] = {d.n_ff_exp, d.n_embd};
        want[p + "ffn_up_exps.weight" + x] = {d.n_ff_exp, d.n_embd};
        want[p + "ffn_down_exps.weight" + x] = {d.n_embd, d.n_ff_exp};
      }
      if (d.n_ff_shexp > 0) {
        want[p + "ffn_gate_shexp.weight"] = {d.n_ff_shexp, d.n_embd};
        want[p + "ffn_up_shexp.weight"] = {d.n_ff_shexp, d.n_embd};
        want[p + "ffn_down_shexp.weight"] = {d.n_embd, d.n_ff_shexp};
        want[p + "ffn_gate_inp_shexp.weight"] = {1, d.n_embd};
      }
    } else if (d.fused) {
      want[p + "ffn_up.weight"] = {2ull * d.n_ff, d.n_embd};
      want[p + "ffn_down.weight"] = {d.n_embd, d.n_ff};
    } else {
      want[p + "ffn_gate.weight"] = {d.n_ff, d.n_embd};
      want[p + "ffn_up.weight"] = {d.n_ff, d.n_embd};
      want[p + "ffn_down.weight"] = {d.n_embd, d.n_ff};
    }
  }
  std::map<std::string, const StTensor*> found;
  uint64_t source_bytes = 0;
  METRO_RETURN_IF_ERROR(collect_tensors(
      *out.ck, [&](const std::string& hf) { return decoder_name(hf, d); }, want, found, source_bytes));
  int n_tensors = 0;
  if (d.rope_type == "llama3") {
    const std::vector<float> f = llama3_rope_factors(d);
    METRO_RETURN_IF_ERROR(w.add_tensor("rope_freqs.weight", kernels::traits(DType::kF32).ggml, {f.size()},
                                       {reinterpret_cast<const uint8_t*>(f.data()), f.size() * sizeof(float)}));
    ++n_tensors;
  }
  for (const auto& [name, f] : {std::pair<const char*, const std::vector<float>&>{"rope_factors_short.weight", d.longrope_short},
                                {"rope_factors_long.weight", d.longrope_long}}) {
    if (f.empty()) continue;
    METRO_RETURN_IF_ERROR(w.add_tensor(name, kernels::traits(DType::kF32).ggml, {f.size()},
                                       {reinterpret_cast<const uint8_t*>(f.data()), f.size() * sizeof(float)}));
    ++n_tensors;
  }
  const Source src{out.ck, std::make_shared<uint64_t>(0), source_bytes, opts.on_tensor};
  METRO_ASSIGN_OR_RETURN(const model::QuantPlan plan, preset_for(opts, found));
  // Experts: each layer's n_expert matrices of a kind stacked into one 3-D tensor.
  std::map<std::string, std::vector<const StTensor*>> stacks;
  for (const auto& [g, t] : found) {
    const size_t hash = g.find('#');
    if (hash == std::string::npos) continue;
    auto& v = stacks[g.substr(0, hash)];
    v.resize(d.n_expert);
    v[static_cast<size_t>(std::stoul(g.substr(hash + 1)))] = t;
  }
  for (const auto& stack : stacks) {
    const std::string stacked = stack.first;
    const std::vector<const StTensor*> parts = stack.second;
    const std::vector<uint64_t> dims = {parts[0]->shape[1], parts[0]->shape[0], d.n_expert};
    const auto cols = static_cast<int64_t>(dims[0]);
    const DType ty = pick_type(opts, plan, stacked, true, cols);
    METRO_RETURN_IF_ERROR(w.add_tensor_lazy(
        stacked, kernels::traits(ty).ggml, dims, [src, stacked, parts, ty, cols](std::span<uint8_t> dst) -> Status {
          const size_t per = dst.size() / parts.size();
          for (size_t e = 0; e < parts.size(); ++e) {
            METRO_ASSIGN_OR_RETURN(std::vector<float> v, src.ck->to_f32(*parts[e]));
            write_values(v, ty, cols, dst.subspan(e * per, per));
            *src.done += parts[e]->data.size();
          }
          if (src.on_tensor) src.on_tensor(*src.done, src.total, stacked);
          return {};
        }));
    ++n_tensors;
  }
  for (const auto& [g, t] : found) {
    if (g.find('#') != std::string::npos) continue;
    if (g.ends_with("ffn_gate_inp_shexp.weight")) {
      // A [1, n_embd] matrix in the checkpoint, one F32 vector in llama.cpp's file.
      const std::string name = g;  // (a lambda may not capture a structured binding everywhere)
      const StTensor* tensor = t;
      METRO_RETURN_IF_ERROR(w.add_tensor_lazy(name, kernels::traits(DType::kF32).ggml, {d.n_embd},
                                              [src, name, tensor](std::span<uint8_t> dst) -> Status {
                                                METRO_ASSIGN_OR_RETURN(std::vector<float> v, src.ck->to_f32(*tensor));
                                                write_values(v, DType::kF32, static_cast<int64_t>(v.size()), dst);
                                                *src.done += tensor->data.size();
                                                if (src.on_tensor) src.on_tensor(*src.done, src.total, name);
                                                return {};
                                              }));
      ++n_tensors;
      continue;
    }
    std::function<void(std::vector<float>&)> transform;
    if (d.permute_qk && (g.ends_with("attn_q.weight") || g.ends_with("attn_q.bias"))) {
      transform = [rows = static_cast<uint32_t>(q_rows), heads = d.n_head](std::vector<float>& v) {
        v = permute_heads(v, rows, heads);
      };
    } else if (d.permute_qk && (g.ends_with("attn_k.weight") || g.ends_with("attn_k.bias"))) {
      transform = [rows = static_cast<uint32_t>(kv_rows), heads = d.n_kv](std::vector<float>& v) {
        v = permute_heads(v, rows, heads);
      };
    } else if (d.norm_plus_one && g.ends_with("norm.weight")) {
      transform = [](std::vector<float>& v) {
        for (float& x : v) x += 1.0f;
      };
    }
    // The router stays F32: its few scores pick the experts (llama.cpp keeps it too).
    const bool matrix = t->shape.size() == 2 && !g.ends_with("ffn_gate_inp.weight");
    METRO_RETURN_IF_ERROR(
        add_converted(w, src, g, t, pick_type(opts, plan, g, matrix, static_cast<int64_t>(t->shape.back())), transform));
    ++n_tensors;
  }
  out.rep.architecture = d.arch;
  out.rep.n_tensors = n_tensors;
  out.rep.n_vocab = tok.n_vocab;
  out.rep.source_bytes = source_bytes;
  out.rep.warnings = tok.warnings;
  return out;
}


}  // namespace metro::convert::detail
