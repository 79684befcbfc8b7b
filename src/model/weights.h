// Weights of a llama-family model bound from GGUF tensors onto a backend, every shape and
// dtype checked at load with the tensor's name in the error. A shard binds only its layers
// and its tensor-parallel slice of each (model/shard.h).
//
// GGUF stores a linear layer's weight with ne[0] = input features (contiguous) and
// ne[1] = output features, i.e. row-major [out][in]: a backends::HostMatrix as it is.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/ops.h"
#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/dtype.h"
#include "model/hparams.h"
#include "model/shard.h"

namespace metro::model {

// Shapes with n_q = shard's n_head * head_dim, n_kv = shard's n_head_kv * head_dim and
// n_ff = shard's FFN columns (the whole model's when it is not sliced).
struct LayerWeights {
  int model_layer = 0;  // the layer's index in the whole model
  std::unique_ptr<backends::DeviceVector> attn_norm;  // [n_embd]
  std::unique_ptr<backends::DeviceMatrix> wq;         // [n_q][n_embd]: its query heads' rows
  std::unique_ptr<backends::DeviceMatrix> wk;         // [n_kv][n_embd]
  std::unique_ptr<backends::DeviceMatrix> wv;         // [n_kv][n_embd]
  std::unique_ptr<backends::DeviceMatrix> wo;         // [n_embd][n_q]: its heads' columns
  std::unique_ptr<backends::DeviceVector> bq, bk, bv;  // biases (qwen2); null when absent
  std::unique_ptr<backends::DeviceVector> q_norm, k_norm;  // [head_dim] per-head norms (qwen3); null when absent
  std::unique_ptr<backends::DeviceVector> ffn_norm;   // [n_embd]
  std::unique_ptr<backends::DeviceVector> post_attn_norm, post_ffn_norm;  // [n_embd] (gemma3); null when absent
  std::unique_ptr<backends::DeviceMatrix> w_gate;     // [n_ff][n_embd]
  std::unique_ptr<backends::DeviceMatrix> w_up;       // [n_ff][n_embd]
  std::unique_ptr<backends::DeviceMatrix> w_down;     // [n_embd][n_ff]
  // Encoders: the biases of the output, up and down products (each null where the file has
  // none), and the layer norms (weight, bias) after attention and after the FFN. w_gate
  // only for a SiLU-gated encoder FFN (nomic-bert).
  std::unique_ptr<backends::DeviceVector> bo, b_up, b_down;
  std::unique_ptr<backends::DeviceVector> attn_out_norm, attn_out_norm_b, out_norm, out_norm_b;
  // Mixture of experts: the router [n_expert][n_embd], each expert's gate, up [n_ff][n_embd]
  // and down [n_embd][n_ff] (n_ff: the shard's columns of n_ff_exp), and `experts` pointing
  // at them for the op. w_gate, w_up and w_down then hold the shared expert (null without
  // one), shexp_gate its gate vector [n_embd] (null without one).
  std::unique_ptr<backends::DeviceMatrix> router;
  std::vector<std::unique_ptr<backends::DeviceMatrix>> exp_gate, exp_up, exp_down;
  backends::ExpertSet experts;
  std::unique_ptr<backends::DeviceVector> shexp_gate;

  // The product matrices present, in a fixed order (the experts' last, expert by expert).
  std::vector<const backends::DeviceMatrix*> matrices() const;
};

struct ModelWeights {
  ShardGeometry shard;
  std::unique_ptr<backends::DeviceMatrix> token_embd;   // [n_vocab][n_embd] rows; first shard only
  std::unique_ptr<backends::DeviceVector> output_norm;  // [n_embd]; last shard only
  std::unique_ptr<backends::DeviceMatrix> output;       // [n_vocab][n_embd]; last shard only
  std::vector<float> rope_freqs;    // [n_rot / 2] llama3 factors; empty when absent
  std::vector<float> rope_short;    // [n_rot / 2] LongRoPE factors (HParams::has_longrope)
  std::vector<float> rope_long;
  // Encoders: position embeddings plus the token-type-0 row, F32 [n_ctx_train][n_embd]
  // (pos_rows holds the values pos_embd was made from), and the embeddings' layer norm.
  std::vector<float> pos_rows;
  std::unique_ptr<backends::DeviceMatrix> pos_embd;  // null for an encoder that rotates (nomic-bert)
  std::unique_ptr<backends::DeviceVector> type0;     // token type 0 of such an encoder; null when absent
  std::unique_ptr<backends::DeviceVector> embd_norm, embd_norm_b;
  std::vector<LayerWeights> layers;  // the shard's, layers[0] being layer shard.layer_begin

  // `allow_repack` lets the backend copy product matrices into the layouts its kernels
  // prefer; otherwise it may keep reading the file's bytes in place (the copy Model::load
  // owns, or whatever bytes the gguf::File was parsed from). `cold`: a store the backend
  // may keep the experts' matrices and the token embedding table in
  // (backends::HostMatrix::cold).
  static Expected<ModelWeights> bind(const gguf::File& file, const HParams& hp, const Shard& shard,
                                     backends::Backend& backend, bool allow_repack,
                                     std::shared_ptr<ColdStore> cold = nullptr);
  // An encoder's (HParams::encoder) weights; bind() calls it for one.
  static Expected<ModelWeights> bind_encoder(const gguf::File& file, const HParams& hp, const Shard& shard,
                                             backends::Backend& backend, bool allow_repack);
  // The whole model on the default backend (what `metro serve` would load).
  static Expected<ModelWeights> bind(const gguf::File& file, const HParams& hp, bool allow_repack);

  // Every matrix used in products (the head included), in a fixed order.
  std::vector<const backends::DeviceMatrix*> product_matrices() const;
  // Every distinct weight type used by matrix products (sizes activation buffers).
  std::vector<kernels::DType> matmul_types() const;
  // Bytes of weights a single decode token reads (every matrix once + its embedding row;
  // of the experts, the n_used it is routed to).
  uint64_t bytes_per_token() const;
  // Multiply-adds of the matrix products one token passes through (its n_used experts'),
  // with or without the head's (a prompt token whose logits nobody reads skips the head).
  uint64_t product_macs(bool with_head) const;
  int n_expert_used = 0;  // experts per token (0: dense)
  // e.g. "Q4_1 x8 interleaved (210), Q8_0 row-major (1)".
  std::string describe_layouts() const;
};

}  // namespace metro::model
