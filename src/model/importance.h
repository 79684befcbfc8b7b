// Importance of each weight column from activations on a calibration text (what llama.cpp
// calls an importance matrix): for every matrix, the mean square over the text's tokens of
// each element of the vectors the matrix multiplies. Quantizing a row to minimize
// sum_i importance[i] * (w[i] - q[i])^2 minimizes the expected squared error of its dot
// products with such vectors (cross terms aside), which is what the model's output sees.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"

namespace metro::model {

struct Importance {
  std::map<std::string, std::vector<float>> by_tensor;  // tensor name -> one weight per column
  int tokens = 0;                                        // tokens the means are over

  // The weights of `tensor` (null when it has none), floored at a small fraction of their
  // mean so that no column is free to take any error.
  const std::vector<float>* find(const std::string& tensor) const;
};

// Runs the double-precision reference forward pass over `tokens` in windows of `window`
// tokens (each window from position 0) and averages the squares of every matrix's inputs.
// on_window(done, total) after each window.
Expected<Importance> compute_importance(const gguf::File& file, std::span<const int32_t> tokens, int window,
                                        const std::function<void(int, int)>& on_window = {});

}  // namespace metro::model
