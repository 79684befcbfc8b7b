// Weights of a llama-family model bound from GGUF tensors, every shape and dtype checked
// at load with the tensor's name in the error.
//
// GGUF stores a linear layer's weight with ne[0] = input features (contiguous) and
// ne[1] = output features, i.e. row-major [out][in]: exactly kernels::Weight's layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "kernels/dtype.h"
#include "kernels/matmul.h"
#include "model/hparams.h"

namespace metro::model {

struct LayerWeights {
  std::vector<float> attn_norm;           // [n_embd]
  kernels::Weight wq;                     // [n_head * head_dim][n_embd]
  kernels::Weight wk;                     // [n_head_kv * head_dim][n_embd]
  kernels::Weight wv;                     // [n_head_kv * head_dim][n_embd]
  kernels::Weight wo;                     // [n_embd][n_head * head_dim]
  std::vector<float> bq, bk, bv;          // biases (qwen2); empty when absent
  std::vector<float> ffn_norm;            // [n_embd]
  kernels::Weight w_gate;                 // [n_ff][n_embd]
  kernels::Weight w_up;                   // [n_ff][n_embd]
  kernels::Weight w_down;                 // [n_embd][n_ff]
};

struct ModelWeights {
  kernels::DType embd_type = kernels::DType::kF32;
  const uint8_t* token_embd = nullptr;    // [n_vocab][n_embd] rows in embd_type
  size_t token_embd_row_bytes = 0;
  std::vector<float> output_norm;         // [n_embd]
  kernels::Weight output;                 // [n_vocab][n_embd] (the embedding when tied)
  std::vector<float> rope_freqs;          // [n_rot / 2] llama3 factors; empty when absent
  std::vector<LayerWeights> layers;

  static Expected<ModelWeights> bind(const gguf::File& file, const HParams& hp,
                                     bool allow_repack);

  // Every distinct weight type used by matrix products (sizes activation buffers).
  std::vector<kernels::DType> matmul_types() const;
  // Bytes of weights a single decode token reads (every matrix once + its embedding row).
  uint64_t bytes_per_token() const;
  // e.g. "Q4_1 x8 interleaved (210), Q8_0 row-major (1)".
  std::string describe_layouts() const;
};

}  // namespace metro::model
