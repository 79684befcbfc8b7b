// `metro bench --spec`: single-sequence decode speed with speculative decoding off and on.
#pragma once

#include <string>
#include <vector>

#include "cli/common.h"

namespace metro::cli {

struct SpecBenchOptions {
  std::vector<std::string> files;  // one prompt per file; FILE.prediction beside it is its prediction
  bool chat = false;               // the text is a user message of the model's chat template
  int n_gen = 256;
  int threads = 2;
  int reps = 1;
  bool json = false;
  SpecFlags spec;
};

// The prompt as the model's chat template renders one user message (with BOS as the model wants).
Expected<std::vector<int32_t>> chat_prompt_ids(const LoadedModel& lm, const std::string& user_text);

int bench_speculation(const LoadedModel& lm, const SpecBenchOptions& options);

}  // namespace metro::cli
