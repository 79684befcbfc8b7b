// Drafts without a second model: the request's predicted output, then n-gram lookup in the
// sequence's own prompt and output, then a pool of n-grams shared by requests.
//
// - Prediction: the sequence's output is aligned with the request's `prediction` (a cursor
//   that advances while the output follows it, re-found by the longest output tail that
//   occurs in the prediction when it does not), and the prediction's next tokens are the draft.
// - Context: the longest tail of the sequence (max_n down to min_n tokens) that occurred
//   before in the same sequence; the tokens that followed its latest occurrence are the
//   draft. Rewrites, code edits and answers that quote their context repeat long spans.
// - Pool: a fixed-size table from hashed n-grams (pool_n and pool_n - 1 tokens) to the
//   token that last followed them, fed with every sequence's tokens; drafts chain through
//   it token by token. Keys include the sequence's cache scope, so a tenant's drafts only
//   ever come from its own requests (with the per-tenant prefix cache), as a shared pool
//   would tell one tenant by the speed of its answers what another sent.
//
// Memory: per sequence, one hash map entry per token and n; the pool is pool_entries x 16
// bytes whatever the traffic.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "engine/speculative/proposer.h"

namespace metro::engine::speculative {

struct NgramOptions {
  int min_n = 2;                        // shortest tail matched in the sequence's own tokens
  int max_n = 4;                        // longest
  int pool_n = 4;                       // pool keys: pool_n and pool_n - 1 tokens (0: no pool)
  size_t pool_entries = size_t{1} << 18;  // rounded up to a power of two
};

class NgramProposer final : public Proposer {
 public:
  explicit NgramProposer(NgramOptions options = {});

  DraftSource propose(const ProposeInput& in, int k, std::vector<int32_t>& out) override;
  void forget(uint64_t seq_id) override;

  size_t tracked_sequences() const { return seqs_.size(); }

 private:
  struct SeqIndex {
    // Per n (index n - min_n): hash of an n-gram -> the position just after its latest
    // occurrence among the n-grams ending before the sequence's last token.
    std::vector<std::unordered_map<uint64_t, int32_t>> last_end;
    int indexed = 0;  // n-grams ending at positions < indexed are in last_end
    int pooled = 0;   // n-grams followed by a token at positions < pooled are in the pool
    // Prediction alignment: position in the prediction of the token after the output,
    // as of `at_generated` generated tokens (-1: not aligned).
    int pred_cursor = -1;
    int at_generated = 0;
  };
  struct PoolEntry {
    uint64_t key = 0;  // 0: empty
    int32_t next = -1;
  };

  bool from_prediction(SeqIndex& ix, const ProposeInput& in, int k, std::vector<int32_t>& out) const;
  bool from_context(SeqIndex& ix, const std::vector<int32_t>& tokens, int k, std::vector<int32_t>& out) const;
  bool from_pool(const std::vector<int32_t>& tokens, uint64_t scope, int k, std::vector<int32_t>& out) const;
  void index(SeqIndex& ix, const std::vector<int32_t>& tokens);
  void feed_pool(SeqIndex& ix, const std::vector<int32_t>& tokens, uint64_t scope);
  int32_t pool_lookup(uint64_t key) const;

  NgramOptions opt_;
  std::unordered_map<uint64_t, SeqIndex> seqs_;
  std::vector<PoolEntry> pool_;
  size_t pool_mask_ = 0;
};

}  // namespace metro::engine::speculative
