// A plain, slow, double-precision forward pass of a llama-family model over one sequence:
// the definition the fast forward pass is tested against. Weights are dequantized by the
// scalar references; attention is a dense causal softmax. For small models only.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "model/hparams.h"

namespace metro::model {

// Logits of every position of `tokens` ([n_tokens][n_vocab]).
Expected<std::vector<std::vector<float>>> reference_forward(const gguf::File& file,
                                                            std::span<const int32_t> tokens);

}  // namespace metro::model
