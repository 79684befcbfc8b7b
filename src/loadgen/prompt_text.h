// Prompt text of a chosen length in tokens, built in-process from a word list.
//
// Each word is one token (with its leading space) in the tokenizers metro and its peers
// serve, so N words make about N prompt tokens: exactly N with SmolLM2's GPT-2-style BPE.
// The server adds its own tokens around them (BOS, a chat template's role markers and
// default system prompt); the report shows the prompt tokens the server counted.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "loadgen/rng.h"

namespace metro::loadgen {

std::span<const std::string_view> prompt_words();

// n_words words drawn uniformly from the list, separated by single spaces.
std::string random_words(int64_t n_words, Rng& rng);

}  // namespace metro::loadgen
