// A llama-family model: hyperparameters, weights bound onto a backend, and the forward pass
// of a flat token batch over paged KV memory. The model describes each step as a sequence
// of ops (backends/ops.h) that its backend executes; a model may hold only a shard of the
// layers and of each layer's heads (model/shard.h).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "backends/backend.h"
#include "base/cold_store.h"
#include "base/file_watch.h"
#include "base/status.h"
#include "base/thread_pool.h"
#include "dist/communicator.h"
#include "gguf/gguf.h"
#include "kernels/attention.h"
#include "kernels/ops.h"
#include "model/batch.h"
#include "model/hparams.h"
#include "model/kv_view.h"
#include "model/lora.h"
#include "model/shard.h"
#include "model/weights.h"

namespace metro::model {

// A cap on the weights a model keeps resident (`metro serve --mem-budget`): the matrices
// every step reads stay in memory of the process's own; the experts of a mixture-of-experts
// model and the token embedding table (in 64 KiB pieces of rows) go to a cold store
// (base/cold_store.h) that keeps at most the rest of the budget mapped in, the least
// recently read given back first.
struct MemBudget {
  uint64_t bytes = 0;  // 0: no cap
  ColdStore::Options store;
};

struct ModelOptions {
  bool allow_repack = true;  // let the backend build interleaved weight copies at load
  Shard shard;               // default: the whole model
  // Null: the default backend (the CPU with the widest kernels it runs).
  std::shared_ptr<backends::Backend> backend;
  // The tensor-parallel group of a sliced shard (rank shard.tp_rank of shard.tp_size);
  // unused when tp_size is 1.
  std::shared_ptr<dist::Communicator> comm;
  // How load() reads the file into memory (chunk size, progress).
  MappedFile::ReadOptions read;
  // load() only: poll the file this often once loaded (zero: never). A change on disk
  // (truncated, rewritten, replaced, removed) is logged once; the model keeps serving the
  // copy it loaded, which the change cannot reach.
  std::chrono::milliseconds watch_period{0};
  // load() only: LoRA adapters added into the weights as the file is read (model/lora.h).
  std::vector<LoraSpec> lora;
  // LoRA adapters kept apart and applied per token at run time: adapters[i] is adapter
  // i + 1 of Batch::adapter (model/lora.h). Dense attention and FFN matrices and a separate
  // output head only; the CPU backend only; not on a tensor-parallel shard.
  std::vector<LoraSpec> adapters;
  // A cap on resident weights (MemBudget); the CPU backend only, not with `lora`. A model
  // whose weights outside its cold ones exceed it is refused. load() maps the experts' bytes
  // from the file instead of reading them, so that loading stays within the cap too.
  MemBudget mem_budget;
};

// Upper bounds a Workspace is sized for; forward() refuses steps beyond them.
struct WorkspaceLimits {
  int max_tokens = 512;           // tokens per step
  int max_logits = 64;            // tokens per step that want logits
  int max_seqs = 64;              // sequences per step
  int max_blocks_per_seq = 512;   // block-table length per sequence
  // The context per sequence these steps serve (0: the model's trained one). A model with
  // LongRoPE rotates by its long factors when it exceeds the original context.
  int n_ctx = 0;
};

// All per-step scratch, allocated once for the largest step (nothing allocates in forward):
// the backend's state and the host-side description of the step.
class Workspace {
 public:
  Workspace() = default;
  const WorkspaceLimits& limits() const { return limits_; }
  size_t bytes() const { return state_ ? state_->bytes() : 0; }

 private:
  friend class Model;
  WorkspaceLimits limits_;
  std::unique_ptr<backends::ExecState> state_;
  std::vector<backends::Op> ops;         // the step's op sequence, rebuilt in place
  std::vector<backends::SeqRun> runs;    // one per sequence of the step
  std::vector<int> logit_rows;           // batch index of each logits row
};

struct ForwardOptions {
  bool want_hidden = false;  // also return every token's final normed hidden state
  // Sees the execution of each op (e.g. a backends::StepProfile); null costs nothing.
  backends::StepObserver* observer = nullptr;
};

// Rows of logits (and optionally hidden states) of one step; views into the Workspace,
// valid until the next forward with it.
struct ForwardOutput {
  const float* logits = nullptr;  // [n_rows][n_vocab]; a shard that ends the model only
  int n_rows = 0;
  int n_vocab = 0;
  std::span<const int> batch_index;  // row r holds the logits of batch token batch_index[r]
  const float* hidden = nullptr;     // [batch size][n_embd] when requested (last shard)
  // [batch size][n_embd]: the residual stream after the shard's last layer, for the next
  // shard's forward; null for a shard that ends the model.
  const float* residual = nullptr;

