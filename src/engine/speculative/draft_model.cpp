#include "engine/speculative/draft_model.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "base/thread_pool.h"
#include "kernels/ops.h"

namespace metro::engine::speculative {

namespace {

constexpr double kPassForget = 0.98;  // per pass, in the cost fit
constexpr int64_t kMinPasses = 8;     // passes before cost() reports the fit

Status same_vocabulary(const model::Model& draft, const model::Model& target) {
  constexpr const char* kKey = "tokenizer.ggml.tokens";
  auto dt = draft.file().get_string_array(kKey);
  auto tt = target.file().get_string_array(kKey);
  if (!dt.ok() || !tt.ok()) return invalid_argument("the draft model and the model must both carry a vocabulary (" + std::string(kKey) + ")");
  if (dt->size() != tt->size()) {
    return invalid_argument("the draft model's vocabulary has " + std::to_string(dt->size()) +
                            " tokens; the model's has " + std::to_string(tt->size()) + ": it must be the same");
  }
  for (size_t i = 0; i < tt->size(); ++i) {
    if ((*dt)[i] != (*tt)[i]) {
      return invalid_argument("the draft model's vocabulary differs from the model's at token " + std::to_string(i) +
                              ": it must be the same");
    }
  }
  if (draft.hparams().n_vocab < target.hparams().n_vocab) {
    return invalid_argument("the draft model's output has " + std::to_string(draft.hparams().n_vocab) +
                            " rows, fewer than the model's " + std::to_string(target.hparams().n_vocab));
  }
  return {};
}

}  // namespace

Expected<std::unique_ptr<ModelProposer>> ModelProposer::create(std::shared_ptr<const model::Model> draft,
                                                               const model::Model& target, ModelProposerOptions options,
                                                               std::shared_ptr<const void> keep_alive) {
  if (!draft) return invalid_argument("no draft model");
  if (!draft->shard().starts_model() || !draft->shard().ends_model || draft->shard().sliced()) {
    return invalid_argument("a draft model must be whole: from its embedding to its head, unsliced");
  }
  METRO_RETURN_IF_ERROR(same_vocabulary(*draft, target));
  if (options.max_k < 1 || options.max_seqs < 1 || options.n_ctx < 1 || options.block_size < 1 ||
      options.max_pass_tokens < 1 || options.kv_tokens < options.block_size) {
    return invalid_argument("draft model options out of range");
  }
  return std::unique_ptr<ModelProposer>(new ModelProposer(std::move(draft), options, std::move(keep_alive)));
}

ModelProposer::ModelProposer(std::shared_ptr<const model::Model> draft, ModelProposerOptions options,
                             std::shared_ptr<const void> keep_alive)
    : draft_(std::move(draft)), keep_alive_(std::move(keep_alive)), opt_(options), fit_(kPassForget) {
  const int64_t blocks = (opt_.kv_tokens + opt_.block_size - 1) / opt_.block_size;
  arena_ = std::make_unique<kv::KvArena>(draft_->backend(), draft_->kv_layers(),
                                         draft_->kv_layout(opt_.kv_type, opt_.block_size), static_cast<int32_t>(blocks));
  ws_ = draft_->make_workspace({opt_.max_pass_tokens + opt_.max_seqs, opt_.max_seqs, opt_.max_seqs,
                                (opt_.n_ctx + opt_.max_k + opt_.block_size - 1) / opt_.block_size + 1, opt_.n_ctx});
  free_.reserve(static_cast<size_t>(blocks));
  for (int64_t b = blocks - 1; b >= 0; --b) free_.push_back(static_cast<kv::BlockId>(b));
}

void ModelProposer::release(Seq& s) {
  free_.insert(free_.end(), s.blocks.begin(), s.blocks.end());
  s.blocks.clear();
  s.fed.clear();
  s.known = 0;
}

void ModelProposer::forget(uint64_t seq_id) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return;
  release(it->second);
  seqs_.erase(it);
}

bool ModelProposer::reserve(Seq& s, int positions) {
  const size_t need = static_cast<size_t>((positions + opt_.block_size - 1) / opt_.block_size);
  if (s.blocks.size() >= need) return true;
  const size_t more = need - s.blocks.size();
  while (free_.size() < more) {
    // The sequence that drafted least recently, not one of this call's.
    Seq* victim = nullptr;
    for (auto& [id, o] : seqs_) {
      if (&o == &s || o.blocks.empty() || o.last_used == calls_) continue;
      if (victim == nullptr || o.last_used < victim->last_used) victim = &o;
    }
    if (victim == nullptr) return false;
    release(*victim);
  }
  for (size_t i = 0; i < more; ++i) {
    s.blocks.push_back(free_.back());
    free_.pop_back();
  }
  return true;
}

