// Shared by the grammar tests: a vocabulary in which any text can be matched byte by byte.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace metro::grammar::test_support {

// Every single byte as a token, then an end token (id 256).
inline std::shared_ptr<const TokenTrie> byte_trie() {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  pieces.push_back("<eos>");
  return TokenTrie::from_pieces(pieces, {256});
}

// Whether `text` is a complete sentence of the grammar.
inline bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  Matcher m(g);
  return m.accept_bytes(text) && m.is_accepting();
}

}  // namespace metro::grammar::test_support
