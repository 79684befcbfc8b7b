// Which part of a model one process (or one rank) holds: a range of layers (pipeline
// parallelism) and a tensor-parallel slice of each of them; or, for a self-drafting copy of
// a model, the model with some layers left out (the residual stream passes them unchanged).
//
// Tensor parallelism slices a layer the Megatron way: rank r of n holds a contiguous range
// of the KV heads and the query heads of their groups (the rows of Q, K and V, the columns
// of the attention output projection), and a range of the FFN's hidden columns (the rows of
// gate and up, the columns of down). The attention output and down projections then give
// each rank a partial sum over its columns, which the ranks add up (an all-reduce) before
// the residual add. Embedding, norms and the head are replicated.
#pragma once

#include <vector>

#include "base/status.h"
#include "model/hparams.h"

namespace metro::model {

struct Shard {
  int layer_begin = 0;
  int layer_end = -1;  // one past the last layer held; -1: through the model's last
  int tp_rank = 0;     // rank in the tensor-parallel group, in [0, tp_size)
  int tp_size = 1;
  // Layers inside the range that are not run at all (not held, no KV): a cheaper, less
  // exact model (self-drafting). At least one layer must remain.
  std::vector<int> skip;
};

// A shard resolved against a model: what its weights and its KV arena hold.
struct ShardGeometry {
  int layer_begin = 0, layer_end = 0;  // layers [layer_begin, layer_end) of the model
  bool ends_model = true;              // holds the model's last layer (and the head)
  int tp_rank = 0, tp_size = 1;
  int kv_head_begin = 0, kv_head_end = 0;  // its KV heads
  int head_begin = 0, head_end = 0;        // its query heads: the groups of its KV heads
  int ff_begin = 0, ff_end = 0;            // its FFN hidden columns
  std::vector<int> skip;                   // layers of the range not run, ascending

  bool starts_model() const { return layer_begin == 0; }
  bool sliced() const { return tp_size > 1; }
  // Layers run (and KV arena layers): the range less the skipped ones.
  int n_layer() const { return layer_end - layer_begin - static_cast<int>(skip.size()); }
  // The model's layer ids run, in order.
  std::vector<int> layers() const;
  int n_head() const { return head_end - head_begin; }
  int n_head_kv() const { return kv_head_end - kv_head_begin; }
  int n_ff() const { return ff_end - ff_begin; }

  // KV heads are dealt out as evenly as they go (the first ranks get fewer when they do
  // not divide), FFN columns likewise in units of `ff_align` columns (the block size the
  // down projection's columns are quantized in, so a slice is whole blocks). Errors name
  // what does not fit: a layer range outside the model, more ranks than KV heads or than
  // FFN units.
  static Expected<ShardGeometry> resolve(const Shard& shard, const HParams& hp, int ff_align);
};

}  // namespace metro::model
