#include "model/shard.h"

#include <algorithm>
#include <string>

namespace metro::model {

namespace {

// Part r of n of [0, total): [total * r / n, total * (r + 1) / n).
int part_begin(int total, int r, int n) {
  return static_cast<int>(static_cast<int64_t>(total) * r / n);
}

}  // namespace

Expected<ShardGeometry> ShardGeometry::resolve(const Shard& s, const HParams& hp, int ff_align) {
  const int n_layer = static_cast<int>(hp.n_layer);
  ShardGeometry g;
  g.layer_begin = s.layer_begin;
  g.layer_end = s.layer_end < 0 ? n_layer : s.layer_end;
  if (g.layer_begin < 0 || g.layer_begin >= g.layer_end || g.layer_end > n_layer) {
    return invalid_argument("shard layers [" + std::to_string(g.layer_begin) + ", " +
                            std::to_string(g.layer_end) + ") are not a non-empty range of the model's " +
                            std::to_string(n_layer) + " layers");
  }
  g.ends_model = g.layer_end == n_layer;
  g.skip = s.skip;
  std::sort(g.skip.begin(), g.skip.end());
  g.skip.erase(std::unique(g.skip.begin(), g.skip.end()), g.skip.end());
  for (int l : g.skip) {
    if (l < g.layer_begin || l >= g.layer_end) {
      return invalid_argument("skipped layer " + std::to_string(l) + " is outside the shard's layers [" +
                              std::to_string(g.layer_begin) + ", " + std::to_string(g.layer_end) + ")");
    }
  }
  if (g.n_layer() < 1) return invalid_argument("a shard cannot skip every one of its layers");
  if (s.tp_size < 1 || s.tp_rank < 0 || s.tp_rank >= s.tp_size) {
    return invalid_argument("tensor-parallel rank " + std::to_string(s.tp_rank) + " of " +
                            std::to_string(s.tp_size) + " is not a rank of the group");
  }
  g.tp_rank = s.tp_rank;
  g.tp_size = s.tp_size;
  const int n_kv = static_cast<int>(hp.n_head_kv);
  if (s.tp_size > n_kv) {
    return invalid_argument(std::to_string(s.tp_size) + " tensor-parallel ranks need at least as many KV heads; the model has " +
                            std::to_string(n_kv));
  }
  const int group = static_cast<int>(hp.n_gqa());
  g.kv_head_begin = part_begin(n_kv, s.tp_rank, s.tp_size);
  g.kv_head_end = part_begin(n_kv, s.tp_rank + 1, s.tp_size);
  g.head_begin = g.kv_head_begin * group;
  g.head_end = g.kv_head_end * group;
  const int n_ff = static_cast<int>(hp.ffn_width());
  if (ff_align < 1 || n_ff % ff_align != 0) {
    return invalid_argument("the FFN width " + std::to_string(n_ff) + " is not a whole number of blocks of " +
                            std::to_string(ff_align));
  }
  const int units = n_ff / ff_align;
  if (s.tp_size > units) {
    return invalid_argument(std::to_string(s.tp_size) + " tensor-parallel ranks need at least as many FFN blocks of " +
                            std::to_string(ff_align) + " columns; the model has " + std::to_string(units));
  }
  g.ff_begin = part_begin(units, s.tp_rank, s.tp_size) * ff_align;
  g.ff_end = part_begin(units, s.tp_rank + 1, s.tp_size) * ff_align;
  return g;
}

std::vector<int> ShardGeometry::layers() const {
  std::vector<int> out;
  out.reserve(static_cast<size_t>(std::max(0, n_layer())));
  size_t k = 0;
  for (int l = layer_begin; l < layer_end; ++l) {
    if (k < skip.size() && skip[k] == l) {
      ++k;
      continue;
    }
    out.push_back(l);
  }
  return out;
}

}  // namespace metro::model
