// Running requests through a real Engine in tests.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace metro::testing {

struct Generation {
  std::vector<int32_t> tokens;
  std::string text;
  engine::FinishReason reason = engine::FinishReason::kError;
  engine::Usage usage;
  std::vector<float> embedding;
};

// Waits for every event of a handle; fails the test on a 120 s stall.
Generation collect(const engine::Handle& h);
// Per choice, for n > 1.
std::vector<Generation> collect_choices(const engine::Handle& h, int n);

// The default model and its tokenizer, loaded once per test binary.
struct SharedModel {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
};
const SharedModel& default_model();

engine::Request greedy_request(std::vector<int32_t> prompt, int max_tokens);

// True under `make test-asan` (tests shrink their workloads there).
bool sanitized();

}  // namespace metro::testing