bool ModelProposer::run_pass(ThreadPool& pool, int n_seqs, int catch_up_tokens) {
  const auto t0 = std::chrono::steady_clock::now();
  auto out = draft_->forward(batch_, arena_->view(tables_), ws_, pool);
  if (!out.ok()) return false;
  out_ = *out;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fit_.add({1.0, static_cast<double>(n_seqs), static_cast<double>(catch_up_tokens)}, s);
  return true;
}

size_t ModelProposer::valid_prefix(const Seq& s, const std::vector<int32_t>& toks) {
  const size_t limit = std::min(s.fed.size(), toks.empty() ? 0 : toks.size() - 1);
  size_t valid = std::min(s.known, limit);
  while (valid < limit && s.fed[valid] == toks[valid]) ++valid;
  return valid;
}

int ModelProposer::catch_up(const ProposeInput& in) const {
  const std::vector<int32_t>& toks = in.seq->tokens;
  auto it = seqs_.find(in.seq->id);
  const size_t valid = it == seqs_.end() ? 0 : valid_prefix(it->second, toks);
  // Beyond the two tokens every step feeds (the last committed one and, after an accepted
  // draft, the draft the step did not feed).
  return std::max(0, static_cast<int>(toks.size() - valid) - 2);
}

DraftCost ModelProposer::cost() const {
  std::array<double, 3> t{};
  if (fit_.seen() < kMinPasses || !fit_.solve(&t)) return {};
  // Never free: a pass costs at least what a tenth of a sequence in it does.
  const double pass = std::max(t[0], 1e-9);  // positive: the fit has priced the passes
  return DraftCost{pass, std::max(t[1], 0.1 * pass), std::max(t[2], 0.0)};
}

void ModelProposer::calibrate(ThreadPool& pool) {
  // (sequences, tokens each): decode-like passes of 1-4 sequences and catch-up passes.
  static constexpr std::pair<int, int> kShapes[] = {{1, 1}, {2, 1}, {4, 1}, {1, 9}, {1, 33}, {4, 9}};
  const int n_vocab = static_cast<int>(draft_->hparams().n_vocab);
  std::vector<std::vector<kv::BlockId>> owned;
  for (int rep = 0; rep < 2; ++rep) {
    for (auto [seqs, tokens] : kShapes) {
      seqs = std::min(seqs, opt_.max_seqs);
      tokens = std::min(tokens, std::max(1, opt_.max_pass_tokens / seqs));
      const size_t blocks = static_cast<size_t>((tokens + opt_.block_size - 1) / opt_.block_size);
      if (free_.size() < blocks * static_cast<size_t>(seqs)) continue;
      owned.assign(static_cast<size_t>(seqs), {});
      batch_.clear();
      tables_.clear();
      for (int q = 0; q < seqs; ++q) {
        for (size_t b = 0; b < blocks; ++b) {
          owned[static_cast<size_t>(q)].push_back(free_.back());
          free_.pop_back();
        }
        for (int t = 0; t < tokens; ++t) batch_.add((q * 31 + t * 7) % n_vocab, t, q, t + 1 == tokens);
      }
      for (const auto& o : owned) tables_.emplace_back(o.data(), o.size());
      run_pass(pool, seqs, seqs * (tokens - 1));
      for (const auto& o : owned) free_.insert(free_.end(), o.begin(), o.end());
    }
  }
}

