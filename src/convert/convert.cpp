#include "convert/convert.h"

#include "convert/convert_internal.h"

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "base/fp16.h"
#include "kernels/quant_ref.h"
#include "convert/hf_tokenizer.h"
#include "convert/safetensors.h"
#include "gguf/writer.h"
#include "model/requantize.h"

namespace metro::convert::detail {

constexpr size_t kMaxJsonBytes = 16u << 20;

Expected<json> read_json(const std::string& path, bool required) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (!required) return json();
    return not_found(path + " is missing");
  }
  std::string text;
  text.resize(kMaxJsonBytes + 1);
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxJsonBytes) return invalid_argument(path + " is larger than 16 MiB");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss(path + " is not a JSON object");
  return j;
}

// A positive integer field of config.json.
Expected<uint32_t> cfg_u32(const json& c, const char* key, uint32_t max) {
  if (!c.contains(key) || !c[key].is_number_unsigned()) return data_loss(std::string("config.json: '") + key + "' is missing or not a positive integer");
  const uint64_t v = c[key].get<uint64_t>();
  if (v == 0 || v > max) return data_loss(std::string("config.json: '") + key + "' = " + std::to_string(v) + " is out of range");
  return static_cast<uint32_t>(v);
}

Expected<float> cfg_f32(const json& c, const char* key, float dflt, float lo, float hi) {
  if (!c.contains(key) || c[key].is_null()) return dflt;
  if (!c[key].is_number()) return data_loss(std::string("config.json: '") + key + "' is not a number");
  const double v = c[key].get<double>();
  if (!(v >= lo && v <= hi)) return data_loss(std::string("config.json: '") + key + "' = " + std::to_string(v) + " is out of range");
  return static_cast<float>(v);
}

bool cfg_bool(const json& c, const char* key, bool dflt) {
  return c.contains(key) && c[key].is_boolean() ? c[key].get<bool>() : dflt;
}

struct BertConfig {
  uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_ff = 0, n_ctx = 0, n_types = 0, n_vocab = 0;
  float eps = 1e-12f;
  uint32_t pooling = 1;  // GGUF pooling_type: 1 mean, 2 CLS
};

// sentence-transformers' pooling module, when the directory has one (GGUF pooling_type:
// 1 mean, 2 CLS); `pooling` is left as it is otherwise.
Status read_pooling(const std::string& dir, uint32_t& pooling) {
  METRO_ASSIGN_OR_RETURN(json pool, read_json(dir + "/1_Pooling/config.json", false));
  if (!pool.is_object()) return {};
  if (pool.value("pooling_mode_mean_tokens", false)) {
    pooling = 1;
  } else if (pool.value("pooling_mode_cls_token", false)) {
    pooling = 2;
  } else {
    return unimplemented("1_Pooling/config.json: only mean and CLS pooling are supported");
  }
  return {};
}

