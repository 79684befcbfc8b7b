// SentencePiece BPE by scores (Llama 2, Mistral, Phi-3, Gemma vocabularies in GGUF).
//
// The text arrives with spaces already written as U+2581. It starts as one symbol per UTF-8
// character; the adjacent pair whose concatenation is the highest-scoring token merges
// first (ties: leftmost), from a heap, until no pair forms a token. Symbols left that are
// not tokens fall back to their bytes as <0xNN> tokens.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace metro::tokenizer {

struct SpmScratch {
  struct Symbol {
    uint32_t start;
    uint32_t len;  // 0 once merged into its left neighbour
    int32_t prev;
    int32_t next;
  };
  struct Candidate {
    float score;
    int32_t left;
    int32_t right;
    uint32_t len;  // bytes of left + right when pushed
  };
  std::vector<Symbol> symbols;
  std::vector<Candidate> heap;
};

// Appends the ids of `text` (escaped, at most 4 GiB) to `out`.
void spm_encode(const Vocab& vocab, std::string_view text, std::vector<int32_t>& out,
                SpmScratch& scratch);

// " " -> U+2581, as SentencePiece writes spaces.
std::string spm_escape_spaces(std::string_view text);

}  // namespace metro::tokenizer
