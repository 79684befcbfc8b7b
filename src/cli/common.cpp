#include "cli/common.h"

#include <cstdio>

#include "backends/registry.h"
#include "base/clock.h"
#include "base/cpu_features.h"
#include "engine/speculative/ngram.h"

namespace metro::cli {

Expected<LoadedModel> load_model(const std::string& path, bool allow_repack, const std::string& device,
                                 std::chrono::milliseconds watch_period) {
  Stopwatch sw;
  LoadedModel lm;
  model::ModelOptions opts;
  opts.allow_repack = allow_repack;
  METRO_ASSIGN_OR_RETURN(opts.backend, backends::make_backend(device));
  opts.watch_period = watch_period;
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::load(path, opts));
  METRO_ASSIGN_OR_RETURN(tokenizer::Tokenizer tok, tokenizer::Tokenizer::from_gguf(m->file()));
  lm.model = std::move(m);
  lm.tokenizer = std::make_unique<tokenizer::Tokenizer>(std::move(tok));
  lm.load_seconds = sw.elapsed_s();
  return lm;
}

int default_threads() { return cpu_features().physical_cores; }

Expected<kernels::DType> parse_kv_type(const std::string& name) {
  if (name == "f16") return kernels::DType::kF16;
  if (name == "q8_0") return kernels::DType::kQ8_0;
  return invalid_argument("--kv-type must be f16 or q8_0");
}

int fail(const char* cmd, const Status& s) {
  std::fprintf(stderr, "metro %s: %s\n", cmd, s.message().c_str());
  return 1;
}

void add_spec_flags(CLI::App& app, SpecFlags& flags, const std::string& default_mode) {
  flags.mode = default_mode;
  app.add_option("--spec", flags.mode,
                 "speculative decoding: off, or ngram (drafts from the request's prediction, its own "
                 "tokens and an n-gram pool; outputs are unchanged)")
      ->capture_default_str();
  app.add_option("--spec-max-k", flags.max_k, "most draft tokens per sequence and step")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spec-draft", flags.draft, "draft model GGUF (for --spec draft)");
}

Status apply_spec_flags(const SpecFlags& flags, engine::EngineConfig& config) {
  if (flags.mode == "off") {
    if (!flags.draft.empty()) return invalid_argument("--spec-draft needs --spec draft");
    config.proposer = nullptr;
    config.max_draft_tokens = 0;
    return Status::ok_status();
  }
  if (flags.mode == "ngram") {
    if (!flags.draft.empty()) return invalid_argument("--spec-draft needs --spec draft");
    config.proposer = std::make_shared<engine::speculative::NgramProposer>();
    config.max_draft_tokens = flags.max_k;
    return Status::ok_status();
  }
  if (flags.mode == "draft" || flags.mode == "self") {
    return unimplemented("--spec " + flags.mode + " is not built yet (docs/speculative.md); use --spec ngram");
  }
  return invalid_argument("--spec must be off or ngram, got '" + flags.mode + "'");
}

}  // namespace metro::cli
