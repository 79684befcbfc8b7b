// Helpers shared by CLI commands: loading a model with its tokenizer, printing errors.
#pragma once

#include <CLI/CLI.hpp>
#include <chrono>
#include <memory>
#include <string_view>
#include <string>

#include "base/status.h"
#include "engine/engine.h"
#include "kernels/dtype.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace metro::cli {

struct LoadedModel {
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  double load_seconds = 0.0;
};

// `device`: what --device names (backends::make_backend): "cpu" or "cuda". The model is
// read into memory the process owns (model::Model::load). A positive `watch_period` also
// polls the file at that period and logs once when it changes on disk. `progress`: a
// progress line while the file is read (on a terminal only; cli/progress.h). `lora`:
// adapters added into the weights as it loads (model/lora.h). `budget`: a cap on resident
// weights (model::ModelOptions::mem_budget).
Expected<LoadedModel> load_model(const std::string& path, bool allow_repack = true, const std::string& device = "cpu",
                                 std::chrono::milliseconds watch_period = std::chrono::milliseconds{0},
                                 bool progress = true, const std::vector<model::LoraSpec>& lora = {},
                                 const std::vector<model::LoraSpec>& adapters = {},
                                 const model::MemBudget& budget = {});

// "4GiB", "512MiB", "1.5G", "1048576" -> bytes.
Expected<int64_t> parse_size(const std::string& s);

// --mem-budget SIZE and --cold-dir DIR: a cap on the resident weights of each model, its
// experts kept cold in a file in DIR (model::MemBudget).
struct MemBudgetFlags {
  std::string bytes;  // empty: no cap
  std::string dir = "/var/tmp";
  bool drop_page_cache = false;  // bench only: every cold read from the disk
  Expected<model::MemBudget> parse() const;
};
void add_mem_budget_flags(CLI::App& app, MemBudgetFlags& flags);

// --lora FILE (repeatable, scale 1) and --lora-scaled FILE SCALE (repeatable), as llama.cpp
// names them: adapters merged into the model's weights at load.
struct LoraFlags {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, double>> scaled;
  std::vector<model::LoraSpec> specs() const;
};
void add_lora_flags(CLI::App& app, LoraFlags& flags);

// Physical cores (the default for -t).
int default_threads();

// The KV cache element type named by --kv-type (serve, perplexity): f16 or q8_0.
Expected<kernels::DType> parse_kv_type(const std::string& name);

// Speculative decoding flags of serve, run and bench: --spec off|ngram|draft|self,
// --spec-max-k N, --spec-draft FILE, --spec-self-skip LAYERS, --spec-no-controller, and
// --no-jump-forward (the grammar's forced tokens, drafted with speculation on or off).
struct SpecFlags {
  std::string mode = "off";
  int max_k = 8;
  std::string draft;
  std::string self_skip;  // empty: the default skip set (docs/speculative.md)
  bool adaptive = true;   // false: verify every proposed token (--spec-no-controller)
  bool jump_forward = true;  // false: --no-jump-forward
  // The draft model once loaded, shared by copies of the flags (bench runs several engines).
  std::shared_ptr<std::shared_ptr<const model::Model>> loaded = std::make_shared<std::shared_ptr<const model::Model>>();
};
void add_spec_flags(CLI::App& app, SpecFlags& flags, const std::string& default_mode);
// Sets the engine's proposer from the flags. A draft model proposer needs the target (and
// the config's context and KV sizes); with a null target the flags are only checked.
Status apply_spec_flags(const SpecFlags& flags, engine::EngineConfig& config,
                        const std::shared_ptr<const model::Model>& target = nullptr);

// "metro <cmd>: <message>" on stderr; returns 1.
int fail(const char* cmd, const Status& s);

// --chat-template FILE: the file read and parsed (errors name the path).
Expected<tokenizer::ChatTemplate> read_chat_template(const std::string& file);
// The model's own chat template, or FILE's when one is given.
Expected<tokenizer::ChatTemplate> chat_template_of(const model::Model& m, const std::string& file);

// The error of opening or loading `path`, prefixed with the path as the user typed it (the
// library names files by their base name only, as its errors may reach HTTP clients).
Status with_path(const std::string& path, const Status& s);

// Whether two paths name one file (same device and inode); false when either does not exist.
bool same_file(const std::string& a, const std::string& b);

}  // namespace metro::cli