std::string dims_text(const std::vector<uint64_t>& v) {
  std::string s;
  for (uint64_t d : v) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

using TensorNamer = std::function<Expected<std::optional<std::string>>(const std::string&)>;

// The checkpoint's tensors by their GGUF names, each of the shape `want` expects, every
// expected one present; tensors the namer drops are skipped.
Status collect_tensors(const Checkpoint& ck, const TensorNamer& name_of,
                       const std::map<std::string, std::vector<uint64_t>>& want,
                       std::map<std::string, const StTensor*>& found, uint64_t& source_bytes) {
  for (const auto& [hf, t] : ck.tensors()) {
    METRO_ASSIGN_OR_RETURN(std::optional<std::string> g, name_of(hf));
    if (!g) continue;
    auto it = want.find(*g);
    if (it == want.end()) return data_loss("tensor '" + hf + "' (" + *g + ") does not belong to a model of this config");
    if (t.shape != it->second) {
      return data_loss("tensor '" + hf + "' has shape " + dims_text(t.shape) + ", config.json says " + dims_text(it->second));
    }
    if (!t.is_float()) return data_loss("tensor '" + hf + "' is " + std::string(st_dtype_name(t.dtype)) + ", not a float type");
    if (!found.emplace(*g, &t).second) return data_loss("two checkpoint tensors map to '" + *g + "'");
    source_bytes += t.data.size();
  }
  for (const auto& [g, shape] : want) {
    if (!found.contains(g)) return data_loss("the checkpoint lacks the tensor for '" + g + "'");
  }
  return {};
}

// The format a tensor is written in: matrices in the requested one (a K-quant falls back to a
// 32-block format on rows that do not divide into 256), everything else F32.
DType pick_type(const ConvertOptions& opts, bool matrix, int64_t cols) {
  return matrix ? model::format_for_row_width(opts.type, cols) : DType::kF32;
}

// The same with a preset's per-tensor formats (`plan` from apply_preset) taking precedence.
DType pick_type(const ConvertOptions& opts, const model::QuantPlan& plan, const std::string& name, bool matrix,
                int64_t cols) {
  if (matrix) {
    for (const auto& [n, t] : plan.tensors) {
      if (n == name) return model::format_for_row_width(t, cols);
    }
  }
  return pick_type(opts, matrix, cols);
}

// The preset's plan over the GGUF names about to be written (expert pieces by their stack).
Expected<model::QuantPlan> preset_for(const ConvertOptions& opts, const std::map<std::string, const StTensor*>& found) {
  if (opts.preset.empty()) return model::QuantPlan{};
  std::vector<std::string> names;
  for (const auto& kv : found) {
    const size_t hash = kv.first.find('#');
    if (hash == std::string::npos) {
      names.push_back(kv.first);
    } else if (kv.first.substr(hash + 1) == "0") {
      names.push_back(kv.first.substr(0, hash));
    }
  }
  auto plan = model::preset_plan(opts.preset, names);
  if (!plan) return invalid_argument("'" + opts.preset + "' is not a quantization mix (q4_k_m, q5_k_m)");
  return *plan;
}

// `v` (rows of `cols`) into `dst` in format `t`.
void write_values(const std::vector<float>& v, DType t, int64_t cols, std::span<uint8_t> dst) {
  if (t == DType::kF32) {
    std::memcpy(dst.data(), v.data(), v.size() * 4);
  } else if (t == DType::kF16 || t == DType::kBF16) {
    for (size_t i = 0; i < v.size(); ++i) {
      const uint16_t h = t == DType::kF16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
      std::memcpy(dst.data() + 2 * i, &h, 2);
    }
  } else {
    const size_t rb = kernels::row_bytes(t, cols);
    const int64_t rows = static_cast<int64_t>(v.size()) / cols;
    model::parallel_rows(rows, 0, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        kernels::quantize_row_ref(t, v.data() + static_cast<size_t>(r * cols), dst.data() + static_cast<size_t>(r) * rb,
                                  cols);
      }
    });
  }
}

// Checkpoint tensor `t` as GGUF tensor `g` in format `ty`, `transform` applied to its values
// (a row reordering, a shifted norm) when it is filled.
Status add_converted(gguf::Writer& w, const Source& src, const std::string& g, const StTensor* t, DType ty,
                     std::function<void(std::vector<float>&)> transform) {
  std::vector<uint64_t> dims(t->shape.rbegin(), t->shape.rend());  // GGUF: innermost first
  const auto cols = static_cast<int64_t>(dims[0]);
  return w.add_tensor_lazy(g, kernels::traits(ty).ggml, dims,
                           [src, g, t, ty, cols, transform](std::span<uint8_t> dst) -> Status {
                             METRO_ASSIGN_OR_RETURN(std::vector<float> v, src.ck->to_f32(*t));
                             if (transform) transform(v);
                             write_values(v, ty, cols, dst);
                             *src.done += t->data.size();
                             if (src.on_tensor) src.on_tensor(*src.done, src.total, g);
                             return {};
                           });
}

