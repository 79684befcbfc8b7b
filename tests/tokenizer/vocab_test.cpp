// Vocabulary metadata from untrusted files: what is refused, what is ignored with a
// warning, and that nothing reads out of bounds either way (docs/reliability.md item 5).
#include <gtest/gtest.h>

#include <algorithm>

#include "gguf/writer.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using testing::byte_level_spec;
using testing::spm_spec;
using testing::tokenizer_from;
using testing::VocabSpec;
using testing::vocab_gguf;

bool has_warning(const tokenizer::Tokenizer& tok, std::string_view needle) {
  const auto& w = tok.warnings();
  return std::any_of(w.begin(), w.end(), [&](const std::string& s) { return s.find(needle) != std::string::npos; });
}

std::string all_warnings(const tokenizer::Tokenizer& tok) {
  std::string out;
  for (const auto& w : tok.warnings()) out += w + "\n";
  return out;
}

// Every id an encode returns is in range, and decoding anything does not crash.
void expect_sane(const tokenizer::Tokenizer& tok) {
  for (std::string_view text : {"hello world", "\xff\xfe garbage \xc3", "<s> </s> <0x41>", ""}) {
    for (bool special : {false, true}) {
      for (int32_t id : tok.encode(text, special, special)) EXPECT_TRUE(tok.valid_id(id)) << id;
    }
  }
  const std::vector<int32_t> wild = {-1, 0, tok.n_vocab() - 1, tok.n_vocab(), INT32_MAX, INT32_MIN};
  (void)tok.decode(wild);
  for (int32_t id : wild) (void)tok.token_to_piece(id);
}

TEST(TokenizerVocab, NoTokenizerIsNotFound) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  auto tok = tokenizer_from(w.serialize());
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(tok.status().message().find("tokenizer.ggml.model"), std::string::npos);
}

TEST(TokenizerVocab, UnsupportedModelIsUnimplemented) {
  VocabSpec s = byte_level_spec({});
  s.model = "rwkv";
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), ErrorCode::kUnimplemented);
  EXPECT_NE(tok.status().message().find("rwkv"), std::string::npos);
}

TEST(TokenizerVocab, MissingOrEmptyTokensRefused) {
  VocabSpec s = byte_level_spec({});
  s.tokens.clear();
  s.types.clear();
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("tokenizer.ggml.tokens"), std::string::npos);

  gguf::Writer w;
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_i32_array("tokenizer.ggml.tokens", {1, 2, 3});
  auto wrong = tokenizer_from(w.serialize());
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("tokenizer.ggml.tokens"), std::string::npos)
      << wrong.status().message();
}

TEST(TokenizerVocab, ShortTypeAndScoreArraysRefused) {
  VocabSpec s = byte_level_spec({});
  s.types.resize(10);
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("token_type"), std::string::npos);

  VocabSpec spm = spm_spec({"\xE2\x96\x81" "a"});
  spm.scores.resize(3);
  auto tok2 = tokenizer_from(vocab_gguf(spm));
  ASSERT_FALSE(tok2.ok());
  EXPECT_NE(tok2.status().message().find("scores"), std::string::npos);
}

TEST(TokenizerVocab, HugeTokenStringRefused) {
  VocabSpec s = byte_level_spec({});
  s.tokens.push_back(std::string(tokenizer::kMaxTokenBytes + 1, 'x'));
  s.types.push_back(1);
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), ErrorCode::kOutOfRange);
  EXPECT_NE(tok.status().message().find("token 256"), std::string::npos) << tok.status().message();
}

TEST(TokenizerVocab, GptVocabWithoutMergesRefused) {
  VocabSpec s = byte_level_spec({});
  s.merges.reset();
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_FALSE(tok.ok());
  EXPECT_NE(tok.status().message().find("merges"), std::string::npos);
}

