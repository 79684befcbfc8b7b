// Pre-tokenizer splitting: every byte covered once, in order, for every known pattern set,
// on any input, including huge words that push regex engines to their limits.
#include <gtest/gtest.h>

#include <random>
#include <set>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using tokenizer::PreTokenizer;
using tokenizer::TextSpan;

std::vector<std::string> split(const PreTokenizer& p, std::string_view text) {
  std::vector<TextSpan> spans;
  p.split(text, spans);
  std::vector<std::string> words;
  size_t expect = 0;
  for (const TextSpan s : spans) {
    EXPECT_EQ(s.offset, expect) << "gap or overlap";
    EXPECT_GT(s.length, 0u);
    expect = size_t{s.offset} + s.length;
    words.emplace_back(text.substr(s.offset, s.length));
  }
  EXPECT_EQ(expect, text.size());
  return words;
}

PreTokenizer make(std::string_view name) {
  const auto* spec = tokenizer::find_pre_tokenizer(name);
  EXPECT_NE(spec, nullptr) << name;
  auto p = PreTokenizer::create(spec ? *spec : tokenizer::gpt2_pre_tokenizer());
  EXPECT_TRUE(p.ok()) << p.status().message();
  return std::move(*p);
}

TEST(TokenizerPreTokenizer, EveryKnownNameCompilesAndCoversInput) {
  std::mt19937 rng(21);
  std::set<std::string_view> families;
  for (std::string_view name : tokenizer::known_pre_tokenizer_names()) {
    SCOPED_TRACE(std::string(name));
    const PreTokenizer p = make(name);
    families.insert(p.spec().family);
    for (int i = 0; i < 20; ++i) {
      split(p, testing::random_utf8(rng, 80));
      split(p, testing::random_bytes(rng, 80));
    }
  }
  EXPECT_GE(families.size(), 15u);
}

TEST(TokenizerPreTokenizer, Gpt2Split) {
  const PreTokenizer p = make("gpt-2");
  EXPECT_EQ(split(p, "Hello world, it's 2024!"),
            (std::vector<std::string>{"Hello", " world", ",", " it", "'s", " 2024", "!"}));
  // Whitespace before a word stays with the word, except one space.
  EXPECT_EQ(split(p, "a   b"), (std::vector<std::string>{"a", "  ", " b"}));
  EXPECT_EQ(split(p, "end  "), (std::vector<std::string>{"end", "  "}));
}

TEST(TokenizerPreTokenizer, UnicodeWhitespaceIncludesNelAndIdeographicSpace) {
  // llama.cpp treats U+0085 and U+3000 as whitespace; PCRE2 must too.
  const PreTokenizer p = make("gpt-2");
  EXPECT_EQ(split(p, "a\xC2\x85\xC2\x85" "b"),
            (std::vector<std::string>{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(split(p, "a\xE3\x80\x80\xE3\x80\x80" "b"),
            (std::vector<std::string>{"a", "\xE3\x80\x80", "\xE3\x80\x80", "b"}));
}

TEST(TokenizerPreTokenizer, StarcoderIsolatesDigits) {
  const PreTokenizer p = make("smollm");
  EXPECT_EQ(split(p, "x 123"), (std::vector<std::string>{"x", " ", "1", "2", "3"}));
}

TEST(TokenizerPreTokenizer, Llama3GroupsDigitsByThree) {
  const PreTokenizer p = make("llama-bpe");
  EXPECT_EQ(split(p, "1234567 I'M"), (std::vector<std::string>{"123", "456", "7", " I", "'M"}));
}

TEST(TokenizerPreTokenizer, InvalidUtf8IsKeptBetweenMatches) {
  const PreTokenizer p = make("llama-bpe");
  EXPECT_EQ(split(p, "ab\xFF\xFE" "cd"), (std::vector<std::string>{"ab", "\xFF\xFE", "cd"}));
  split(p, "\xC3");
  split(p, std::string("\x00\x00 a\x00", 5));
}

TEST(TokenizerPreTokenizer, HugeWordsAndRunsStayCovered) {
  // Patterns with nested repeats (tekken, gpt-4o) may exhaust PCRE2's JIT stack on one
  // enormous word; the split must still cover the input.
  const std::string letters(200000, 'a');
  const std::string mixed = [] {
    std::string s;
    for (int i = 0; i < 50000; ++i) s += (i % 2) ? "B" : "\xC3\xA9";
    return s;
  }();
  const std::string spaces(200000, ' ');
  const std::string digits(100000, '7');
  for (std::string_view name : {"tekken", "gpt-4o", "llama-bpe", "smollm", "deepseek-llm", "default"}) {
    SCOPED_TRACE(std::string(name));
    const PreTokenizer p = make(name);
    for (const std::string* text : {&letters, &mixed, &spaces, &digits}) split(p, *text);
  }
}

}  // namespace
}  // namespace metro