// The checkpoint opened and the file started: architecture, name (the config's, else the
// directory's) and file type.
Expected<Prepared> start(const std::string& dir, const json& cfg, const std::string& arch, const ConvertOptions& opts) {
  Prepared out;
  METRO_ASSIGN_OR_RETURN(Checkpoint opened, Checkpoint::open_dir(dir));
  out.ck = std::make_shared<Checkpoint>(std::move(opened));
  out.w.add_string("general.architecture", arch);
  std::string name = cfg.value("_name_or_path", std::string());
  if (name.empty()) name = dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
  out.w.add_string("general.name", name.substr(0, 256));
  out.w.add_u32("general.file_type", model::quant_file_type(opts.type));
  return out;
}

Expected<BertConfig> bert_config(const json& c, const std::string& dir) {
  BertConfig b;
  METRO_ASSIGN_OR_RETURN(b.n_embd, cfg_u32(c, "hidden_size", 1u << 16));
  METRO_ASSIGN_OR_RETURN(b.n_layer, cfg_u32(c, "num_hidden_layers", 1024));
  METRO_ASSIGN_OR_RETURN(b.n_head, cfg_u32(c, "num_attention_heads", 1024));
  METRO_ASSIGN_OR_RETURN(b.n_ff, cfg_u32(c, "intermediate_size", 1u << 20));
  METRO_ASSIGN_OR_RETURN(b.n_ctx, cfg_u32(c, "max_position_embeddings", 1u << 16));
  METRO_ASSIGN_OR_RETURN(b.n_vocab, cfg_u32(c, "vocab_size", 1u << 22));
  b.n_types = 2;
  if (c.contains("type_vocab_size")) {
    METRO_ASSIGN_OR_RETURN(b.n_types, cfg_u32(c, "type_vocab_size", 1024));
  }
  if (b.n_embd % b.n_head != 0) return data_loss("config.json: hidden_size is not a multiple of num_attention_heads");
  if (c.contains("layer_norm_eps")) {
    if (!c["layer_norm_eps"].is_number()) return data_loss("config.json: layer_norm_eps is not a number");
    b.eps = c["layer_norm_eps"].get<float>();
    if (!(b.eps > 0.0f && b.eps < 1.0f)) return data_loss("config.json: layer_norm_eps out of range");
  }
  const std::string act = c.value("hidden_act", std::string("gelu"));
  if (act != "gelu") return unimplemented("config.json: hidden_act '" + act.substr(0, 32) + "' (gelu is supported)");
  const std::string pos = c.value("position_embedding_type", std::string("absolute"));
  if (pos != "absolute") {
    return unimplemented("config.json: position_embedding_type '" + pos.substr(0, 32) + "' (absolute is supported)");
  }
  METRO_RETURN_IF_ERROR(read_pooling(dir, b.pooling));
  return b;
}

// llama.cpp's GGUF name of a BertModel tensor; nullopt for tensors an embedding model does
// not use (the pooler, position ids, heads of other tasks); an error for anything else.
Expected<std::optional<std::string>> bert_name(std::string hf) {
  if (hf.starts_with("bert.")) hf = hf.substr(5);
  if (hf == "embeddings.position_ids" || hf.starts_with("pooler.") || hf.starts_with("cls.")) {
    return std::optional<std::string>();
  }
  // Older checkpoints name layer norm parameters gamma and beta.
  if (hf.ends_with(".gamma")) hf = hf.substr(0, hf.size() - 6) + ".weight";
  if (hf.ends_with(".beta")) hf = hf.substr(0, hf.size() - 5) + ".bias";
  static const std::map<std::string, std::string> kTop = {
      {"embeddings.word_embeddings.weight", "token_embd.weight"},
      {"embeddings.position_embeddings.weight", "position_embd.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"},
      {"embeddings.LayerNorm.weight", "token_embd_norm.weight"},
      {"embeddings.LayerNorm.bias", "token_embd_norm.bias"},
  };
  if (auto it = kTop.find(hf); it != kTop.end()) return std::optional<std::string>(it->second);
  static const std::map<std::string, std::string> kLayer = {
      {"attention.self.query", "attn_q"},          {"attention.self.key", "attn_k"},
      {"attention.self.value", "attn_v"},          {"attention.output.dense", "attn_output"},
      {"attention.output.LayerNorm", "attn_output_norm"}, {"intermediate.dense", "ffn_up"},
      {"output.dense", "ffn_down"},                {"output.LayerNorm", "layer_output_norm"},
  };
  static const std::regex kRe(R"(encoder\.layer\.(\d{1,4})\.(.+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(hf, m, kRe)) {
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) {
      return std::optional<std::string>("blk." + m[1].str() + "." + it->second + "." + m[3].str());
    }
  }
  return unimplemented("tensor '" + hf.substr(0, 128) + "' is not part of a BERT encoder this converter knows");
}

