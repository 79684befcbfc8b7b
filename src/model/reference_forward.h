// A plain, slow, double-precision forward pass of a llama-family model over one sequence:
// the definition the fast forward pass is tested against. Weights are dequantized by the
// scalar references; attention is a dense causal softmax. For small models only.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace metro::model {

// Sees the input of every matrix-vector product: the weight tensor's name and the vector it
// multiplies (one call per token and matrix).
using MatvecObserver = std::function<void(const std::string& tensor, const std::vector<double>& x)>;

// Logits of every position of `tokens` ([n_tokens][n_vocab]), for a context per sequence of
// n_ctx tokens (0: the trained one), which picks LongRoPE's factors as WorkspaceLimits::n_ctx.
Expected<std::vector<std::vector<float>>> reference_forward(const gguf::File& file,
                                                            std::span<const int32_t> tokens,
                                                            const MatvecObserver& observer = {}, int n_ctx = 0);

}  // namespace metro::model
