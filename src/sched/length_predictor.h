// Output-length prediction for shortest-predicted-remaining-work-first scheduling.
//
// LengthPredictor is the interface a learned model can later implement. The first
// implementation, BucketQuantilePredictor, keeps the last `window` output lengths seen in
// buckets of increasingly coarse features and answers from the finest bucket that holds
// enough of them. Predictions are conditional on what a request has already generated:
// E[L - g | L > g] over the bucket's samples, so a request that outlives its bucket's typical
// length is not predicted to finish "any moment now" forever.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "sched/seq_state.h"

namespace metro::sched {

struct LengthFeatures {
  int n_prompt = 0;
  int max_new_tokens = 0;
  SlaClass sla_class = SlaClass::kStandard;
  uint64_t tenant_hash = 0;
  uint64_t prefix_hash = 0;  // template / system prompt; 0: unknown

  static LengthFeatures of(const SeqState& s);
};

struct LengthPrediction {
  // Remaining output tokens given n_generated so far, each in [1, max_new - n_generated]
  // (all 0 when nothing may be generated any more).
  double mean_remaining = 0.0;
  double median_remaining = 0.0;
  double p90_remaining = 0.0;
  int n_samples = 0;  // observations behind the answer; 0: the prior (no history yet)
};

class LengthPredictor {
 public:
  virtual ~LengthPredictor() = default;
  virtual LengthPrediction predict(const LengthFeatures& f, int n_generated) const = 0;
  // A request with these features finished after n_output_tokens (aborted ones are not
  // observations: their length says nothing about when the model would have stopped).
  virtual void observe(const LengthFeatures& f, int n_output_tokens) = 0;
  // Increases with every observe(); callers cache predictions and refresh when it moves.
  virtual uint64_t version() const = 0;
  virtual const char* name() const = 0;
};

struct BucketPredictorConfig {
  int window = 128;        // lengths kept per bucket (a sliding window: adapts to drift)
  int min_samples = 8;     // a bucket answers only with this many samples longer than g
  int max_buckets = 4096;  // cap on fine (template / tenant) buckets; coarse ones always fit
};

// Buckets, finest first: (template hash, max_tokens bucket) when the hash is known;
// (tenant, class, prompt bucket, max_tokens bucket); (class, prompt bucket, max_tokens
// bucket); (max_tokens bucket); everything. Length buckets are powers of two.
class BucketQuantilePredictor final : public LengthPredictor {
 public:
  explicit BucketQuantilePredictor(const BucketPredictorConfig& cfg = {});

  LengthPrediction predict(const LengthFeatures& f, int n_generated) const override;
  void observe(const LengthFeatures& f, int n_output_tokens) override;
  uint64_t version() const override { return n_observed_; }
  const char* name() const override { return "bucket-quantile"; }
  size_t n_buckets() const { return buckets_.size(); }

  static constexpr int kLevels = 5;

 private:
  struct Bucket {
    std::vector<int32_t> lengths;  // ring buffer
    size_t next = 0;
  };
  static uint64_t bucket_key(const LengthFeatures& f, int level);

  BucketPredictorConfig cfg_;
  std::unordered_map<uint64_t, Bucket> buckets_;
  uint64_t n_observed_ = 0;
};

// Rank correlation of two equally long series (average ranks for ties); 0 when fewer than
// two points or when either series is constant.
double spearman_rank_correlation(std::span<const double> x, std::span<const double> y);

// Accuracy of predictions made at admission, over a sliding window of finished requests.
class PredictionAccuracy {
 public:
  explicit PredictionAccuracy(int window = 512);
  void add(double predicted, double actual);

  struct Snapshot {
    int n = 0;                 // pairs in the window
    double spearman = 0.0;     // rank correlation of predicted vs actual
    double within_100 = 0.0;   // fraction with |predicted - actual| <= 100 tokens
    double mean_abs_error = 0.0;
  };
  Snapshot snapshot() const;

 private:
  size_t window_;
  std::vector<double> predicted_, actual_;  // ring buffers
  size_t next_ = 0;
};

}  // namespace metro::sched