  // Two passes joined into one step's output (the engine's precision tiers): rows from
  // tail_row on are in `tail_logits`, tokens from tail_token on in `tail_hidden`.
  const float* tail_logits = nullptr;
  int tail_row = 0;
  const float* tail_hidden = nullptr;
  int tail_token = 0;

  std::span<const float> row(int r) const {
    const float* base = logits;
    if (tail_logits != nullptr && r >= tail_row) {
      base = tail_logits;
      r -= tail_row;
    }
    return {base + static_cast<size_t>(r) * static_cast<size_t>(n_vocab), static_cast<size_t>(n_vocab)};
  }
  // Token t's final normed hidden state (want_hidden), n_embd floats.
  const float* hidden_row(int t, int n_embd) const {
    const float* base = hidden;
    if (tail_hidden != nullptr && t >= tail_token) {
      base = tail_hidden;
      t -= tail_token;
    }
    return base + static_cast<size_t>(t) * static_cast<size_t>(n_embd);
  }
};

class Model {
 public:
  // Reads the whole file into memory the model owns before parsing it (gguf::File::load):
  // weights a backend keeps reading in place, the vocabulary and the metadata all live in
  // that copy, so truncating or rewriting the file while the model serves can neither fault
  // (SIGBUS) nor change what is served. A file that changes while it is read is refused.
  static Expected<std::unique_ptr<Model>> load(const std::string& path,
                                               const ModelOptions& opts = {});
  // Takes ownership of an already parsed file. A file from gguf::File::open stays a map of
  // the file on disk and so stays exposed to changes to it.
  static Expected<std::unique_ptr<Model>> from_file(gguf::File file,
                                                    const ModelOptions& opts = {});

  const HParams& hparams() const { return hp_; }  // of the whole model
  // The longest context this model runs with on its backend: the trained one, or the
  // sliding window on a backend without windowed attention (within the window, full
  // attention is exact).
  uint32_t max_context() const;
  // The attention window every layer of this shard has on its backend (0: some layer reads
  // every position, or the backend has no windowed attention): KV blocks before a
  // sequence's last `window` positions are never read again (kv::KvCacheConfig::window).
  uint32_t kv_release_window() const { return release_window_; }
  const gguf::File& file() const { return file_; }
  const ModelWeights& weights() const { return w_; }
  const ShardGeometry& shard() const { return w_.shard; }
  const std::shared_ptr<backends::Backend>& backend() const { return backend_; }
  // Whether the watch (ModelOptions::watch_period) has seen the file change on disk.
  bool file_changed_on_disk() const { return watch_ && watch_->changed(); }
  // Gives back the memory of the file copy's tensor bytes that no weight reads any more
  // (matrices the backend copied into layouts of its own, vectors it copied): on the CPU
  // backend with x8-repacked matrices, most of the file. Only when the model owns its copy
  // (load) and its backend names every byte it reads; afterwards nothing may bind weights
  // from file() again (file_given_back() says so). Returns the bytes given back.
  uint64_t give_back_unread_file_bytes() const;
  uint64_t file_given_back() const { return given_back_.load(std::memory_order_relaxed); }
  // The merged host ranges the weights read (products, head, embedding table); empty on a
  // device backend.
  // Cold matrices (experts behind a MemBudget) are not among them.
  std::vector<std::span<const uint8_t>> weight_memory() const;
  // The store of the weights kept cold (ModelOptions::mem_budget); null when none are.
  const ColdStore* cold_store() const { return cold_.get(); }
  uint64_t mem_budget() const { return mem_budget_; }
  // Locks weight_memory() in RAM (`metro serve --mlock`); returns the bytes locked.
  Expected<uint64_t> lock_weights() const;
  uint64_t weights_locked() const { return locked_.load(std::memory_order_relaxed); }
  // The KV page layout of this shard's arena (its KV heads), with kv_layers() layers.
  kernels::KvPageLayout kv_layout(kernels::DType type, int block_size) const;
  // An encoder keeps nothing in KV memory: 0.
  int kv_layers() const { return hp_.encoder ? 0 : shard().n_layer(); }