Expected<Prepared> convert_bert(const std::string& dir, const json& cfg, const ConvertOptions& opts) {
  METRO_ASSIGN_OR_RETURN(BertConfig b, bert_config(cfg, dir));
  METRO_ASSIGN_OR_RETURN(Prepared out, start(dir, cfg, "bert", opts));
  gguf::Writer& w = out.w;
  w.add_u32("bert.context_length", b.n_ctx);
  w.add_u32("bert.embedding_length", b.n_embd);
  w.add_u32("bert.feed_forward_length", b.n_ff);
  w.add_u32("bert.block_count", b.n_layer);
  w.add_u32("bert.attention.head_count", b.n_head);
  w.add_f32("bert.attention.layer_norm_epsilon", b.eps);
  w.add_bool("bert.attention.causal", false);
  w.add_u32("bert.pooling_type", b.pooling);
  TokenizerInfo tok;
  METRO_RETURN_IF_ERROR(write_hf_tokenizer(dir, w, &tok));
  if (tok.n_vocab != static_cast<int>(b.n_vocab)) {
    return data_loss("tokenizer.json has " + std::to_string(tok.n_vocab) + " tokens; config.json's vocab_size is " +
                     std::to_string(b.n_vocab));
  }

  // Expected shapes, outermost first as the checkpoint holds them.
  std::map<std::string, std::vector<uint64_t>> want = {
      {"token_embd.weight", {b.n_vocab, b.n_embd}},     {"position_embd.weight", {b.n_ctx, b.n_embd}},
      {"token_types.weight", {b.n_types, b.n_embd}},    {"token_embd_norm.weight", {b.n_embd}},
      {"token_embd_norm.bias", {b.n_embd}},
  };
  for (uint32_t il = 0; il < b.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    for (const char* t : {"attn_q", "attn_k", "attn_v", "attn_output"}) {
      want[p + t + ".weight"] = {b.n_embd, b.n_embd};
      want[p + t + ".bias"] = {b.n_embd};
    }
    want[p + "ffn_up.weight"] = {b.n_ff, b.n_embd};
    want[p + "ffn_up.bias"] = {b.n_ff};
    want[p + "ffn_down.weight"] = {b.n_embd, b.n_ff};
    want[p + "ffn_down.bias"] = {b.n_embd};
    for (const char* t : {"attn_output_norm", "layer_output_norm"}) {
      want[p + t + ".weight"] = {b.n_embd};
      want[p + t + ".bias"] = {b.n_embd};
    }
  }
  std::map<std::string, const StTensor*> found;
  uint64_t source_bytes = 0;
  METRO_RETURN_IF_ERROR(collect_tensors(*out.ck, bert_name, want, found, source_bytes));
  const Source src{out.ck, std::make_shared<uint64_t>(0), source_bytes, opts.on_tensor};
  METRO_ASSIGN_OR_RETURN(const model::QuantPlan plan, preset_for(opts, found));
  for (const auto& [g, t] : found) {
    // The embeddings the encoder adds by position stay F32.
    const bool matrix = t->shape.size() == 2 && g != "position_embd.weight" && g != "token_types.weight";
    METRO_RETURN_IF_ERROR(
        add_converted(w, src, g, t, pick_type(opts, plan, g, matrix, static_cast<int64_t>(t->shape.back()))));
  }
  out.rep.architecture = "bert";
  out.rep.warnings = tok.warnings;
  out.rep.n_tensors = static_cast<int>(found.size());
  out.rep.n_vocab = tok.n_vocab;
  out.rep.source_bytes = source_bytes;
  return out;
}

// ---- nomic-bert: rotary positions, a fused QKV matrix, a SiLU-gated FFN ----

