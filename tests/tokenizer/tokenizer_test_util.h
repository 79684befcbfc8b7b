// Helpers for tokenizer tests: synthetic vocabularies written as GGUF, SmolLM2's vocabulary
// under other pre-tokenizers, random text, readable escapes for failure messages.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace metro::testing {

// The metadata of a vocabulary-only GGUF file.
struct VocabSpec {
  std::string model = "gpt2";
  std::optional<std::string> pre = "gpt-2";
  std::vector<std::string> tokens;
  std::vector<int32_t> types;   // omitted when empty
  std::vector<float> scores;    // omitted when empty
  std::optional<std::vector<std::string>> merges = std::vector<std::string>{};
  std::vector<std::pair<std::string, int64_t>> ints;  // written as i32 when they fit, else i64
  std::vector<std::pair<std::string, bool>> bools;
  std::vector<std::pair<std::string, std::string>> strings;
};
std::vector<uint8_t> vocab_gguf(const VocabSpec& spec);

// A byte-level BPE spec: the 256 byte characters, then the results of `merges` (pairs of
// plain text, in rank order), then `extra` tokens (plain text, typed control).
VocabSpec byte_level_spec(const std::vector<std::pair<std::string, std::string>>& merges,
                          const std::vector<std::string>& control_tokens = {});
// An SPM spec: <unk> <s> </s>, 256 byte tokens, then `pieces` (text with ▁) scored by order.
VocabSpec spm_spec(const std::vector<std::string>& pieces);

Expected<tokenizer::Tokenizer> tokenizer_from(const std::vector<uint8_t>& gguf_bytes);

// SmolLM2's tokenizer metadata (tokens, types, merges, ids, flags) with another
// tokenizer.ggml.pre value.
std::vector<uint8_t> smollm2_with_pre(const gguf::File& smollm2, std::string_view pre);

// The default model's tokenizer, loaded once per test process.
const tokenizer::Tokenizer& smollm2_tokenizer();
// tests/fixtures/tokenizer/tiny_spm.gguf, loaded once.
const tokenizer::Tokenizer& tiny_spm_tokenizer();

// Printable form of bytes for messages.
std::string escaped(std::string_view s);
std::string ids_string(const std::vector<int32_t>& ids);

// Random valid UTF-8 drawn from scripts and symbols tokenizers find hard: ASCII words and
// punctuation, whitespace of every kind, digits, Latin-1, CJK, Arabic, emoji with ZWJ and
// modifiers, combining marks, control characters.
std::string random_utf8(std::mt19937& rng, size_t max_codepoints);
// Random bytes, biased towards UTF-8 lead and continuation bytes.
std::string random_bytes(std::mt19937& rng, size_t max_len);

}  // namespace metro::testing
