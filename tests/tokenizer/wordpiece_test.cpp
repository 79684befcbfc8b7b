// WordPiece ("bert") vocabularies: BERT normalization by hand and against Hugging Face's
// normalizer (tests/fixtures/tokenizer/minilm_wordpiece.json), greedy matching, special
// tokens around a text, decoding, and the metadata variants llama.cpp's converters write.
// The end-to-end check against Hugging Face ids is tests/convert/hf_tokenizer_test.cpp.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"
#include "tokenizer/bert_normalizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using testing::escaped;
using testing::ids_string;
using testing::tokenizer_from;
using testing::VocabSpec;
using testing::vocab_gguf;
using tokenizer::bert_normalize;

std::vector<std::string> words_of(std::string_view text) {
  tokenizer::BertWords w;
  tokenizer::bert_split_words(text, w);
  std::vector<std::string> out;
  for (const tokenizer::BertWord& word : w.words) out.push_back(w.text.substr(word.offset, word.length));
  return out;
}

TEST(BertNormalizer, HandCases) {
  EXPECT_EQ(bert_normalize("H\xC3\xA9llo WORLD"), "hello world");
  EXPECT_EQ(bert_normalize("a\tb\nc\rd e"), "a b c d e");
  // NUL, BEL, VT, FF and NEL are control characters: dropped, not spaces.
  EXPECT_EQ(bert_normalize(std::string("a\0b\x07" "c\x0b" "d\x0c" "e\xC2\x85" "f", 13)), "abcdef");
  // U+00A0 and U+3000 are whitespace; U+200B and U+FEFF are format characters.
  EXPECT_EQ(bert_normalize("a\xC2\xA0" "b\xE3\x80\x80" "c\xE2\x80\x8B" "d\xEF\xBB\xBF" "e"), "a b cde");
  EXPECT_EQ(bert_normalize("\xE4\xB8\xAD\xE6\x96\x87"), " \xE4\xB8\xAD  \xE6\x96\x87 ");  // 中文
  EXPECT_EQ(bert_normalize("\xC4\xB0"), "i");                       // İ: NFD I + U+0307, mark dropped
  EXPECT_EQ(bert_normalize("\xE2\x84\xAB"), "a");                   // Angstrom sign
  EXPECT_EQ(bert_normalize("\xC7\x85"), "\xC7\x86");                // Dž -> dž (no compatibility mapping)
  EXPECT_EQ(bert_normalize("\xEF\xAC\x81"), "\xEF\xAC\x81");        // ﬁ stays a ligature
  EXPECT_EQ(bert_normalize("\xCE\xA3\xCE\xA3"), "\xCF\x83\xCF\x83");  // ΣΣ: no final sigma
  EXPECT_EQ(bert_normalize("\xED\x95\x9C"), "\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB");  // 한 -> jamo
  EXPECT_EQ(bert_normalize("\xCC\x81"), "");                        // a lone U+0301
  EXPECT_EQ(bert_normalize("\xEF\xA4\x80"), " \xE8\xB1\x88 ");      // U+F900 -> U+8C48, spaced
  EXPECT_EQ(bert_normalize("a\xEF\xBF\xBD" "b"), "ab");             // U+FFFD
  EXPECT_EQ(bert_normalize("a\xFF" "b\xC3"), "ab");                 // invalid UTF-8
  EXPECT_EQ(bert_normalize("\xEE\x80\x80x"), "x");                  // private use
  // Categories are Unicode 8.0's: a mark added later (U+08D4) is kept, an older one dropped.
  EXPECT_EQ(bert_normalize("a\xE0\xA3\x94" "b a\xE0\xA3\xA3" "b"), "a\xE0\xA3\x94" "b ab");
}

TEST(BertNormalizer, SplitsWordsAndPunctuation) {
  EXPECT_EQ(words_of("Hello, world!"), (std::vector<std::string>{"hello", ",", "world", "!"}));
  EXPECT_EQ(words_of("a\xE4\xB8\xAD" "b"), (std::vector<std::string>{"a", "\xE4\xB8\xAD", "b"}));
  EXPECT_EQ(words_of("  \t\n "), std::vector<std::string>{});
  EXPECT_EQ(words_of(""), std::vector<std::string>{});
  EXPECT_EQ(words_of("\xC2\xAB" "a\xC2\xBB"), (std::vector<std::string>{"\xC2\xAB", "a", "\xC2\xBB"}));
  // U+037E (Greek question mark) decomposes to ';', which is punctuation.
  EXPECT_EQ(words_of("a\xCD\xBE" "b"), (std::vector<std::string>{"a", ";", "b"}));
  EXPECT_EQ(words_of("$5 x^2"), (std::vector<std::string>{"$", "5", "x", "^", "2"}));
  EXPECT_EQ(words_of("\xE2\x82\xAC" "5"), (std::vector<std::string>{"\xE2\x82\xAC" "5"}));  // € is Sc

  tokenizer::BertWords w;
  tokenizer::bert_split_words("e\xCC\x81t\xC3\xA9 \xED\x95\x9C", w);  // "été" with a combining mark, 한
  ASSERT_EQ(w.words.size(), 2u);
  EXPECT_EQ(w.words[0].n_chars, 3u);
  EXPECT_EQ(w.text.substr(w.words[0].offset, w.words[0].length), "ete");
  EXPECT_EQ(w.words[1].n_chars, 3u);  // three jamo
}