TEST(TokenizerVocab, DuplicateStringsWarnAndFirstIdWins) {
  VocabSpec s = byte_level_spec({{"a", "b"}});
  s.tokens.push_back("ab");  // duplicate of the merge result (id 256)
  s.types.push_back(1);
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_TRUE(has_warning(*tok, "duplicate")) << all_warnings(*tok);
  EXPECT_EQ(tok->encode("ab", false, false), std::vector<int32_t>({256}));
  EXPECT_EQ(tok->token_to_piece(257), "ab");
  expect_sane(*tok);
}

TEST(TokenizerVocab, SpecialIdsOutOfRangeIgnored) {
  VocabSpec s = byte_level_spec({});
  s.ints = {{"tokenizer.ggml.bos_token_id", 999999},
            {"tokenizer.ggml.eos_token_id", -5},
            {"tokenizer.ggml.padding_token_id", int64_t{1} << 40},
            {"tokenizer.ggml.eot_token_id", 256}};
  s.strings = {{"tokenizer.ggml.unknown_token_id", "zero"}};
  s.bools = {{"tokenizer.ggml.add_bos_token", true}, {"tokenizer.ggml.add_eos_token", true}};
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_EQ(tok->eos_id(), -1);
  EXPECT_EQ(tok->pad_id(), -1);
  EXPECT_EQ(tok->eot_id(), -1);
  EXPECT_EQ(tok->unk_id(), -1);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_FALSE(tok->add_eos());
  EXPECT_TRUE(has_warning(*tok, "bos_token_id = 999999")) << all_warnings(*tok);
  EXPECT_TRUE(has_warning(*tok, "eos_token_id = -5")) << all_warnings(*tok);
  EXPECT_TRUE(has_warning(*tok, "unknown_token_id is not an integer")) << all_warnings(*tok);
  EXPECT_TRUE(has_warning(*tok, "no BOS")) << all_warnings(*tok);
  EXPECT_FALSE(tok->is_eog(256));
  EXPECT_FALSE(tok->is_eog(-1));
  EXPECT_EQ(tok->encode("ab", true, true), tok->encode("ab", false, false));
  expect_sane(*tok);
}

TEST(TokenizerVocab, MalformedByteTokensBecomeText) {
  VocabSpec s = spm_spec({"\xE2\x96\x81", "\xE2\x96\x81" "a", "<0x-1>", "<0xZZ>", "<0x1>"});
  // Mark the three broken ones as byte tokens; break the real <0x41> ('A') too.
  const size_t first = s.tokens.size() - 3;
  for (size_t i = first; i < s.tokens.size(); ++i) s.types[i] = 6;
  s.tokens[3 + 'A'] = "<0x4G>";
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_TRUE(has_warning(*tok, "4 byte tokens not of the form <0xNN>")) << all_warnings(*tok);
  EXPECT_EQ(tok->token_to_piece(static_cast<int32_t>(first)), "<0x-1>");
  const int32_t space = tok->vocab().find("\xE2\x96\x81");
  ASSERT_GE(space, 0);
  // 'A' has no byte token any more: byte fallback gives UNK.
  EXPECT_EQ(tok->encode("A", false, false), std::vector<int32_t>({space, 0}));
  // Other bytes still fall back to their <0xNN> tokens.
  EXPECT_EQ(tok->encode("B", false, false), std::vector<int32_t>({space, 3 + 'B'}));
  expect_sane(*tok);
}

TEST(TokenizerVocab, BadMergesIgnored) {
  VocabSpec s = byte_level_spec({{"a", "b"}});
  s.merges->insert(s.merges->begin(), {"nospace", "x y", " lead", "a b c"});
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_TRUE(has_warning(*tok, "4 merges")) << all_warnings(*tok);
  EXPECT_EQ(tok->encode("abab", false, false), std::vector<int32_t>({256, 256}));
  expect_sane(*tok);
}