struct NomicConfig {
  uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_ff = 0, n_ctx = 0, n_vocab = 0, n_types = 2;
  float eps = 1e-12f;
  float rope_base = 10000.0f;
  bool qkv_bias = false, fc1_bias = false, fc2_bias = false;
  uint32_t pooling = 1;
};

Expected<NomicConfig> nomic_config(const json& c, const std::string& dir) {
  NomicConfig n;
  METRO_ASSIGN_OR_RETURN(n.n_embd, cfg_u32(c, "n_embd", 1u << 16));
  METRO_ASSIGN_OR_RETURN(n.n_layer, cfg_u32(c, "n_layer", 1024));
  METRO_ASSIGN_OR_RETURN(n.n_head, cfg_u32(c, "n_head", 1024));
  n.n_ff = 4 * n.n_embd;
  if (c.contains("n_inner") && !c["n_inner"].is_null()) {
    METRO_ASSIGN_OR_RETURN(n.n_ff, cfg_u32(c, "n_inner", 1u << 20));
  }
  METRO_ASSIGN_OR_RETURN(n.n_ctx, cfg_u32(c, "n_positions", 1u << 24));
  METRO_ASSIGN_OR_RETURN(n.n_vocab, cfg_u32(c, "vocab_size", 1u << 22));
  if (c.contains("type_vocab_size")) {
    METRO_ASSIGN_OR_RETURN(n.n_types, cfg_u32(c, "type_vocab_size", 1024));
  }
  if (n.n_embd % n.n_head != 0 || (n.n_embd / n.n_head) % 2 != 0) {
    return data_loss("config.json: n_embd is not a multiple of twice n_head");
  }
  METRO_ASSIGN_OR_RETURN(n.eps, cfg_f32(c, "layer_norm_epsilon", 1e-12f, 1e-20f, 0.1f));
  METRO_ASSIGN_OR_RETURN(n.rope_base, cfg_f32(c, "rotary_emb_base", 10000.0f, 1.0f, 1e12f));
  METRO_ASSIGN_OR_RETURN(float fraction, cfg_f32(c, "rotary_emb_fraction", 1.0f, 0.0f, 1.0f));
  if (fraction != 1.0f) return unimplemented("config.json: rotary_emb_fraction below 1 (a partly rotated head)");
  struct Flag {
    const char* key;
    bool want;
  };
  for (const Flag f : {Flag{"rotary_emb_interleaved", false}, Flag{"prenorm", false}, Flag{"causal", false},
                       Flag{"use_rms_norm", false}}) {
    if (cfg_bool(c, f.key, f.want) != f.want) {
      return unimplemented(std::string("config.json: ") + f.key + " = " + (f.want ? "false" : "true") +
                           " is not supported");
    }
  }
  for (const char* key : {"rotary_scaling_factor", "rotary_emb_scale_base"}) {
    if (c.contains(key) && !c[key].is_null()) return unimplemented(std::string("config.json: ") + key + " is not supported");
  }
  if (c.contains("num_heads_kv") && !c["num_heads_kv"].is_null() && c["num_heads_kv"] != n.n_head) {
    return unimplemented("config.json: num_heads_kv (grouped keys and values) is not supported");
  }
  const std::string act = c.value("activation_function", std::string("swiglu"));
  if (act != "swiglu") return unimplemented("config.json: activation_function '" + act.substr(0, 32) + "' (swiglu is supported)");
  n.qkv_bias = cfg_bool(c, "qkv_proj_bias", true);
  n.fc1_bias = cfg_bool(c, "mlp_fc1_bias", true);
  n.fc2_bias = cfg_bool(c, "mlp_fc2_bias", true);
  METRO_RETURN_IF_ERROR(read_pooling(dir, n.pooling));
  return n;
}