void ModelProposer::draft(std::span<DraftJob> jobs, ThreadPool& pool) {
  ++calls_;
  batch_.clear();
  tables_.clear();
  active_.clear();
  int budget = opt_.max_pass_tokens;
  int catch_up = 0;
  for (size_t j = 0; j < jobs.size() && static_cast<int>(tables_.size()) < opt_.max_seqs; ++j) {
    DraftJob& job = jobs[j];
    const std::vector<int32_t>& toks = job.in.seq->tokens;
    if (toks.empty() || job.k <= 0) continue;
    Seq& s = seqs_[job.in.seq->id];
    s.last_used = calls_;
    // Keep what the draft model fed that the sequence still has: its tokens up to the first
    // rejected draft. The last committed token is always fed again (its logits are the
    // first draft's), so at least one token is pending.
    const size_t valid = valid_prefix(s, toks);
    s.fed.resize(valid);
    s.known = valid;
    const int pending = static_cast<int>(toks.size() - valid);
    const int feed = std::min(pending, budget);
    if (feed <= 0) continue;
    const bool drafts = feed == pending;
    const int k = std::min(job.k, opt_.max_k);
    const int positions = static_cast<int>(valid) + feed + (drafts ? k - 1 : 0);
    if (positions > opt_.n_ctx + opt_.max_k || !reserve(s, positions)) continue;
    const int32_t slot = static_cast<int32_t>(tables_.size());
    for (int i = 0; i < feed; ++i) {
      const size_t p = valid + static_cast<size_t>(i);
      batch_.add(toks[p], static_cast<int32_t>(p), slot, drafts && i + 1 == feed);
      s.fed.push_back(toks[p]);
    }
    tables_.emplace_back(s.blocks.data(), s.blocks.size());
    budget -= feed;
    catch_up += feed - 1;
    if (drafts) active_.push_back(Active{j, &s});
  }
  if (batch_.empty()) return;
  // A failed pass wrote no K/V: the sequences of this call keep only what was known before.
  auto forget_fed = [this] {
    for (auto& [id, s] : seqs_) {
      if (s.last_used == calls_) s.fed.resize(std::min(s.fed.size(), s.known));
    }
  };
  if (!run_pass(pool, static_cast<int>(tables_.size()), catch_up)) {
    forget_fed();
    return;
  }
  const int n_vocab = out_.n_vocab;
  // Logits rows come in batch order, which is the order of active_.
  for (int depth = 1; !active_.empty(); ++depth) {
    next_.clear();
    batch_.clear();
    tables_.clear();
    for (size_t a = 0; a < active_.size(); ++a) {
      DraftJob& job = jobs[active_[a].job];
      const auto tok = static_cast<int32_t>(kernels::argmax(out_.row(static_cast<int>(a)).data(), n_vocab));
      job.tokens->push_back(tok);
      if (depth >= std::min(job.k, opt_.max_k)) continue;
      Seq& s = *active_[a].seq;
      const auto slot = static_cast<int32_t>(tables_.size());
      batch_.add(tok, static_cast<int32_t>(s.fed.size()), slot, true);
      s.fed.push_back(tok);
      tables_.emplace_back(s.blocks.data(), s.blocks.size());
      next_.push_back(active_[a]);
    }
    std::swap(active_, next_);
    if (active_.empty()) break;
    if (!run_pass(pool, static_cast<int>(active_.size()), 0)) {
      forget_fed();
      return;
    }
  }
}

Expected<std::shared_ptr<const model::Model>> make_self_draft(const model::Model& target, const std::vector<int>& skip) {
  if (!target.shard().starts_model() || !target.shard().ends_model || target.shard().sliced()) {
    return invalid_argument("self-drafting needs the whole model in one process");
  }
  if (target.file_given_back() > 0) {
    return invalid_argument("self-drafting binds the model's file again, whose copy was given back after loading");
  }
  METRO_ASSIGN_OR_RETURN(gguf::File file, gguf::File::parse(target.file().bytes()));
  model::ModelOptions o;
  o.backend = target.backend();
  o.shard.skip = skip;
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> m, model::Model::from_file(std::move(file), o));
  return std::shared_ptr<const model::Model>(std::move(m));
}

Expected<std::vector<int>> parse_layer_list(const std::string& text) {
  std::vector<int> out;
  size_t i = 0;
  auto number = [&](int* v) {
    const size_t start = i;
    long long x = 0;
    while (i < text.size() && text[i] >= '0' && text[i] <= '9' && i - start < 6) x = x * 10 + (text[i++] - '0');
    if (i == start || (i < text.size() && text[i] >= '0' && text[i] <= '9')) return false;
    *v = static_cast<int>(x);
    return true;
  };
  while (i < text.size()) {
    int a = 0, b = 0;
    if (!number(&a)) return invalid_argument("a layer list is numbers and ranges a-b separated by commas: '" + text + "'");
    b = a;
    if (i < text.size() && text[i] == '-') {
      ++i;
      if (!number(&b) || b < a) return invalid_argument("bad layer range in '" + text + "'");
    }
    for (int l = a; l <= b; ++l) out.push_back(l);
    if (i < text.size()) {
      if (text[i] != ',' || i + 1 == text.size()) {
        return invalid_argument("a layer list is numbers and ranges a-b separated by commas: '" + text + "'");
      }
      ++i;
    }
  }
  if (out.empty()) return invalid_argument("an empty layer list");
  return out;
}

}  // namespace metro::engine::speculative
