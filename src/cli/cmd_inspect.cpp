// metro inspect MODEL [--json] [--tensors] [--metadata]
#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "gguf/gguf.h"
#include "kernels/matmul.h"
#include "model/hparams.h"
#include "model/weights.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/registry.h"
#include "cli/common.h"
#include "tokenizer/pre_tokenizer.h"

namespace metro::cli {
namespace {

using nlohmann::json;

std::string human_bytes(uint64_t b) {
  char buf[64];
  if (b >= (1ull << 30)) {
    std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  } else if (b >= (1ull << 20)) {
    std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(b) / (1ull << 20));
  } else if (b >= 1024) {
    std::snprintf(buf, sizeof(buf), "%.2f KiB", static_cast<double>(b) / 1024);
  } else {
    std::snprintf(buf, sizeof(buf), "%llu B", static_cast<unsigned long long>(b));
  }
  return buf;
}

// A token id from metadata, with its text when it is in range.
json special_token(const gguf::File& f, const char* key) {
  auto id = f.get_int(key);
  if (!id.ok()) return nullptr;
  json j;
  j["id"] = *id;
  auto toks = f.get_string_array("tokenizer.ggml.tokens");
  if (toks.ok() && *id >= 0 && static_cast<size_t>(*id) < toks->size()) {
    j["text"] = std::string((*toks)[static_cast<size_t>(*id)]);
  } else {
    j["text"] = nullptr;
    j["warning"] = "id outside the vocabulary";
  }
  return j;
}

json summarize(const gguf::File& f, const std::string& path) {
  json j;
  j["file"] = path.substr(path.find_last_of('/') == std::string::npos ? 0 : path.find_last_of('/') + 1);
  j["gguf_version"] = f.version();
  j["file_bytes"] = f.file_size();
  j["alignment"] = f.alignment();
  j["n_metadata"] = f.metadata().size();
  j["n_tensors"] = f.tensors().size();

  uint64_t n_params = 0;
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_type;  // bytes, tensors
  for (const auto& t : f.tensors()) {
    n_params += t.n_elements;
    auto& e = per_type[std::string(t.type_info.name)];
    e.first += t.n_bytes;
    e.second += 1;
  }
  j["n_params"] = n_params;
  json types = json::object();
  for (const auto& [name, e] : per_type) types[name] = {{"bytes", e.first}, {"tensors", e.second}};
  j["bytes_per_dtype"] = types;

  auto arch = f.get_string("general.architecture");
  j["architecture"] = arch.ok() ? json(std::string(*arch)) : json(nullptr);
  if (auto n = f.get_string("general.name"); n.ok()) j["name"] = std::string(*n);
  if (auto ft = f.get_u32("general.file_type"); ft.ok()) j["file_type"] = *ft;

  auto hp = model::HParams::from_gguf(f);
  if (hp.ok()) {
    const auto& h = *hp;
    j["supported"] = true;
    j["n_ctx_train"] = h.n_ctx_train;
    j["n_embd"] = h.n_embd;
    j["n_layer"] = h.n_layer;
    j["n_head"] = h.n_head;
    j["n_head_kv"] = h.n_head_kv;
    j["head_dim"] = h.head_dim;
    j["n_ff"] = h.n_ff;
    j["n_vocab"] = h.n_vocab;
    j["rms_eps"] = h.rms_eps;
    j["rope"] = {{"type", h.rope_type == model::RopeType::kNeox ? "neox" : "normal"},
                 {"freq_base", h.rope_freq_base},
                 {"n_rot", h.n_rot},
                 {"scaling", h.rope_scaling == model::RopeScaling::kLinear ? "linear"
                             : h.rope_scaling == model::RopeScaling::kYarn ? "yarn"
                                                                            : "none"},
                 {"scale_factor", h.rope_scale_factor},
                 {"freq_factors", h.has_rope_freq_factors}};
    if (h.rope_scaling == model::RopeScaling::kYarn || h.has_longrope) j["rope"]["original_context"] = h.rope_orig_ctx;
    if (h.has_longrope) j["rope"]["longrope"] = true;
    if (h.rope_attn_factor != 1.0f) j["rope"]["attn_factor"] = h.rope_attn_factor;
    if (h.sliding_window > 0) j["sliding_window"] = h.sliding_window;
    if (h.is_moe()) {
      j["experts"] = {{"count", h.n_expert},
                      {"used", h.n_expert_used},
                      {"n_ff", h.n_ff_exp},
                      {"weights_norm", h.expert_weights_norm},
                      {"gating", h.expert_gating == model::ExpertGating::kSigmoid ? "sigmoid" : "softmax"}};
      if (h.n_ff_shexp > 0) j["experts"]["shared_n_ff"] = h.n_ff_shexp;
    }
    j["tied_output"] = h.tied_output;
    j["encoder"] = h.encoder;
    if (h.encoder) j["encoder_positions"] = h.encoder_rope ? "rope" : "learned";
    if (h.encoder) j["pooling"] = h.pooling == model::Pooling::kCls ? "cls" : "mean";
    j["qkv_bias"] = h.has_qkv_bias;
    j["qk_norm"] = h.has_qk_norm;
    j["kv_bytes_per_token_f16"] = h.encoder ? 0 : h.kv_bytes_per_token(2.0);
    // Bind the weights as `metro serve` would, to report the layouts the kernels use.
    auto w = model::ModelWeights::bind(f, h, /*allow_repack=*/true);
    if (w.ok()) {
      j["kernel_isa"] = std::string(kernels::kernel_isa());
      j["weight_layouts"] = w->describe_layouts();
      j["weight_bytes_per_token"] = w->bytes_per_token();
    } else {
      j["weights_error"] = w.status().message();
    }
  } else {
    j["supported"] = false;
    j["unsupported_reason"] = hp.status().message();
  }

  json tok;
  if (auto m = f.get_string("tokenizer.ggml.model"); m.ok()) tok["model"] = std::string(*m);
  if (auto p = f.get_string("tokenizer.ggml.pre"); p.ok()) {
    tok["pre"] = std::string(*p);
    tok["pre_known"] = tokenizer::is_known_pre_tokenizer(*p);
  }
  if (auto n = f.get_array_size("tokenizer.ggml.tokens"); n.ok()) tok["n_tokens"] = *n;
  if (auto n = f.get_array_size("tokenizer.ggml.merges"); n.ok()) tok["n_merges"] = *n;
  json sp = json::object();
  for (const char* k : {"bos", "eos", "eot", "padding", "unknown"}) {
    json t = special_token(f, (std::string("tokenizer.ggml.") + k + "_token_id").c_str());
    if (!t.is_null()) sp[k] = t;
  }
  tok["special"] = sp;
  if (auto b = f.get_bool("tokenizer.ggml.add_bos_token"); b.ok()) tok["add_bos"] = *b;
  if (auto b = f.get_bool("tokenizer.ggml.add_eos_token"); b.ok()) tok["add_eos"] = *b;
  auto tmpl = f.get_string("tokenizer.chat_template");
  tok["chat_template"] = tmpl.ok();
  if (tmpl.ok()) tok["chat_template_bytes"] = tmpl->size();
  j["tokenizer"] = tok;
  return j;
}

void print_text(const json& j, const gguf::File& f, bool tensors, bool metadata) {
  auto s = [&](const char* k) -> std::string {
    if (!j.contains(k) || j[k].is_null()) return "-";
    return j[k].is_string() ? j[k].get<std::string>() : j[k].dump();
  };
  std::printf("file:            %s (GGUF v%s, %s, alignment %s)\n", s("file").c_str(),
              s("gguf_version").c_str(), human_bytes(j["file_bytes"].get<uint64_t>()).c_str(),
              s("alignment").c_str());
  std::printf("architecture:    %s%s\n", s("architecture").c_str(),
              j["supported"].get<bool>() ? "" : "  (not runnable by metro)");
  if (j.contains("name")) std::printf("name:            %s\n", s("name").c_str());
  if (!j["supported"].get<bool>()) {
    std::printf("reason:          %s\n", s("unsupported_reason").c_str());
  } else {
    std::printf("context length:  %s\n", s("n_ctx_train").c_str());
    std::printf("embedding:       %s\n", s("n_embd").c_str());
    std::printf("layers:          %s\n", s("n_layer").c_str());
    std::printf("heads:           %s (KV heads %s, head dim %s)\n", s("n_head").c_str(),
                s("n_head_kv").c_str(), s("head_dim").c_str());
    std::printf("ffn:             %s\n", s("n_ff").c_str());
    if (j.contains("experts")) {
      const json& x = j["experts"];
      std::printf("experts:         %d of %d per token, %d wide, %s%s", x["used"].get<int>(), x["count"].get<int>(),
                  x["n_ff"].get<int>(), x["gating"].get<std::string>().c_str(),
                  x["weights_norm"].get<bool>() ? " weights rescaled to sum 1" : " weights as routed");
      if (x.contains("shared_n_ff")) std::printf("; a shared expert %d wide", x["shared_n_ff"].get<int>());
      std::printf("\n");
    }
    std::printf("vocab:           %s\n", s("n_vocab").c_str());
    const json& r = j["rope"];
    const bool encoder = j.value("encoder", false);
    if (encoder) {
      std::printf("encoder:         bidirectional, %s, layer norms (eps %g), %s pooling; "
                  "embeddings only\n",
                  j.value("encoder_positions", "learned") == "rope" ? "rotated positions" : "learned positions",
                  j["rms_eps"].get<double>(), s("pooling").c_str());
    } else {
      std::printf("rope:            %s, base %g, %d dims, scaling %s (x%g)%s\n",
                  r["type"].get<std::string>().c_str(), r["freq_base"].get<double>(),
                  r["n_rot"].get<int>(), r["scaling"].get<std::string>().c_str(),
                  r["scale_factor"].get<double>(),
                  r["freq_factors"].get<bool>() ? ", llama3 frequency factors"
                  : r.contains("longrope")       ? ", LongRoPE factors (long past the original context)"
                                                 : "");
      if (r.contains("original_context")) std::printf("original context: %d\n", r["original_context"].get<int>());
      if (j.contains("sliding_window")) std::printf("sliding window:  %d tokens\n", j["sliding_window"].get<int>());
      std::printf("rms norm eps:    %g\n", j["rms_eps"].get<double>());
      std::printf("output head:     %s%s\n", j["tied_output"].get<bool>() ? "tied to token embedding" : "separate",
                  j["qkv_bias"].get<bool>() ? ", Q/K/V biases" : "");
    }
    if (j.contains("weight_layouts")) {
      std::printf("weights:         %s (kernels %s)\n", s("weight_layouts").c_str(), s("kernel_isa").c_str());
    } else if (j.contains("weights_error")) {
      std::printf("weights:         cannot be bound: %s\n", s("weights_error").c_str());
    }
    if (!encoder) {
      std::printf("KV per token:    %s at F16\n", human_bytes(j["kv_bytes_per_token_f16"].get<uint64_t>()).c_str());
    }
  }
  const json& t = j["tokenizer"];
  std::printf("tokenizer:       %s (pre %s), %s tokens, %s merges\n",
              t.value("model", std::string("-")).c_str(), t.value("pre", std::string("-")).c_str(),
              t.contains("n_tokens") ? t["n_tokens"].dump().c_str() : "-",
              t.contains("n_merges") ? t["n_merges"].dump().c_str() : "-");
  if (!t.value("pre_known", true)) {
    std::printf("  warning        unknown pre-tokenizer: metro splits words like GPT-2\n");
  }
  for (auto& [k, v] : t["special"].items()) {
    std::string text = v["text"].is_null() ? "(out of range)" : v["text"].get<std::string>();
    std::printf("  %-8s       %lld %s\n", k.c_str(), v["id"].get<long long>(), text.c_str());
  }
  if (t.contains("add_bos")) std::printf("  add_bos        %s\n", t["add_bos"].dump().c_str());
  std::printf("chat template:   %s\n",
              t["chat_template"].get<bool>()
                  ? ("present (" + t["chat_template_bytes"].dump() + " bytes)").c_str()
                  : "none");
  std::printf("tensors:         %s, %.2f M parameters\n", s("n_tensors").c_str(),
              static_cast<double>(j["n_params"].get<uint64_t>()) / 1e6);
  for (auto& [k, v] : j["bytes_per_dtype"].items()) {
    std::printf("  %-8s       %4llu tensors, %s\n", k.c_str(),
                static_cast<unsigned long long>(v["tensors"].get<uint64_t>()),
                human_bytes(v["bytes"].get<uint64_t>()).c_str());
  }
  if (metadata) {
    std::printf("metadata:\n");
    for (const auto& kv : f.metadata()) {
      if (kv.key == "tokenizer.chat_template") continue;
      std::printf("  %-44.*s %s\n", static_cast<int>(kv.key.size()), kv.key.data(),
                  kv.value.to_display_string().c_str());
    }
  }
  if (tensors) {
    std::printf("tensor table:\n");
    for (const auto& ti : f.tensors()) {
      std::printf("  %-36.*s %-6s %-16s %s\n", static_cast<int>(ti.name.size()), ti.name.data(),
                  std::string(ti.type_info.name).c_str(), ti.shape_string().c_str(),
                  human_bytes(ti.n_bytes).c_str());
    }
  }
}

}  // namespace

