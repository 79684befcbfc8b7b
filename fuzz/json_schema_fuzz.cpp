// libFuzzer target: JSON schemas arrive in requests (`response_format`). Compiling any
// schema to a grammar, matching any text against it and computing a token mask must never
// crash, leak, read out of bounds or hang; what cannot be compiled is an error Status.
// Input: a schema, then optionally a NUL byte and a text to match.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace {

const std::shared_ptr<const metro::grammar::TokenTrie>& trie() {
  // Single bytes, a few multi-byte pieces JSON often tokenizes into, and an end token.
  static const auto t = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
    for (const char* p : {"\":", "\",", "{\"", "\"}", "true", "false", "null", "  ", "\n  ", "12", "ab", "\\u00"}) {
      pieces.push_back(p);
    }
    pieces.push_back("<eos>");
    return metro::grammar::TokenTrie::from_pieces(pieces, {static_cast<int32_t>(pieces.size() - 1)});
  }();
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  const std::string_view schema_text = in.substr(0, nul);
  const std::string_view text = nul == std::string_view::npos ? std::string_view() : in.substr(nul + 1);
  if (!metro::fuzz::shallow(schema_text)) return 0;
  const auto schema = nlohmann::ordered_json::parse(schema_text, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) return 0;
  auto g = metro::grammar::json_schema_grammar(schema);
  if (!g.ok()) return 0;
  auto c = metro::grammar::CompiledGrammar::compile(std::move(*g), trie());
  if (!c.ok()) return 0;
  metro::grammar::Matcher m(*c);
  metro::grammar::TokenMask mask;
  m.fill_mask(mask);
  for (size_t i = 0; i < text.size() && i < 256; ++i) {
    if (!m.accept_bytes(text.substr(i, 1))) break;
    if (i % 16 == 0) m.fill_mask(mask);
  }
  return 0;
}
