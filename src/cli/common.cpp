#include "cli/common.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>

#include "backends/registry.h"
#include "cli/progress.h"
#include "base/clock.h"
#include "base/cpu_features.h"
#include "engine/speculative/draft_model.h"
#include "engine/speculative/ngram.h"

namespace metro::cli {

Expected<tokenizer::ChatTemplate> read_chat_template(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return io_error("cannot read the chat template file '" + file + "'");
  std::string source((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto t = tokenizer::ChatTemplate::parse(std::move(source));
  if (!t.ok()) return with_path(file, t.status());
  return t;
}

Expected<tokenizer::ChatTemplate> chat_template_of(const model::Model& m, const std::string& file) {
  return file.empty() ? tokenizer::ChatTemplate::from_gguf(m.file()) : read_chat_template(file);
}

Status with_path(const std::string& path, const Status& s) {
  if (s.ok()) return s;
  return Status(s.code(), "'" + path + "': " + s.message());
}

Expected<LoadedModel> load_model(const std::string& path, bool allow_repack, const std::string& device,
                                 std::chrono::milliseconds watch_period, bool progress,
                                 const std::vector<model::LoraSpec>& lora,
                                 const std::vector<model::LoraSpec>& adapters, const model::MemBudget& budget) {
  Stopwatch sw;
  LoadedModel lm;
  model::ModelOptions opts;
  opts.mem_budget = budget;
  opts.allow_repack = allow_repack;
  opts.lora = lora;
  opts.adapters = adapters;
  METRO_ASSIGN_OR_RETURN(opts.backend, backends::make_backend(device));
  opts.watch_period = watch_period;
  std::optional<Progress> bar;  // made at the first chunk, when the size is known
  size_t shown = 0;
  if (progress) {
    opts.read.on_chunk = [&](size_t done, size_t total) {
      if (!bar) bar.emplace("load", total);
      bar->advance(done - shown, path.substr(path.find_last_of('/') + 1));
      shown = done;
    };
  }
  auto loaded = model::Model::load(path, opts);
  if (bar) bar->finish();
  if (!loaded.ok()) return with_path(path, loaded.status());
  std::unique_ptr<model::Model> m = std::move(*loaded);
  auto tok_or = tokenizer::Tokenizer::from_gguf(m->file());
  if (!tok_or.ok()) return with_path(path, tok_or.status());
  tokenizer::Tokenizer tok = std::move(*tok_or);
  lm.model = std::move(m);
  lm.tokenizer = std::make_unique<tokenizer::Tokenizer>(std::move(tok));
  lm.load_seconds = sw.elapsed_s();
  return lm;
}

std::vector<model::LoraSpec> LoraFlags::specs() const {
  std::vector<model::LoraSpec> out;
  for (const auto& f : files) out.push_back({f, 1.0f});
  for (const auto& [f, s] : scaled) out.push_back({f, static_cast<float>(s)});
  return out;
}

void add_lora_flags(CLI::App& app, LoraFlags& flags) {
  app.add_option("--lora", flags.files, "LoRA adapter GGUF merged into the model's weights at load (repeatable)");
  app.add_option("--lora-scaled", flags.scaled, "LoRA adapter GGUF and its scale, merged at load (repeatable)");
}

// "4GiB", "512MiB", "1.5G", "1048576" -> bytes.
Expected<int64_t> parse_size(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) return invalid_argument("expected a size like 4GiB, 512MiB or 1048576, got '" + s + "'");
  const double v = std::strtod(s.substr(0, i).c_str(), nullptr);
  std::string unit = s.substr(i);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double mult;
  if (unit.empty() || unit == "b")
    mult = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib")
    mult = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib")
    mult = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib")
    mult = 1024.0 * 1024 * 1024;
  else
    return invalid_argument("unknown size unit in '" + s + "' (use KiB, MiB or GiB)");
  const double bytes = v * mult;
  if (!(bytes >= 0 && bytes < 9.0e18)) return invalid_argument("size out of range: '" + s + "'");
  return static_cast<int64_t>(bytes);
}

Expected<model::MemBudget> MemBudgetFlags::parse() const {
  model::MemBudget b;
  if (bytes.empty()) return b;
  METRO_ASSIGN_OR_RETURN(const int64_t n, parse_size(bytes));
  b.bytes = static_cast<uint64_t>(n);
  if (b.bytes == 0) return invalid_argument("--mem-budget must be positive");
  b.store.dir = dir;
  b.store.drop_page_cache = drop_page_cache;
  return b;
}

void add_mem_budget_flags(CLI::App& app, MemBudgetFlags& flags) {
  app.add_option("--mem-budget", flags.bytes,
                 "cap each model's resident weights (e.g. 6GiB): the experts of a mixture-of-experts model stay "
                 "in a file behind the page cache, the least recently used given back past the cap");
  app.add_option("--cold-dir", flags.dir, "directory on a disk for the cold experts' file (removed at exit)")
      ->capture_default_str();
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
                 "speculative decoding: off; ngram (drafts from the request's prediction, its own tokens "
                 "and an n-gram pool); draft (a smaller model with the same vocabulary, --spec-draft); self "
                 "(the model with layers skipped). Outputs are unchanged")
      ->capture_default_str();
  app.add_option("--spec-max-k", flags.max_k, "most draft tokens per sequence and step")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--spec-draft", flags.draft, "draft model GGUF (for --spec draft)");
  app.add_flag("!--spec-no-controller", flags.adaptive,
               "verify every proposed token instead of letting the controller choose (measures a "
               "proposer's acceptance; slower where guesses are poor)");
  app.add_flag("!--no-jump-forward", flags.jump_forward,
               "compute tokens a request's grammar forces one step each, as other tokens, instead of "
               "in the step that finds them (outputs are the same either way)");
  app.add_option("--spec-self-skip", flags.self_skip,
                 "layers the self-draft skips, e.g. 10-19 (for --spec self; default: docs/speculative.md)");
}

namespace {

// The layers --spec self skips by default: the sixth of the layers after the middle, the
// skip set with the best acceptance for its savings among those measured on the default
// model (docs/speculative.md).
std::vector<int> default_self_skip(int n_layer) {
  std::vector<int> skip;
  const int n = std::max(1, n_layer / 6);
  for (int l = n_layer / 2; l < n_layer / 2 + n && l < n_layer - 1; ++l) skip.push_back(l);
  if (skip.empty()) skip.push_back(n_layer - 1);
  return skip;
}

}  // namespace

Status apply_spec_flags(const SpecFlags& flags, engine::EngineConfig& config,
                        const std::shared_ptr<const model::Model>& target) {
  namespace sp = engine::speculative;
  const bool is_draft = flags.mode == "draft", is_self = flags.mode == "self";
  if (!flags.draft.empty() && !is_draft) return invalid_argument("--spec-draft needs --spec draft");
  if (!flags.self_skip.empty() && !is_self) return invalid_argument("--spec-self-skip needs --spec self");
  config.jump_forward = flags.jump_forward;
  if (flags.mode == "off") {
    config.proposer = nullptr;
    config.max_draft_tokens = 0;
    return Status::ok_status();
  }
  config.adaptive_drafts = flags.adaptive;
  if (flags.mode == "ngram") {
    config.proposer = std::make_shared<sp::NgramProposer>();
    config.max_draft_tokens = flags.max_k;
    return Status::ok_status();
  }
  if (!is_draft && !is_self) return invalid_argument("--spec must be off, ngram, draft or self, got '" + flags.mode + "'");
  if (is_draft && flags.draft.empty()) return invalid_argument("--spec draft needs --spec-draft FILE");
  std::vector<int> skip;
  if (is_self && !flags.self_skip.empty()) {
    METRO_ASSIGN_OR_RETURN(skip, sp::parse_layer_list(flags.self_skip));
  }
  if (!target) return Status::ok_status();
  if (is_self && flags.self_skip.empty()) skip = default_self_skip(static_cast<int>(target->hparams().n_layer));
  // A draft file is loaded once for every engine these flags make; a self-draft reads the
  // target's bytes, so it is made for each target and lives no longer than its proposer.
  std::shared_ptr<const model::Model> draft;
  if (is_draft) {
    if (!*flags.loaded) {
      model::ModelOptions mo;
      mo.backend = target->backend();
      auto m = model::Model::load(flags.draft, mo);
      if (!m.ok()) return invalid_argument("--spec-draft: " + m.status().message());
      *flags.loaded = std::move(*m);
    }
    draft = *flags.loaded;
  } else {
    METRO_ASSIGN_OR_RETURN(draft, sp::make_self_draft(*target, skip));
  }
  sp::ModelProposerOptions o;
  o.source = is_draft ? sp::DraftSource::kDraftModel : sp::DraftSource::kSelf;
  o.max_k = flags.max_k;
  o.max_seqs = config.max_seqs;
  const int train = static_cast<int>(target->max_context());
  o.n_ctx = config.n_ctx > 0 ? std::min(config.n_ctx, train) : train;
  o.block_size = config.kv_block;
  o.kv_type = config.kv_type;
  // As many positions as the model's own KV cache, within 512 MiB of the draft's KV.
  const int64_t per_token = static_cast<int64_t>(draft->kv_layout(o.kv_type, o.block_size).page_bytes() * 2 *
                                                 static_cast<size_t>(draft->kv_layers()) / static_cast<size_t>(o.block_size));
  const int64_t target_tokens = config.ctx_total > 0 ? config.ctx_total : 64 * 1024;
  o.kv_tokens = std::max<int64_t>(o.block_size, std::min<int64_t>(target_tokens, (int64_t{512} << 20) / std::max<int64_t>(1, per_token)));
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<sp::ModelProposer> p,
                         sp::ModelProposer::create(draft, *target, o, is_self ? std::shared_ptr<const void>(target) : nullptr));
  config.proposer = std::move(p);
  config.max_draft_tokens = flags.max_k;
  return Status::ok_status();
}

bool same_file(const std::string& a, const std::string& b) {
  struct stat sa {}, sb {};
  if (::stat(a.c_str(), &sa) != 0 || ::stat(b.c_str(), &sb) != 0) return false;
  return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
}

}  // namespace metro::cli