int cmd_inspect(int argc, char** argv) {
  CLI::App app{"Print a GGUF model's architecture, tokenizer and tensors", "metro inspect"};
  std::string path;
  bool as_json = false, tensors = false, metadata = false;
  app.add_option("model", path, "GGUF file")->required();
  app.add_flag("--json", as_json, "one JSON object on stdout");
  app.add_flag("--tensors", tensors, "list every tensor");
  app.add_flag("--metadata", metadata, "list every metadata key");
  std::string device = "cpu";
  app.add_option("--device", device, "also report this device (" + backends::device_names() + ")")
      ->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  auto file = gguf::File::open(path);
  if (!file.ok()) return fail("inspect", with_path(path, file.status()));
  json j = summarize(*file, path);
  if (device != "cpu") {
    if (device != "cuda") return fail("inspect", invalid_argument("--device must be " + backends::device_names()));
    auto info = backends::cuda_device_info(0);
    if (!info.ok()) return fail("inspect", info.status());
    j["device"] = {{"name", info->name},
                   {"memory_bytes", info->memory_bytes},
                   {"compute_capability", std::to_string(info->major) + "." + std::to_string(info->minor)},
                   {"multiprocessors", info->multiprocessors}};
  }
  if (as_json) {
    if (tensors) {
      json list = json::array();
      for (const auto& t : file->tensors()) {
        json dims = json::array();
        for (uint32_t d = 0; d < t.n_dims; ++d) dims.push_back(t.ne[d]);
        list.push_back({{"name", std::string(t.name)}, {"type", std::string(t.type_info.name)},
                        {"dims", dims}, {"offset", t.offset}, {"bytes", t.n_bytes}});
      }
      j["tensors"] = list;
    }
    std::printf("%s\n", j.dump(2, ' ', false, json::error_handler_t::replace).c_str());
  } else {
    print_text(j, *file, tensors, metadata);
    if (j.contains("device")) {
      const json& d = j["device"];
      std::printf("device:          %s, %s, compute capability %s, %d multiprocessors\n",
                  d["name"].get<std::string>().c_str(), human_bytes(d["memory_bytes"].get<uint64_t>()).c_str(),
                  d["compute_capability"].get<std::string>().c_str(), d["multiprocessors"].get<int>());
      if (j.contains("weight_bytes_per_token")) {
        std::printf("bytes per step:  %s of weights read per decode step (any batch size)\n",
                    human_bytes(j["weight_bytes_per_token"].get<uint64_t>()).c_str());
      }
    }
  }
  return 0;
}

}  // namespace metro::cli
