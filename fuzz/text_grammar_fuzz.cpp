// libFuzzer target: regular expressions (`metro.regex`, schema `pattern`s) and GBNF and Lark
// grammars (`metro.grammar`) arrive in requests. Compiling any text as either, and matching any text
// against what compiles, must never crash, leak, overflow the stack or hang; what cannot be
// compiled is an error Status. The first masks of each text must equal token-by-token
// matching (the trie has a node with 256 tokens below it, where the mask walk may allow a
// whole subtree at once).
// Input: a selector byte (modulo 4: 0 and 2 regex, 1 GBNF, 3 Lark), the pattern, then
// optionally a NUL byte and a text to match.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "grammar/gbnf.h"
#include "grammar/lark.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace {

const std::shared_ptr<const metro::grammar::TokenTrie>& trie() {
  static const auto t = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
    for (const char* p : {"ab", "12", "  ", "\n", "é", "the", "::=", "%ignore", "start:"}) pieces.push_back(p);
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string("x") + static_cast<char>(b));
    pieces.push_back("<eos>");
    return metro::grammar::TokenTrie::from_pieces(pieces, {static_cast<int32_t>(pieces.size() - 1)});
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1 || size > 64 * 1024) return 0;
  const int kind = data[0] & 3;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string_view pattern = rest.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  auto g = kind == 1   ? metro::grammar::gbnf_grammar(pattern)
           : kind == 3 ? metro::grammar::lark_grammar(pattern)
                       : metro::grammar::regex_grammar(pattern);
  if (!g.ok()) return 0;
  auto c = metro::grammar::CompiledGrammar::compile(std::move(*g), trie());
  if (!c.ok()) return 0;
  metro::grammar::Matcher m(*c);
  metro::grammar::TokenMask mask;
  int checked = 0;
  auto mask_and_check = [&] {
    m.fill_mask(mask);
    if (checked++ >= 4) return;
    for (int32_t t = 0; t < trie()->n_vocab(); ++t) {
      if (metro::grammar::mask_has(mask, t) != m.allows(t)) __builtin_trap();
    }
  };
  mask_and_check();
  for (char ch : text) {
    if (!m.accept_bytes(std::string_view(&ch, 1))) break;
    mask_and_check();
  }
  return 0;
}
