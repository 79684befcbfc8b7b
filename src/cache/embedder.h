// Text -> one normalized vector, on an encoder model's engine: what the semantic cache keys
// its entries by (`metro serve --cache-embed-model FILE`).
#pragma once

#include <chrono>
#include <memory>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace metro::cache {

// The ids an embedding of `text` is computed over: the tokenizer's, special tokens added;
// longer than `n_ctx`, cut to it with the closing token ([SEP]) kept.
std::vector<int32_t> embedding_input(const tokenizer::Tokenizer& tok, std::string_view text, int n_ctx);

class Embedder {
 public:
  // The engine of an encoder model (hparams().encoder): it pools and normalizes.
  explicit Embedder(std::shared_ptr<engine::Engine> engine);
  int dim() const { return dim_; }
  const engine::Engine& engine() const { return *engine_; }
  // The embedding of `text`; a text longer than the model's context is cut to it (the
  // encoder's closing token kept). Blocks the calling thread until the engine answers.
  Expected<std::vector<float>> embed(std::string_view text,
                                     std::chrono::milliseconds timeout = std::chrono::seconds(30)) const;

 private:
  std::shared_ptr<engine::Engine> engine_;
  int dim_ = 0;
};

}  // namespace metro::cache
