// IncrementalDetokenizer: whole characters only, U+FFFD for what can never be one.
#include <gtest/gtest.h>

#include "support/test_util.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace metro {
namespace {

using tokenizer::IncrementalDetokenizer;

// A byte-level vocabulary whose tokens are single bytes: any byte sequence is easy to feed.
const tokenizer::Tokenizer& bytes_tokenizer() {
  static const tokenizer::Tokenizer tok = *testing::tokenizer_from(testing::vocab_gguf(testing::byte_level_spec({})));
  return tok;
}

int32_t byte_id(uint8_t b) { return bytes_tokenizer().vocab().byte_token(b); }

std::vector<std::string> push_bytes(IncrementalDetokenizer& d, std::string_view bytes) {
  std::vector<std::string> out;
  for (char c : bytes) out.push_back(d.push(byte_id(static_cast<uint8_t>(c))));
  return out;
}

TEST(TokenizerDetokenizer, HoldsPartialCharacters) {
  IncrementalDetokenizer d(bytes_tokenizer());
  // "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80
  auto chunks = push_bytes(d, "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "\xC3\xA9", "", "", "\xE2\x82\xAC", "", "", "",
                                              "\xF0\x9F\x98\x80"}));
  EXPECT_EQ(d.flush(), "");
}

TEST(TokenizerDetokenizer, InvalidBytesBecomeReplacementAtOnce) {
  IncrementalDetokenizer d(bytes_tokenizer());
  EXPECT_EQ(d.push(byte_id(0xFF)), "\xEF\xBF\xBD");
  EXPECT_EQ(d.push(byte_id(0x80)), "\xEF\xBF\xBD");  // a lone continuation byte
  EXPECT_EQ(d.push(byte_id(0xE2)), "");
  // E2 then 'x': the held lead byte can never complete.
  EXPECT_EQ(d.push(byte_id('x')), "\xEF\xBF\xBD" "x");
  EXPECT_EQ(d.push(byte_id(0xED)), "");
  EXPECT_EQ(d.push(byte_id(0xA0)), "\xEF\xBF\xBD\xEF\xBF\xBD");  // a surrogate: ED A0 is ill-formed
  EXPECT_EQ(d.push(byte_id(0xC0)), "\xEF\xBF\xBD");  // overlong lead
  EXPECT_EQ(d.pending_bytes(), 0u);
}

TEST(TokenizerDetokenizer, FlushReplacesIncompleteTail) {
  IncrementalDetokenizer d(bytes_tokenizer());
  EXPECT_EQ(d.push(byte_id(0xF0)), "");
  EXPECT_EQ(d.push(byte_id(0x9F)), "");
  EXPECT_EQ(d.pending_bytes(), 2u);
  EXPECT_EQ(d.flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(d.flush(), "");
  // Usable again after a flush.
  EXPECT_EQ(d.push(byte_id('o')), "o");
}

TEST(TokenizerDetokenizer, SmolLM2SplitsCharactersAcrossTokensAndStreamHoldsThem) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  const std::string text = "家族 👨‍👩‍👧‍👦 🏳️‍🌈";
  const auto ids = tok.encode(text, false, false);
  IncrementalDetokenizer d(tok);
  std::string out;
  size_t held = 0;
  for (int32_t id : ids) {
    const std::string piece = tok.token_to_piece(id);
    const std::string chunk = d.push(id);
    if (!tokenizer::is_valid_utf8(piece)) ++held;
    EXPECT_TRUE(tokenizer::is_valid_utf8(chunk));
    out += chunk;
  }
  EXPECT_GT(held, 0u) << "the test text should split a character across tokens";
  out += d.flush();
  EXPECT_EQ(out, text);
}

TEST(TokenizerDetokenizer, SpmStripsOnlyTheAddedSpace) {
  const auto& tok = testing::tiny_spm_tokenizer();
  const auto ids = tok.encode("Hello there", true, false);
  ASSERT_EQ(ids.front(), tok.bos_id());
  IncrementalDetokenizer d(tok);
  std::string out;
  for (int32_t id : ids) out += d.push(id);
  out += d.flush();
  EXPECT_EQ(out, "Hello there");
  EXPECT_EQ(tok.decode(ids), "Hello there");
}

TEST(TokenizerDetokenizer, ToValidUtf8) {
  using tokenizer::to_valid_utf8;
  EXPECT_EQ(to_valid_utf8("ok"), "ok");
  EXPECT_EQ(to_valid_utf8("\xE2\x82"), "\xEF\xBF\xBD");
  EXPECT_EQ(to_valid_utf8("a\xF4\x90\x80\x80" "b"), "a\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD" "b");
  EXPECT_EQ(to_valid_utf8("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_TRUE(tokenizer::is_valid_utf8("\xEF\xBF\xBF"));
  EXPECT_FALSE(tokenizer::is_valid_utf8("\xC1\xBF"));
}

}  // namespace
}  // namespace metro