TEST(BertNormalizer, MatchesHuggingFaceOnFixture) {
  std::ifstream f(testing::source_path("tests/fixtures/tokenizer/minilm_wordpiece.json"));
  ASSERT_TRUE(f) << "missing fixture";
  std::stringstream ss;
  ss << f.rdbuf();
  const auto fx = nlohmann::json::parse(ss.str());
  size_t n = 0;
  for (const auto& c : fx["cases"]) {
    const std::string text = c["text"].get<std::string>();
    EXPECT_EQ(bert_normalize(text), c["normalized"].get<std::string>()) << escaped(text);
    ++n;
  }
  EXPECT_GE(n, 80u);
}

// A small vocabulary in llama.cpp's spelling, ids as BERT's usual order would not have them.
VocabSpec bert_spec() {
  VocabSpec s;
  s.model = "bert";
  s.pre.reset();
  s.merges.reset();
  const std::string ws = "\xE2\x96\x81";
  auto add = [&](std::string t, int32_t type) {
    s.tokens.push_back(std::move(t));
    s.types.push_back(type);
  };
  for (const char* t : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) add(t, 3);  // 0..4
  for (const char* t : {"play", "un", "the", "a", "cafe", ",", "!", "x", "\xE4\xB8\xAD"}) {
    add(ws + t, 1);  // 5..13
  }
  for (const char* t : {"ing", "ed", "aff", "able", "a", "x"}) add(t, 1);  // 14..19
  add("zz", 3);  // 20: a control token that spells a continuation
  return s;
}

constexpr int32_t kPad = 0, kUnk = 1, kCls = 2, kSep = 3, kPlay = 5, kUn = 6, kThe = 7, kA = 8,
                  kCafe = 9, kComma = 10, kBang = 11, kX = 12, kZhong = 13, kIng = 14, kEd = 15,
                  kAff = 16, kAble = 17, kXCont = 19;

tokenizer::Tokenizer bert_tokenizer(const VocabSpec& s) {
  auto tok = tokenizer_from(vocab_gguf(s));
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return *tok;
}

VocabSpec with_legacy_ids(VocabSpec s) {
  s.ints = {{"tokenizer.ggml.unknown_token_id", kUnk}, {"tokenizer.ggml.cls_token_id", kCls},
            {"tokenizer.ggml.seperator_token_id", kSep}, {"tokenizer.ggml.padding_token_id", kPad}};
  return s;
}

TEST(WordPiece, GreedyLongestMatch) {
  const auto tok = bert_tokenizer(with_legacy_ids(bert_spec()));
  EXPECT_EQ(tok.kind(), tokenizer::VocabKind::kWpm);
  auto enc = [&](std::string_view t) { return tok.encode(t, false, false); };
  using V = std::vector<int32_t>;
  EXPECT_EQ(enc("Playing"), (V{kPlay, kIng}));
  EXPECT_EQ(enc("played!"), (V{kPlay, kEd, kBang}));
  EXPECT_EQ(enc("unaffable"), (V{kUn, kAff, kAble}));
  EXPECT_EQ(enc("playz"), (V{kUnk}));      // a rest no piece starts: the whole word
  EXPECT_EQ(enc("xzz"), (V{kUnk}));        // control tokens are no pieces
  // U+2581 in the text: "\u2581a" is the word-initial spelling of "a", no continuation.
  EXPECT_EQ(enc("the\xE2\x96\x81" "a"), (V{kUnk}));
  EXPECT_EQ(enc("\xE2\x96\x81" "a"), (V{kUnk}));
  EXPECT_EQ(enc("the CAF\xC3\x89, a"), (V{kThe, kCafe, kComma, kA}));
  EXPECT_EQ(enc("\xE4\xB8\xAD" "a"), (V{kZhong, kA}));
  EXPECT_EQ(enc(""), V{});
  EXPECT_EQ(enc(" \n "), V{});
  // At most 100 characters a word, counted after normalization.
  V hundred(100, kXCont);
  hundred[0] = kX;
  EXPECT_EQ(enc(std::string(100, 'x')), hundred);
  EXPECT_EQ(enc(std::string(101, 'x')), (V{kUnk}));
  std::string accented;
  for (int i = 0; i < 100; ++i) accented += "X\xCC\x81";  // 200 code points, 100 after stripping
  EXPECT_EQ(enc(accented), hundred);
  // The cache must not change answers: the same words again.
  EXPECT_EQ(enc("Playing played Playing"), (V{kPlay, kIng, kPlay, kEd, kPlay, kIng}));
}