TEST(TokenizerVocab, EmptyStringsAndOddTypesWarned) {
  VocabSpec s = byte_level_spec({});
  s.tokens.push_back("");
  s.types.push_back(1);
  s.tokens.push_back("weird");
  s.types.push_back(99);
  s.tokens.push_back("neg");
  s.types.push_back(-3);
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_TRUE(has_warning(*tok, "1 empty token strings")) << all_warnings(*tok);
  EXPECT_TRUE(has_warning(*tok, "2 token types outside 0..6")) << all_warnings(*tok);
  EXPECT_EQ(tok->token_to_piece(257), "");  // undefined tokens decode to nothing
  expect_sane(*tok);
}

TEST(TokenizerVocab, BytesWithoutTokensAreDropped) {
  // Only 'a' and 'b' exist: other bytes have no token; like llama.cpp they are dropped,
  // even with an UNK token at hand.
  VocabSpec s;
  s.tokens = {"a", "b", "<unk>"};
  s.types = {1, 1, 2};
  s.ints = {{"tokenizer.ggml.unknown_token_id", 2}};
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->encode("abc", false, false), std::vector<int32_t>({0, 1}));
  EXPECT_EQ(tok->encode("c a", false, false), std::vector<int32_t>({0}));
  expect_sane(*tok);
}

TEST(TokenizerVocab, UnknownPreTokenizerWarnsAndSplitsLikeGpt2) {
  VocabSpec s = byte_level_spec({{" ", "w"}, {"o", "r"}});
  s.pre = "no-such-pre";
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_FALSE(tok->pre_tokenizer_recognized());
  EXPECT_EQ(tok->pre_tokenizer_name(), "no-such-pre");
  EXPECT_TRUE(has_warning(*tok, "unknown pre-tokenizer 'no-such-pre'")) << all_warnings(*tok);
  s.pre = "gpt-2";
  auto gpt2 = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(gpt2.ok());
  EXPECT_TRUE(gpt2->pre_tokenizer_recognized());
  for (std::string_view text : {"hello world 123 it's", "  x\n\ny", "a1b2 !!?"}) {
    EXPECT_EQ(tok->encode(text, false, false), gpt2->encode(text, false, false)) << text;
  }
}

TEST(TokenizerVocab, MissingPreIsDefaultWithWarning) {
  VocabSpec s = byte_level_spec({});
  s.pre.reset();
  auto tok = tokenizer_from(vocab_gguf(s));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->pre_tokenizer_name(), "default");
  EXPECT_TRUE(tok->pre_tokenizer_recognized());
  EXPECT_TRUE(has_warning(*tok, "tokenizer.ggml.pre is missing")) << all_warnings(*tok);
}

TEST(TokenizerVocab, SmolLM2SpecialTokensMatchLlamaCpp) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  EXPECT_EQ(tok.n_vocab(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.pad_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_EQ(tok.kind(), tokenizer::VocabKind::kBpe);
  // llama.cpp's end-of-generation set for this file: <|endoftext|>, <|im_end|>, <reponame>.
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.is_eog(id)) eog.push_back(id);
  }
  EXPECT_EQ(eog, std::vector<int32_t>({0, 2, 4}));
  EXPECT_TRUE(tok.is_eog(tok.eot_id()));
  EXPECT_TRUE(tok.warnings().empty()) << all_warnings(tok);
  EXPECT_TRUE(tok.is_control(1));
  EXPECT_FALSE(tok.is_control(100));
}

TEST(TokenizerVocab, SpmDefaultsAndEog) {
  const auto& tok = testing::tiny_spm_tokenizer();
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.unk_id(), 0);
  EXPECT_TRUE(tok.add_bos());
  EXPECT_TRUE(tok.is_eog(2));
  const int32_t im_end = tok.vocab().find("<|im_end|>");
  ASSERT_GE(im_end, 0);
  EXPECT_TRUE(tok.is_eog(im_end));
  EXPECT_EQ(tok.eot_id(), im_end);
  EXPECT_FALSE(tok.is_eog(tok.vocab().find("<|im_start|>")));
}

}  // namespace
}  // namespace metro