// llama.cpp's GGUF name of a NomicBertModel tensor (fc11 is the value the gate multiplies,
// fc12 the gate through SiLU).
Expected<std::optional<std::string>> nomic_name(std::string hf) {
  if (hf.starts_with("bert.")) hf = hf.substr(5);
  if (hf.starts_with("pooler.") || hf.starts_with("cls.") || hf.ends_with("rotary_emb.inv_freq")) {
    return std::optional<std::string>();
  }
  static const std::map<std::string, std::string> kTop = {
      {"embeddings.word_embeddings.weight", "token_embd.weight"},
      {"embeddings.token_type_embeddings.weight", "token_types.weight"},
      {"emb_ln.weight", "token_embd_norm.weight"},
      {"emb_ln.bias", "token_embd_norm.bias"},
  };
  if (auto it = kTop.find(hf); it != kTop.end()) return std::optional<std::string>(it->second);
  static const std::map<std::string, std::string> kLayer = {
      {"attn.Wqkv", "attn_qkv"}, {"attn.out_proj", "attn_output"}, {"mlp.fc11", "ffn_up"},
      {"mlp.fc12", "ffn_gate"},  {"mlp.fc2", "ffn_down"},          {"norm1", "attn_output_norm"},
      {"norm2", "layer_output_norm"},
  };
  static const std::regex kRe(R"(encoder\.layers\.(\d{1,4})\.(.+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(hf, m, kRe)) {
    if (auto it = kLayer.find(m[2].str()); it != kLayer.end()) {
      return std::optional<std::string>("blk." + m[1].str() + "." + it->second + "." + m[3].str());
    }
  }
  return unimplemented("tensor '" + hf.substr(0, 128) + "' is not part of a nomic-bert encoder this converter knows");
}

Expected<Prepared> convert_nomic_bert(const std::string& dir, const json& cfg, const ConvertOptions& opts) {
  METRO_ASSIGN_OR_RETURN(NomicConfig n, nomic_config(cfg, dir));
  METRO_ASSIGN_OR_RETURN(Prepared out, start(dir, cfg, "nomic-bert", opts));
  gguf::Writer& w = out.w;
  const std::string a = "nomic-bert.";
  w.add_u32(a + "context_length", n.n_ctx);
  w.add_u32(a + "embedding_length", n.n_embd);
  w.add_u32(a + "feed_forward_length", n.n_ff);
  w.add_u32(a + "block_count", n.n_layer);
  w.add_u32(a + "attention.head_count", n.n_head);
  w.add_f32(a + "attention.layer_norm_epsilon", n.eps);
  w.add_bool(a + "attention.causal", false);
  w.add_u32(a + "pooling_type", n.pooling);
  w.add_f32(a + "rope.freq_base", n.rope_base);
  TokenizerInfo tok;
  METRO_RETURN_IF_ERROR(write_hf_tokenizer(dir, w, &tok));
  if (tok.n_vocab != static_cast<int>(n.n_vocab)) {
    return data_loss("tokenizer.json has " + std::to_string(tok.n_vocab) + " tokens; config.json's vocab_size is " +
                     std::to_string(n.n_vocab));
  }
  std::map<std::string, std::vector<uint64_t>> want = {
      {"token_embd.weight", {n.n_vocab, n.n_embd}},  {"token_types.weight", {n.n_types, n.n_embd}},
      {"token_embd_norm.weight", {n.n_embd}},        {"token_embd_norm.bias", {n.n_embd}},
  };
  for (uint32_t il = 0; il < n.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    want[p + "attn_qkv.weight"] = {3 * static_cast<uint64_t>(n.n_embd), n.n_embd};
    want[p + "attn_output.weight"] = {n.n_embd, n.n_embd};
    if (n.qkv_bias) {
      want[p + "attn_qkv.bias"] = {3 * static_cast<uint64_t>(n.n_embd)};
      want[p + "attn_output.bias"] = {n.n_embd};
    }
    want[p + "ffn_up.weight"] = {n.n_ff, n.n_embd};
    want[p + "ffn_gate.weight"] = {n.n_ff, n.n_embd};
    want[p + "ffn_down.weight"] = {n.n_embd, n.n_ff};
    if (n.fc1_bias) {
      want[p + "ffn_up.bias"] = {n.n_ff};
      want[p + "ffn_gate.bias"] = {n.n_ff};
    }
    if (n.fc2_bias) want[p + "ffn_down.bias"] = {n.n_embd};
    for (const char* t : {"attn_output_norm", "layer_output_norm"}) {
      want[p + t + ".weight"] = {n.n_embd};
      want[p + t + ".bias"] = {n.n_embd};
    }
  }
  std::map<std::string, const StTensor*> found;
  uint64_t source_bytes = 0;
  METRO_RETURN_IF_ERROR(collect_tensors(*out.ck, nomic_name, want, found, source_bytes));
  const Source src{out.ck, std::make_shared<uint64_t>(0), source_bytes, opts.on_tensor};
  METRO_ASSIGN_OR_RETURN(const model::QuantPlan plan, preset_for(opts, found));
  for (const auto& [g, t] : found) {
    const bool matrix = t->shape.size() == 2 && g != "token_types.weight";
    METRO_RETURN_IF_ERROR(
        add_converted(w, src, g, t, pick_type(opts, plan, g, matrix, static_cast<int64_t>(t->shape.back()))));
  }
  out.rep.architecture = "nomic-bert";
  out.rep.n_tensors = static_cast<int>(found.size());
  out.rep.n_vocab = tok.n_vocab;
  out.rep.source_bytes = source_bytes;
  out.rep.warnings = tok.warnings;
  return out;
}

}  // namespace metro::convert::detail

