// A llama-family model: hyperparameters, bound weights, and the forward pass of a flat
// token batch over paged KV memory.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/aligned.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "gguf/gguf.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/hparams.h"
#include "model/kv_view.h"
#include "model/weights.h"

namespace metro::model {

struct ModelOptions {
  bool allow_repack = true;  // let kernels build interleaved weight copies at load
};

// Upper bounds a Workspace is sized for; forward() refuses steps beyond them.
struct WorkspaceLimits {
  int max_tokens = 512;           // tokens per step
  int max_logits = 64;            // tokens per step that want logits
  int max_seqs = 64;              // sequences per step
  int max_blocks_per_seq = 512;   // block-table length per sequence
};

// All per-step scratch, allocated once for the largest step (nothing allocates in forward).
class Workspace {
 public:
  Workspace() = default;
  const WorkspaceLimits& limits() const { return limits_; }
  size_t bytes() const { return bytes_; }

 private:
  friend class Model;
  WorkspaceLimits limits_;
  size_t bytes_ = 0;
  AlignedBuffer<float> x, xb, q, k, v, att, tmp, gate, up;  // [max_tokens][...]
  AlignedBuffer<float> xl;      // [max_logits][n_embd] rows gathered for the head
  AlignedBuffer<float> logits;  // [max_logits][n_vocab]
  AlignedBuffer<float> hidden;  // [max_tokens][n_embd] final normed states, on request
  AlignedBuffer<float> rope_cs;  // [max_tokens][n_rot]: cos then sin of each token's angles
  AlignedBuffer<uint8_t> qa0, qa1;  // quantized activations
  // One work counter per matmul of a step, in call order (kernels::matmul's `next`); zeroed
  // before each step's pool run.
  struct alignas(64) MatmulCounter {  // a line each: q, k and v run back to back, unfenced
    std::atomic<int64_t> next{0};
  };
  std::unique_ptr<MatmulCounter[]> matmul_next;
  size_t n_matmul_next = 0;
  std::vector<const uint8_t*> k_pages, v_pages;  // one layer's page pointers of every run
  std::vector<kernels::AttentionSeq> attn_seqs;  // one per run
  struct Run {
    int seq, start, n;
    int64_t pos0;
  };
  std::vector<Run> runs;
  std::vector<int> logit_rows;  // batch index of each logits row
};

struct ForwardOptions {
  bool want_hidden = false;  // also return every token's final normed hidden state
};

// Rows of logits (and optionally hidden states) of one step; views into the Workspace,
// valid until the next forward with it.
struct ForwardOutput {
  const float* logits = nullptr;  // [n_rows][n_vocab]
  int n_rows = 0;
  int n_vocab = 0;
  std::span<const int> batch_index;  // row r holds the logits of batch token batch_index[r]
  const float* hidden = nullptr;     // [batch size][n_embd] when requested
  // Wall time of the attention phases (every layer's, barrier to barrier, as the calling
  // thread saw it): what the step cost fit prices by (query, key) pairs apart from the rest.
  double attention_s = 0.0;

  std::span<const float> row(int r) const {
    return {logits + static_cast<size_t>(r) * static_cast<size_t>(n_vocab),
            static_cast<size_t>(n_vocab)};
  }
};

class Model {
 public:
  static Expected<std::unique_ptr<Model>> load(const std::string& path,
                                               const ModelOptions& opts = {});
  // Takes ownership of an already parsed file.
  static Expected<std::unique_ptr<Model>> from_file(gguf::File file,
                                                    const ModelOptions& opts = {});

  const HParams& hparams() const { return hp_; }
  const gguf::File& file() const { return file_; }
  const ModelWeights& weights() const { return w_; }

  Workspace make_workspace(const WorkspaceLimits& limits) const;

  // Runs one step. The KV view must hold blocks for every position in the batch; this call
  // writes the batch's K/V into them. Errors (bad batch, limits exceeded) leave KV as it was.
  Expected<ForwardOutput> forward(const Batch& batch, const KvView& kv, Workspace& ws,
                                  ThreadPool& pool, const ForwardOptions& opts = {}) const;

 private:
  Model(gguf::File file, HParams hp, ModelWeights w);
  Status plan(const Batch& batch, const KvView& kv, Workspace& ws) const;

  gguf::File file_;
  HParams hp_;
  ModelWeights w_;
  std::unique_ptr<kernels::Rope> rope_;
};

// A single sequence's private KV memory: the simplest KvView owner, for `metro run`,
// perplexity and tests. (The engine uses the kv layer's shared block pool instead.)
class SequenceKv {
 public:
  SequenceKv(const HParams& hp, int n_ctx, kernels::DType type = kernels::DType::kF16,
             int block_size = 16);
  const KvView& view() const { return view_; }
  int capacity() const { return capacity_; }

 private:
  AlignedBuffer<uint8_t> arena_;
  std::vector<int32_t> table_;
  KvView view_;
  int capacity_ = 0;
};

}  // namespace metro::model
