// Pre-tokenizers of byte-level BPE vocabularies: the regular expressions that cut text into
// words before merges run, chosen by `tokenizer.ggml.pre`.
//
// A pre-tokenizer is a list of regexes applied in turn: each one cuts every current piece
// into its matches and the text between them (both kept), so a later regex only ever sees
// pieces of an earlier one. The patterns are the models' own (from their tokenizer.json;
// non-ASCII characters written as \x{...} so the source survives Unicode normalization),
// in the spelling llama.cpp uses where its matcher differs from a full Unicode engine, so
// that metro and llama.cpp cut text the same way. They run on PCRE2 with UTF, Unicode
// properties and JIT; invalid UTF-8 never matches and ends up in the pieces between
// matches, so no byte of the input is lost.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro::tokenizer {

struct PreTokenizerSpec {
  std::string_view family;                  // e.g. "llama3", "gpt2", "starcoder"
  std::span<const std::string_view> regexes;
  bool ignore_merges = false;  // a word that is a whole token is emitted as that token
  bool add_bos = false;        // default of add_bos_token when the file does not say
  bool no_bos = false;         // the family has no BOS unless the file names one
};

// The spec for a `tokenizer.ggml.pre` value, or nullptr when metro does not know it.
const PreTokenizerSpec* find_pre_tokenizer(std::string_view pre_name);
bool is_known_pre_tokenizer(std::string_view pre_name);
// The fallback for unknown names: GPT-2's split.
const PreTokenizerSpec& gpt2_pre_tokenizer();
// Every name find_pre_tokenizer accepts (for docs and tests).
std::vector<std::string_view> known_pre_tokenizer_names();

// A byte range of the input.
struct TextSpan {
  uint32_t offset;
  uint32_t length;
};

class PreTokenizer {
 public:
  static Expected<PreTokenizer> create(const PreTokenizerSpec& spec);

  PreTokenizer(PreTokenizer&&) noexcept;
  PreTokenizer& operator=(PreTokenizer&&) noexcept;
  ~PreTokenizer();

  // Cuts `text` (at most 4 GiB) into words, in order, covering every byte exactly once.
  // Thread-safe: the compiled patterns are shared read-only, match state is per call.
  void split(std::string_view text, std::vector<TextSpan>& words) const;

  const PreTokenizerSpec& spec() const { return *spec_; }

 private:
  struct Pattern;
  PreTokenizer() = default;
  const PreTokenizerSpec* spec_ = nullptr;
  std::vector<std::unique_ptr<Pattern>> patterns_;
};

}  // namespace metro::tokenizer
