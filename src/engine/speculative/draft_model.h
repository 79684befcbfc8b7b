// Drafts from a model: a smaller model that reads the target's vocabulary (--spec draft),
// or the target itself with some of its layers skipped (--spec self). Either way the draft
// is the draft model's greedy continuation, a guess that does not depend on the request's
// random stream, so the engine's verification keeps the output exactly the target's
// (proposer.h).
//
// The draft model keeps its own paged KV memory: per sequence, the tokens whose K/V it
// holds. Each step it first catches up on the sequence's committed tokens it has not seen
// (the prompt, on the first step; afterwards the drafts the target rejected are dropped
// and the tokens it chose instead fed), in one pass for all drafting sequences, then runs
// one more pass per draft position with the sequences drafting that far. A long prompt is
// fed over several steps (at most max_pass_tokens per pass); the sequence drafts once it
// has caught up. When the arena is full, the sequences that drafted least recently give
// their blocks back.
//
// The time of each pass is fitted on its shape (a fixed part, a part per sequence and per
// catch-up token), starting from passes of a few shapes timed before the engine's first
// step (calibrate), and cost() hands the controller what a draft position costs, so
// drafting stops by itself where the draft model is too slow for what it gets accepted.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/speculative/online_fit.h"
#include "engine/speculative/proposer.h"
#include "kernels/dtype.h"
#include "kv/kv_arena.h"
#include "model/model.h"

namespace metro::engine::speculative {

struct ModelProposerOptions {
  DraftSource source = DraftSource::kDraftModel;  // or kSelf: the label drafts are counted under
  int max_k = 8;                 // most draft tokens per sequence and step
  int max_seqs = 64;             // sequences per pass
  int n_ctx = 2048;              // positions per sequence (the target's context)
  int64_t kv_tokens = 65536;     // positions of the draft's KV arena, all sequences together
  int block_size = 16;
  int max_pass_tokens = 512;     // tokens of the first pass of a step (catching up included)
  kernels::DType kv_type = kernels::DType::kF16;
};

class ModelProposer final : public Proposer {
 public:
  // `draft` must read `target`'s vocabulary (the same token texts, in the same order), else
  // an error names the first difference. `keep_alive` is held as long as the proposer (the
  // owner of bytes the draft model reads in place, when it shares the target's).
  static Expected<std::unique_ptr<ModelProposer>> create(std::shared_ptr<const model::Model> draft,
                                                         const model::Model& target, ModelProposerOptions options,
                                                         std::shared_ptr<const void> keep_alive = nullptr);

  DraftSource propose(const ProposeInput&, int, std::vector<int32_t>&) override { return DraftSource::kNone; }
  void forget(uint64_t seq_id) override;
  DraftSource model_source() const override { return opt_.source; }
  DraftCost cost() const override;
  void calibrate(ThreadPool& pool) override;
  int catch_up(const ProposeInput& in) const override;
  void draft(std::span<DraftJob> jobs, ThreadPool& pool) override;

  const model::Model& model() const { return *draft_; }
  size_t tracked_sequences() const { return seqs_.size(); }
  int32_t free_blocks() const { return static_cast<int32_t>(free_.size()); }
  int32_t total_blocks() const { return arena_->n_blocks(); }

 private:
  ModelProposer(std::shared_ptr<const model::Model> draft, ModelProposerOptions options,
                std::shared_ptr<const void> keep_alive);
  struct Seq {
    std::vector<kv::BlockId> blocks;
    std::vector<int32_t> fed;  // tokens whose K/V the blocks hold, from position 0
    size_t known = 0;          // fed tokens already found among the sequence's (never change)
    uint64_t last_used = 0;    // the draft() call that last used it
  };
  struct Active {
    size_t job;
    Seq* seq;
  };
  // Gives `s` blocks for `positions` positions, taking them from sequences not used in this
  // call when none are free; false when that is not enough.
  bool reserve(Seq& s, int positions);
  void release(Seq& s);
  // How many of `toks` the blocks of `s` hold: its fed tokens up to the first difference,
  // never the last token (whose logits are the first draft's). A sequence's committed
  // tokens never change, so only the fed tokens past `known` (drafts) are compared.
  static size_t valid_prefix(const Seq& s, const std::vector<int32_t>& toks);
  // One forward of batch_ over tables_; the time goes into the cost fit.
  bool run_pass(ThreadPool& pool, int n_seqs, int catch_up_tokens);

  std::shared_ptr<const model::Model> draft_;
  std::shared_ptr<const void> keep_alive_;
  ModelProposerOptions opt_;
  std::unique_ptr<kv::KvArena> arena_;
  model::Workspace ws_;
  std::vector<kv::BlockId> free_;
  std::unordered_map<uint64_t, Seq> seqs_;
  uint64_t calls_ = 0;
  OnlineFit<3> fit_;  // pass seconds on (1, sequences, catch-up tokens)
  // Per pass scratch.
  model::Batch batch_;
  std::vector<std::span<const kv::BlockId>> tables_;
  std::vector<Active> active_, next_;
  model::ForwardOutput out_;
};

// The target with `skip` layers left out, as a model of its own: it reads the target's
// weights in the target's bytes (the caller keeps the target alive) and binds its own
// copies only where the backend repacks them.
Expected<std::shared_ptr<const model::Model>> make_self_draft(const model::Model& target, const std::vector<int>& skip);

// "a,b,c-d" -> layer ids (ranges inclusive); an error names what does not parse.
Expected<std::vector<int>> parse_layer_list(const std::string& text);

}  // namespace metro::engine::speculative
