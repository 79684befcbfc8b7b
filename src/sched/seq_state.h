// The scheduler's view of one sequence. The scheduler thinks in computed vs total tokens,
// not phases: a sequence is "prefilling" while n_computed < tokens.size() - 1 and decoding
// when one token (the last sampled one) remains to compute. Proposed tokens (drafts of
// speculative decoding) are kept apart from the committed ones until they are verified.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/sla.h"

namespace metro::sched {

enum class SeqStatus : uint8_t { kWaiting, kRunning, kFinished };

struct SeqState {
  uint64_t id = 0;               // unique; the KV cache's key
  std::vector<int32_t> tokens;   // committed: prompt, then generated tokens (the engine appends)
  // Proposed continuation after tokens.back(), not yet verified; only while decoding
  // (n_uncomputed() == 1). The engine sets it before a step and clears it after sampling.
  std::vector<int32_t> draft;
  int n_prompt = 0;
  int n_computed = 0;            // leading tokens whose K/V are in the cache
  int n_cached_prompt = 0;       // prompt tokens served by the prefix cache
  int max_new_tokens = 0;        // upper bound on generated tokens
  int64_t arrival_ns = 0;
  bool use_prefix_cache = true;  // off for embeddings (every hidden state must be computed)
  // The prompt is computed in one step or not at all: an encoder's attention is
  // bidirectional, so no chunk of it can be computed before the rest is known.
  bool whole_prompt = false;
  uint64_t cache_scope = 0;      // prefix-cache scope (KvCacheManager::computed_blocks); 0: global

  // Traffic policy: class, tenant, optional deadline.
  SlaClass sla_class = SlaClass::kStandard;
  std::string tenant;
  int64_t deadline_ns = 0;       // 0: none
  // A 64-bit hash of the chat template / system prompt the request was rendered with (0:
  // unknown). Requests sharing it tend to share output lengths; the length predictor uses it.
  uint64_t prefix_hash = 0;

  // Owned by the scheduler.
  SeqStatus status = SeqStatus::kWaiting;
  uint64_t admit_order = 0;      // increases with each admission to running
  int n_preemptions = 0;
  int64_t first_scheduled_ns = 0;
  int predicted_output_tokens = -1;  // the length predictor's guess at admission; -1: none

  int n_generated() const { return static_cast<int>(tokens.size()) - n_prompt; }
  int n_uncomputed() const { return static_cast<int>(tokens.size()) - n_computed; }
  // Tokens a step could compute: the uncomputed committed ones, then the drafts.
  int n_to_compute() const {
    return n_uncomputed() + (n_uncomputed() == 1 ? static_cast<int>(draft.size()) : 0);
  }
  // Whether computing n of its tokens this step would cut a prompt that must stay whole.
  bool cuts_whole_prompt(int n) const { return whole_prompt && n > 0 && n < n_uncomputed(); }
};

}  // namespace metro::sched