namespace metro::convert {

using detail::Prepared;
using nlohmann::json;

namespace {

Expected<Prepared> prepare(const std::string& hf_dir, const ConvertOptions& opts) {
  METRO_ASSIGN_OR_RETURN(json cfg, detail::read_json(hf_dir + "/config.json", true));
  const std::string type = cfg.value("model_type", std::string());
  if (type == "bert") return detail::convert_bert(hf_dir, cfg, opts);
  if (type == "nomic_bert") return detail::convert_nomic_bert(hf_dir, cfg, opts);
  if (type == "llama" || type == "mistral" || type == "qwen2" || type == "qwen3" || type == "gemma3_text" ||
      type == "gemma" || type == "gemma2" || type == "phi3" || type == "qwen2_moe" || type == "qwen3_moe" ||
      type == "mixtral" || type == "granite" || type == "olmo2") {
    return detail::convert_decoder(hf_dir, cfg, type, opts);
  }
  if (type == "gemma3") {
    // The multimodal checkpoint: its language model's settings are under text_config.
    if (!cfg.contains("text_config") || !cfg["text_config"].is_object()) {
      return data_loss("config.json: a gemma3 model without text_config");
    }
    json text = cfg["text_config"];
    for (const char* key : {"vocab_size", "tie_word_embeddings", "_name_or_path"}) {
      if (!text.contains(key) && cfg.contains(key)) text[key] = cfg[key];
    }
    return detail::convert_decoder(hf_dir, text, type, opts);
  }
  if (type.empty()) return data_loss("config.json has no model_type");
  return unimplemented("model_type '" + type.substr(0, 64) +
                       "': this converter writes llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, qwen3_moe, phi3, gemma, "
                       "gemma2, gemma3, granite and olmo2 decoders and bert and nomic_bert encoders; convert other models with "
                       "llama.cpp's convert_hf_to_gguf.py");
}

}  // namespace

Expected<std::vector<uint8_t>> convert_hf(const std::string& hf_dir, const ConvertOptions& opts, ConvertReport* report) {
  METRO_ASSIGN_OR_RETURN(Prepared p, prepare(hf_dir, opts));
  METRO_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, p.w.build());
  p.rep.bytes = bytes.size();
  if (report != nullptr) *report = std::move(p.rep);
  return bytes;
}

Status convert_hf_to_file(const std::string& hf_dir, const std::string& out_path, const ConvertOptions& opts,
                          ConvertReport* report) {
  METRO_ASSIGN_OR_RETURN(Prepared p, prepare(hf_dir, opts));
  p.rep.bytes = p.w.file_size();
  METRO_RETURN_IF_ERROR(p.w.write_atomically(out_path));
  if (report != nullptr) *report = std::move(p.rep);
  return {};
}

}  // namespace metro::convert
