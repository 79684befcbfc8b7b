// One sequence through a model's forward pass in tests: the logits of every position.
#pragma once

#include <cstdint>
#include <vector>

#include "base/thread_pool.h"
#include "model/model.h"

namespace metro::testing {

using Logits = std::vector<std::vector<float>>;

// Logits of every position of `toks`, computed in steps of `chunk` tokens on `threads`
// threads over KV pages of `block_size` tokens, for a context per sequence of n_ctx (0: the
// trained one; model::WorkspaceLimits::n_ctx), every token with LoRA adapter `adapter` (0:
// none; model::Batch::adapter).
Logits sequence_logits(const model::Model& m, const std::vector<int32_t>& toks, int chunk, int threads = 2,
                       int block_size = 16, int n_ctx = 0, int16_t adapter = 0);

// Runs one step and appends the logits rows it returns; false (and a test failure) when
// the step is refused.
bool forward_rows(const model::Model& m, const model::Batch& b, const model::KvView& kv, model::Workspace& ws,
                  ThreadPool& pool, Logits& out);

// The largest |a - b| over the positions both have (NaN when any is NaN).
double max_abs_diff(const Logits& a, const Logits& b);

// An encoder's mean-pooled, L2-normalized embeddings of several sequences computed in one
// step (each sequence's positions from 0).
std::vector<std::vector<float>> mean_pooled_embeddings(const model::Model& m,
                                                       const std::vector<std::vector<int32_t>>& seqs);

// Cosine similarity in double precision.
double cosine(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace metro::testing
