#include "convert/convert.h"

#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>

#include "base/fp16.h"
#include "convert/hf_tokenizer.h"
#include "convert/safetensors.h"
#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "model/requantize.h"

namespace metro::convert {

namespace {

using kernels::DType;
using nlohmann::json;

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

struct BertConfig {
  uint32_t n_embd = 0, n_layer = 0, n_head = 0, n_ff = 0, n_ctx = 0, n_types = 0, n_vocab = 0;
  float eps = 1e-12f;
  uint32_t pooling = 1;  // GGUF pooling_type: 1 mean, 2 CLS
};

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
  // sentence-transformers' pooling module, when the directory has one.
  METRO_ASSIGN_OR_RETURN(json pool, read_json(dir + "/1_Pooling/config.json", false));
  if (pool.is_object()) {
    if (pool.value("pooling_mode_mean_tokens", false)) {
      b.pooling = 1;
    } else if (pool.value("pooling_mode_cls_token", false)) {
      b.pooling = 2;
    } else {
      return unimplemented("1_Pooling/config.json: only mean and CLS pooling are supported");
    }
  }
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

// Bytes of `v` in a float GGUF type.
std::vector<uint8_t> float_bytes(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> out;
  if (t == DType::kF32) {
    out.resize(v.size() * 4);
    std::memcpy(out.data(), v.data(), out.size());
    return out;
  }
  out.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t h = t == DType::kF16 ? fp32_to_fp16(v[i]) : fp32_to_bf16(v[i]);
    std::memcpy(out.data() + 2 * i, &h, 2);
  }
  return out;
}

bool is_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

Expected<std::vector<uint8_t>> convert_bert(const std::string& dir, const json& cfg, const ConvertOptions& opts,
                                            ConvertReport* rep) {
  METRO_ASSIGN_OR_RETURN(BertConfig b, bert_config(cfg, dir));
  METRO_ASSIGN_OR_RETURN(Checkpoint ck, Checkpoint::open_dir(dir));
  gguf::Writer w;
  w.add_string("general.architecture", "bert");
  std::string name = cfg.value("_name_or_path", std::string());
  if (name.empty()) name = dir.substr(dir.find_last_of('/') == std::string::npos ? 0 : dir.find_last_of('/') + 1);
  w.add_string("general.name", name.substr(0, 256));
  // Matrices go in as F32 when a block format follows (the requantizer rounds once).
  const DType matrix_type = is_float(opts.type) ? opts.type : DType::kF32;
  w.add_u32("general.file_type", model::quant_file_type(matrix_type));
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
  for (const auto& [hf, t] : ck.tensors()) {
    METRO_ASSIGN_OR_RETURN(std::optional<std::string> g, bert_name(hf));
    if (!g) continue;
    auto it = want.find(*g);
    if (it == want.end()) return data_loss("tensor '" + hf + "' (" + *g + ") does not belong to a model of this config");
    if (t.shape != it->second) {
      std::string have, exp;
      for (uint64_t d : t.shape) have += (have.empty() ? "" : ", ") + std::to_string(d);
      for (uint64_t d : it->second) exp += (exp.empty() ? "" : ", ") + std::to_string(d);
      return data_loss("tensor '" + hf + "' has shape [" + have + "], config.json says [" + exp + "]");
    }
    if (!t.is_float()) return data_loss("tensor '" + hf + "' is " + std::string(st_dtype_name(t.dtype)) + ", not a float type");
    if (!found.emplace(*g, &t).second) return data_loss("two checkpoint tensors map to '" + *g + "'");
    source_bytes += t.data.size();
  }
  for (const auto& [g, shape] : want) {
    if (!found.contains(g)) return data_loss("the checkpoint lacks the tensor for '" + g + "'");
  }
  uint64_t done = 0;
  for (const auto& [g, t] : found) {
    METRO_ASSIGN_OR_RETURN(std::vector<float> v, ck.to_f32(*t));
    const bool matrix = t->shape.size() == 2 && g != "position_embd.weight" && g != "token_types.weight";
    const DType ty = matrix ? matrix_type : DType::kF32;
    std::vector<uint64_t> dims(t->shape.rbegin(), t->shape.rend());  // GGUF: innermost first
    METRO_RETURN_IF_ERROR(w.add_tensor(g, kernels::traits(ty).ggml, dims, float_bytes(v, ty)));
    done += t->data.size();
    if (opts.on_tensor) opts.on_tensor(done, source_bytes, g);
  }
  std::vector<uint8_t> bytes = w.serialize();
  if (!is_float(opts.type)) {
    // Block formats through the requantizer; the embeddings the encoder adds by position
    // stay F32.
    METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::parse(bytes));
    model::QuantPlan plan;
    plan.type = opts.type;
    plan.tensors = {{"position_embd.weight", model::kKeepFormat}, {"token_types.weight", model::kKeepFormat}};
    METRO_ASSIGN_OR_RETURN(std::vector<uint8_t> q, model::requantize(f, plan, {}, nullptr));
    bytes = std::move(q);
  }
  if (rep != nullptr) {
    rep->architecture = "bert";
    rep->n_tensors = static_cast<int>(found.size());
    rep->n_vocab = tok.n_vocab;
    rep->bytes = bytes.size();
    rep->source_bytes = source_bytes;
  }
  return bytes;
}

}  // namespace

Expected<std::vector<uint8_t>> convert_hf(const std::string& hf_dir, const ConvertOptions& opts, ConvertReport* report) {
  METRO_ASSIGN_OR_RETURN(json cfg, read_json(hf_dir + "/config.json", true));
  const std::string type = cfg.value("model_type", std::string());
  if (type == "bert") return convert_bert(hf_dir, cfg, opts, report);
  if (type.empty()) return data_loss("config.json has no model_type");
  return unimplemented("model_type '" + type.substr(0, 64) +
                       "': this converter writes BERT-family encoders (model_type bert); convert decoder models "
                       "with llama.cpp's convert_hf_to_gguf.py for now");
}

}  // namespace metro::convert
