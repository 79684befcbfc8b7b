// Special-token matching in text: llama.cpp's order (longest string first, over the whole
// text), parse_special on/off, user-defined tokens, many special strings, strip rules.
#include <gtest/gtest.h>

#include "tokenizer/special_split.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using testing::byte_level_spec;
using testing::tokenizer_from;
using testing::vocab_gguf;

std::vector<int32_t> bytes_of(const tokenizer::Tokenizer& tok, std::string_view s) {
  std::vector<int32_t> ids;
  for (char c : s) ids.push_back(tok.vocab().byte_token(static_cast<uint8_t>(c)));
  return ids;
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

TEST(TokenizerSpecialSplit, LongestStringWinsOverTheWholeText) {
  auto spec = byte_level_spec({}, {"ab", "bcd"});
  auto tok = tokenizer_from(vocab_gguf(spec));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const int32_t ab = tok->vocab().find("ab"), bcd = tok->vocab().find("bcd");
  // "bcd" is tried first and takes the "b" that a leftmost scan would give to "ab".
  EXPECT_EQ(tok->encode("abcd", false, true), concat({bytes_of(*tok, "a"), {bcd}}));
  EXPECT_EQ(tok->encode("ab cd ab", false, true), concat({{ab}, bytes_of(*tok, " cd "), {ab}}));
  // Off: control strings are plain text.
  EXPECT_EQ(tok->encode("abcd", false, false), bytes_of(*tok, "abcd"));
}

TEST(TokenizerSpecialSplit, UserDefinedTokensMatchEvenWithoutParseSpecial) {
  auto spec = byte_level_spec({}, {"<ctl>"});
  spec.tokens.push_back("<tool>");
  spec.types.push_back(4);
  auto tok = tokenizer_from(vocab_gguf(spec));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const int32_t tool = tok->vocab().find("<tool>");
  EXPECT_EQ(tok->encode("<ctl><tool>", false, false), concat({bytes_of(*tok, "<ctl>"), {tool}}));
  EXPECT_EQ(tok->encode("<ctl><tool>", false, true), (std::vector<int32_t>{tok->vocab().find("<ctl>"), tool}));
  // User-defined tokens are text: decode shows them without render_special.
  EXPECT_EQ(tok->decode(std::vector<int32_t>{tool}), "<tool>");
}

TEST(TokenizerSpecialSplit, ManySpecialStrings) {
  std::vector<std::string> specials;
  for (int i = 0; i < 300; ++i) specials.push_back("<|reserved_" + std::to_string(i) + "|>");
  specials.push_back("<|a|>");
  auto tok = tokenizer_from(vocab_gguf(byte_level_spec({}, specials)));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  auto id = [&](const std::string& s) { return tok->vocab().find(s); };
  const std::string text = "x<|reserved_7|><|reserved_299|>y<|reserved_30|<|a|><|reserved_|>";
  EXPECT_EQ(tok->encode(text, false, true),
            concat({bytes_of(*tok, "x"), {id("<|reserved_7|>"), id("<|reserved_299|>")},
                    bytes_of(*tok, "y<|reserved_30|"), {id("<|a|>")}, bytes_of(*tok, "<|reserved_|>")}));
}

TEST(TokenizerSpecialSplit, Phi3SpecialTokensSwallowFollowingWhitespace) {
  auto spec = testing::spm_spec({"\xE2\x96\x81", "\xE2\x96\x81x"});
  for (const char* s : {"<|user|>", "<|end|>"}) {
    spec.tokens.push_back(s);
    spec.types.push_back(3);
    spec.scores.push_back(0);
  }
  spec.strings = {{"general.name", "Phi 3 Mini"}};
  auto plain = tokenizer_from(vocab_gguf(spec));
  spec.strings = {{"general.name", "Phi-3-mini-4k-instruct"}};
  auto phi3 = tokenizer_from(vocab_gguf(spec));
  ASSERT_TRUE(plain.ok() && phi3.ok());
  const int32_t user = phi3->vocab().find("<|user|>"), sp = phi3->vocab().find("\xE2\x96\x81"),
                x = phi3->vocab().find("\xE2\x96\x81x");
  EXPECT_EQ(phi3->encode("<|user|> \n x", false, true), (std::vector<int32_t>{user, x}));
  const int32_t nl = plain->vocab().byte_token('\n');
  EXPECT_EQ(plain->encode("<|user|> \n x", false, true), (std::vector<int32_t>{user, sp, sp, nl, x}));
}

TEST(TokenizerSpecialSplit, FragmentsCoverText) {
  auto tok = tokenizer_from(vocab_gguf(byte_level_spec({}, {"<s>", "</s>"})));
  ASSERT_TRUE(tok.ok());
  std::vector<tokenizer::Fragment> frags;
  const std::string text = "a<s>b</s></s>c<s";
  tokenizer::split_special(tok->vocab(), text, true, frags);
  size_t at = 0;
  std::string rebuilt;
  for (const auto& f : frags) {
    EXPECT_EQ(f.offset, at);
    at += f.length;
    rebuilt += f.is_token() ? tok->vocab().token(f.token).text : text.substr(f.offset, f.length);
  }
  EXPECT_EQ(rebuilt, text);
  EXPECT_EQ(frags.size(), 6u);  // a <s> b </s> </s> "c<s"
}

}  // namespace
}  // namespace metro
