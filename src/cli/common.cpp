#include "cli/common.h"

#include <cstdio>

#include "backends/registry.h"
#include "base/clock.h"
#include "base/cpu_features.h"

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

}  // namespace metro::cli
