// WordPiece (BERT) matching of one normalized word (bert_normalizer.h) against a "bert"
// vocabulary in llama.cpp's GGUF spelling: a word-initial piece is stored with a U+2581
// prefix ("▁play"), a continuation bare ("ing" for Hugging Face's "##ing"), control tokens
// ([CLS], [SEP], ...) as they are.
//
// As Hugging Face's WordPiece: the longest word-initial piece that starts the word, then
// repeatedly the longest continuation piece that starts the rest. A word longer than
// kWordPieceMaxChars code points, or with a rest no piece starts, becomes one unknown token
// (nothing when the vocabulary has none). Control, unknown, user-defined and byte tokens
// never match as pieces.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace metro::tokenizer {

inline constexpr size_t kWordPieceMaxChars = 100;

struct WordPieceScratch {
  std::string key;  // "▁" + word, for word-initial lookups
};

// Appends the ids of `word` (valid UTF-8, non-empty, `n_chars` code points) to `out`.
void wordpiece_encode_word(const Vocab& vocab, std::string_view word, size_t n_chars,
                           std::vector<int32_t>& out, WordPieceScratch& scratch);

}  // namespace metro::tokenizer