TEST(WordPiece, SpecialTokensAroundAndInText) {
  const auto tok = bert_tokenizer(with_legacy_ids(bert_spec()));
  using V = std::vector<int32_t>;
  // Files from older converters say nothing about adding: [CLS] ... [SEP] by default.
  EXPECT_EQ(tok.encode("the", true, false), (V{kCls, kThe, kSep}));
  EXPECT_EQ(tok.encode("", true, false), (V{kCls, kSep}));
  EXPECT_EQ(tok.encode("[CLS] the", false, true), (V{kCls, kThe}));
  EXPECT_EQ(tok.encode("[CLS] the", false, false), (V{kUnk, kUnk, kUnk, kThe}));
  EXPECT_EQ(tok.vocab().cls_id(), kCls);
  EXPECT_EQ(tok.vocab().sep_id(), kSep);
  EXPECT_EQ(tok.vocab().mask_id(), 4);  // by name
  EXPECT_EQ(tok.bos_id(), kCls);
  EXPECT_EQ(tok.pad_id(), kPad);
  EXPECT_FALSE(tok.is_eog(kPad));

  // Newer converters: [CLS] as BOS, [SEP] as EOS, add_sep off. Still one [SEP].
  VocabSpec s = bert_spec();
  s.ints = {{"tokenizer.ggml.bos_token_id", kCls}, {"tokenizer.ggml.eos_token_id", kSep},
            {"tokenizer.ggml.seperator_token_id", kSep}, {"tokenizer.ggml.unknown_token_id", kUnk}};
  s.bools = {{"tokenizer.ggml.add_bos_token", true}, {"tokenizer.ggml.add_eos_token", true},
             {"tokenizer.ggml.add_sep_token", false}};
  EXPECT_EQ(bert_tokenizer(s).encode("the", true, false), (V{kCls, kThe, kSep}));
  // EOS and SEP both asked for and the same token: added once.
  s.bools = {{"tokenizer.ggml.add_eos_token", true}};
  EXPECT_EQ(bert_tokenizer(s).encode("the", true, false), (V{kCls, kThe, kSep}));
  // Nothing asked for.
  s.bools = {{"tokenizer.ggml.add_bos_token", false}, {"tokenizer.ggml.add_sep_token", false}};
  EXPECT_EQ(bert_tokenizer(s).encode("the", true, false), (V{kThe}));
  // No id keys at all: the usual names.
  const auto by_name = bert_tokenizer(bert_spec());
  EXPECT_EQ(by_name.encode("the q", true, false), (V{kCls, kThe, kUnk, kSep}));
}

TEST(WordPiece, NoUnknownTokenDropsUnspellableWords) {
  VocabSpec s = bert_spec();
  s.tokens[kUnk] = "[NOPE]";
  const auto tok = bert_tokenizer(s);
  EXPECT_EQ(tok.unk_id(), -1);
  EXPECT_EQ(tok.encode("the q a", false, false), (std::vector<int32_t>{kThe, kA}));
  bool warned = false;
  for (const auto& w : tok.warnings()) warned |= w.find("no unknown token") != std::string::npos;
  EXPECT_TRUE(warned);
}

TEST(WordPiece, Decode) {
  const auto tok = bert_tokenizer(with_legacy_ids(bert_spec()));
  const std::vector<int32_t> ids = {kCls, kPlay, kIng, kComma, kUn, kAff, kAble, kBang, kSep};
  EXPECT_EQ(tok.decode(ids), "playing , unaffable !");
  tokenizer::DecodeOptions render;
  render.render_special = true;
  EXPECT_EQ(tok.decode(ids, render), "[CLS] playing , unaffable ! [SEP]");
  tokenizer::DecodeOptions continuation;
  continuation.strip_leading_space = false;
  EXPECT_EQ(tok.decode(std::vector<int32_t>{kThe, kA}, continuation), " the a");
  EXPECT_EQ(tok.decode(std::vector<int32_t>{kIng, kThe}), "ing the");  // a continuation first
  EXPECT_EQ(tok.token_to_piece(kPlay), " play");
  EXPECT_EQ(tok.token_to_piece(kIng), "ing");
  EXPECT_TRUE(tok.is_control(kCls));

  for (const auto& opt : {tokenizer::DecodeOptions{}, render, continuation}) {
    tokenizer::IncrementalDetokenizer d(tok, opt);
    std::string streamed;
    for (int32_t id : ids) streamed += d.push(id);
    streamed += d.flush();
    EXPECT_EQ(streamed, tok.decode(ids, opt));
  }
}

}  // namespace
}  // namespace metro
