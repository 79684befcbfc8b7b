// Cuts text at occurrences of special-token strings before the model's own splitting.
//
// Tokens are tried longest first; each one cuts every text fragment left by the longer ones
// at all its (non-overlapping, leftmost-first) occurrences. This is llama.cpp's order, which
// differs from a single leftmost-longest scan when two special strings overlap. Control and
// unknown tokens take part only with parse_special; user-defined ones always do.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/vocab.h"

namespace metro::tokenizer {

struct Fragment {
  uint32_t offset = 0;  // text fragments: a byte range of the input
  uint32_t length = 0;
  int32_t token = -1;   // >= 0: a special token matched here

  bool is_token() const { return token >= 0; }
};

// `text` must be under 4 GiB.
void split_special(const Vocab& vocab, std::string_view text, bool parse_special,
                   std::vector<Fragment>& out);

}  // namespace metro::tokenizer
