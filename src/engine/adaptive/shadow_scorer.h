// Shadow scoring, the quality monitor's live measure of a low precision tier: a sample of
// what the low tier served is scored again, teacher-forced, by both tiers on a thread of its
// own at the lowest CPU priority (off the engine's critical path). Each sample gives the
// mean KL divergence of the low tier's next-token distributions from the high tier's over
// the output positions, and how often their top tokens agree; the scorer keeps a window of
// recent samples for the controller to act on (a rollback to the high tier past a bound).
//
// Per-layer drift: the scorer runs each tier as a chain of one-layer shards (views of the
// tier's weights, nothing copied), so it sees the residual stream after every layer but the
// last. A layer's drift on a sample compares the low tier's activation statistics there
// with the high tier's on the same tokens: the mean of |ln(rms ratio)| (scale) and
// |ln(max |x| ratio)| (outliers), per token averaged. 0 when the tiers agree; ln 2 ~ 0.69
// when one is twice the other.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "model/model.h"

namespace metro::engine::adaptive {

struct ShadowConfig {
  int every = 8;           // score one of every `every` requests the low tier served; 0: off
  int max_tokens = 512;    // longer sequences (prompt + output) are not scored
  size_t max_queue = 4;    // samples waiting to be scored; more are dropped
  size_t window = 8;       // recent samples the mean is taken over
  size_t min_samples = 2;  // samples needed before the mean is acted on
  double kl_max = 0.5;     // mean KL (nats) past which the controller rolls back
  double drift_max = 0.5;  // a layer's mean drift past which the controller rolls back
  bool layer_drift = true; // run the tiers layer by layer to measure drift (else whole)
  int n_ctx = 0;           // the engine's context per sequence (LongRoPE's factors); 0: trained
};

struct ShadowSample {
  double kl = 0.0;    // mean over the output positions
  double top1 = 0.0;  // fraction of output positions where both tiers' top token agrees
  int positions = 0;
  std::vector<double> drift;  // per layer but the last (empty without layer chains)
};

struct ShadowSnapshot {
  uint64_t scored = 0;     // samples scored since start
  uint64_t dropped = 0;    // offered while the queue was full, or too long
  size_t in_window = 0;    // samples in the window
  double kl_mean = 0.0;    // over the window
  double top1_mean = 0.0;
  double last_kl = 0.0;
  uint64_t generation = 0;  // moves with every scored sample
  std::vector<double> layer_drift;  // window means per layer (empty: not measured)
};

// A model as a chain of one-layer shards viewing its weights (for per-layer activations).
struct LayerChain {
  std::vector<std::shared_ptr<const model::Model>> layers;
  static Expected<LayerChain> of(const model::Model& m);
};

class ShadowScorer {
 public:
  ShadowScorer(std::shared_ptr<const model::Model> high, std::shared_ptr<const model::Model> low,
               ShadowConfig config);
  ~ShadowScorer();
  ShadowScorer(const ShadowScorer&) = delete;
  ShadowScorer& operator=(const ShadowScorer&) = delete;

  // Whether a finished low-tier request should be offered (the every-N sample).
  bool wants_next();
  // Queues a sequence (prompt then output) for scoring; false when it was dropped.
  bool offer(std::vector<int32_t> tokens, int n_prompt);
  ShadowSnapshot snapshot() const;
  // The newest min(n, window) samples of the window, oldest first.
  std::vector<ShadowSample> recent(size_t n) const;
  // Empties the window (after a rollback: the next decision needs fresh samples).
  void reset_window();
  const ShadowConfig& config() const { return cfg_; }

  // Both models teacher-forced over `tokens`; KL(high || low) and top-1 agreement over the
  // positions that predict tokens [n_prompt, size).
  // With both chains, the passes run layer by layer and the sample has per-layer drift.
  // n_ctx: the serving engine's context per sequence (ShadowConfig::n_ctx).
  static Expected<ShadowSample> score(const model::Model& high, const model::Model& low,
                                      std::span<const int32_t> tokens, int n_prompt, ThreadPool& pool,
                                      const LayerChain* high_chain = nullptr, const LayerChain* low_chain = nullptr,
                                      int n_ctx = 0);

 private:
  struct Job {
    std::vector<int32_t> tokens;
    int n_prompt = 0;
  };
  void run();

  std::shared_ptr<const model::Model> high_, low_;
  std::optional<LayerChain> high_chain_, low_chain_;
  ShadowConfig cfg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::deque<ShadowSample> window_;
  ShadowSnapshot snap_;
  uint64_t offered_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace metro::engine::adaptive
