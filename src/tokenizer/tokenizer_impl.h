// Internal: the shared state behind a Tokenizer handle, and the one rule of decoding both
// Tokenizer::decode and IncrementalDetokenizer follow.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tokenizer/bpe.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/vocab.h"
#include "tokenizer/word_cache.h"

namespace metro::tokenizer {

struct Tokenizer::Impl {
  Impl(Vocab v, size_t cache_entries)
      : vocab(std::move(v)), cache(cache_entries) {}
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  Vocab vocab;
  std::optional<PreTokenizer> pre;  // BPE only
  std::optional<BpeModel> bpe;      // BPE only; refers to `vocab`, so Impl never moves
  WordCache cache;                  // BPE: word -> ids; WPM: normalized word -> ids
};

// Appends the bytes `id` contributes to a decoded text. `strip_next` carries the
// leading-space rule between tokens. SPM: after the start and after each special token, the
// next text token loses one leading space (encoding added it). WPM: the first word has no
// space before it (word-initial pieces decode as " word"); a special token shown is a word
// of its own, a hidden one changes nothing.
void append_decoded(const Vocab& vocab, int32_t id, const DecodeOptions& options,
                    bool& strip_next, std::string& out);

// `strip_next` at the start of a decoded text.
inline bool strips_first_space(const Vocab& vocab, const DecodeOptions& options) {
  return options.strip_leading_space &&
         (vocab.add_space_prefix() || vocab.kind() == VocabKind::kWpm);
}

}  // namespace metro::tokenizer