  Workspace make_workspace(const WorkspaceLimits& limits) const;
  // Run-time LoRA adapters loaded (ModelOptions::adapters).
  int n_adapters() const { return n_adapters_; }

  // Runs one step. The KV view must hold blocks for every position in the batch (in this
  // shard's layout); this call writes the batch's K/V into them. Errors (bad batch, limits
  // exceeded) leave KV as it was. A shard that does not start the model cannot run this.
  Expected<ForwardOutput> forward(const Batch& batch, const KvView& kv, Workspace& ws,
                                  ThreadPool& pool, const ForwardOptions& opts = {}) const;
  // The same for a shard of any layer range: one that starts the model embeds the batch's
  // tokens and takes an empty residual_in; a later one starts from residual_in
  // ([batch size][n_embd], the previous shard's ForwardOutput::residual).
  Expected<ForwardOutput> forward(const Batch& batch, std::span<const float> residual_in,
                                  const KvView& kv, Workspace& ws, ThreadPool& pool,
                                  const ForwardOptions& opts = {}) const;

 private:
  Model(gguf::File file, HParams hp, ModelWeights w, std::shared_ptr<backends::Backend> backend,
        std::shared_ptr<dist::Communicator> comm);
  Status plan(const Batch& batch, const KvView& kv, Workspace& ws) const;
  void build_ops(bool want_hidden, int n_logits, int n_ctx, bool lora, std::vector<backends::Op>& ops) const;
  Status load_adapters(const std::vector<LoraSpec>& adapters);
  void build_encoder_ops(bool want_hidden, std::vector<backends::Op>& ops) const;

  gguf::File file_;
  HParams hp_;
  ModelWeights w_;
  std::shared_ptr<backends::Backend> backend_;
  std::shared_ptr<dist::Communicator> comm_;
  std::unique_ptr<kernels::Rope> rope_;
  std::unique_ptr<kernels::Rope> rope_local_;  // the sliding-window layers' rotation; null when alike
  std::unique_ptr<kernels::Rope> rope_long_;   // LongRoPE's long factors; null without them
  uint32_t release_window_ = 0;  // kv_release_window(), from uniform_window() at construction
  uint32_t uniform_window() const;
  std::unique_ptr<FileWatch> watch_;  // null unless asked for
  // Run-time LoRA: the factors, and the set of each adapted base matrix.
  int n_adapters_ = 0;
  int lora_max_rank_ = 0;
  bool lora_head_ = false;  // some adapter adapts the output head
  std::deque<std::vector<float>> lora_host_;  // the factors' values, which a backend may read in place
  std::vector<std::unique_ptr<backends::DeviceMatrix>> lora_factors_;
  std::unordered_map<const backends::DeviceMatrix*, std::unique_ptr<backends::LoraSet>> lora_sets_;
  const backends::LoraSet* lora_set(const backends::DeviceMatrix* w) const;
  mutable std::atomic<uint64_t> given_back_{0};
  mutable std::atomic<uint64_t> locked_{0};
  std::shared_ptr<ColdStore> cold_;
  uint64_t mem_budget_ = 0;
  Status apply_budget(const MemBudget& budget);
};

// A single sequence's private KV memory: the simplest KvView owner, for `metro run`,
// perplexity and tests. (The engine uses the kv layer's shared block pool instead.)
class SequenceKv {
 public:
  // The whole model's layers and KV heads, in host memory.
  SequenceKv(const HParams& hp, int n_ctx, kernels::DType type = kernels::DType::kF16,
             int block_size = 16);
  // A model's shard, in its backend's memory.
  SequenceKv(const Model& m, int n_ctx, kernels::DType type = kernels::DType::kF16,
             int block_size = 16);
  const KvView& view() const { return view_; }
  int capacity() const { return capacity_; }

 private:
  SequenceKv(backends::Backend& backend, const kernels::KvPageLayout& layout, int n_layer, int n_ctx);

  std::unique_ptr<backends::DeviceBuffer> arena_;
  std::vector<int32_t> table_;
  KvView view_;
  int capacity_ = 0;
};

}  // namespace metro::model
