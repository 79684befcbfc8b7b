// Properties on random text: decode(encode(x)) == x, streaming equals decoding, every id in
// range, concurrent use equals sequential use.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "support/test_util.h"
#include "tokenizer/spm.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace metro {
namespace {

using testing::escaped;
using testing::random_bytes;
using testing::random_utf8;
using tokenizer::DecodeOptions;
using tokenizer::IncrementalDetokenizer;
using tokenizer::Tokenizer;

constexpr int kRounds = 300;

// Streams `ids` through an incremental detokenizer; checks each chunk is valid UTF-8.
std::string stream(const Tokenizer& tok, const std::vector<int32_t>& ids, DecodeOptions opt = {}) {
  IncrementalDetokenizer detok(tok, opt);
  std::string out;
  for (int32_t id : ids) {
    std::string chunk = detok.push(id);
    EXPECT_TRUE(tokenizer::is_valid_utf8(chunk)) << escaped(chunk);
    EXPECT_LE(detok.pending_bytes(), 3u);
    out += chunk;
  }
  std::string tail = detok.flush();
  EXPECT_TRUE(tokenizer::is_valid_utf8(tail));
  EXPECT_EQ(detok.pending_bytes(), 0u);
  return out + tail;
}

// `text` without the bytes a byte-level vocabulary has no token for (encoding drops them).
std::string spellable(const Tokenizer& tok, std::string_view text) {
  if (tok.kind() != tokenizer::VocabKind::kBpe) return std::string(text);
  std::string out;
  for (char c : text) {
    if (tok.vocab().byte_token(static_cast<uint8_t>(c)) >= 0) out.push_back(c);
  }
  return out;
}

void check_round_trip(const Tokenizer& tok, const std::string& text, bool exact_for_bytes) {
  for (bool add_special : {false, true}) {
    const auto ids = tok.encode(text, add_special, false);
    for (int32_t id : ids) ASSERT_TRUE(tok.valid_id(id)) << id;
    const std::string back = tok.decode(ids);
    if (tokenizer::is_valid_utf8(text)) {
      ASSERT_EQ(back, spellable(tok, text)) << escaped(text) << " add_special=" << add_special;
    } else if (exact_for_bytes) {
      // SentencePiece writes spaces as U+2581 before cutting text into characters; next to
      // broken UTF-8 the U+2581 may come back as its three bytes instead of a space.
      const auto same = tok.kind() == tokenizer::VocabKind::kSpm ? tokenizer::spm_escape_spaces
                                                                 : [](std::string_view s) { return std::string(s); };
      ASSERT_EQ(same(back), same(spellable(tok, text))) << escaped(text) << " add_special=" << add_special;
    }
    ASSERT_EQ(stream(tok, ids), tokenizer::to_valid_utf8(back)) << escaped(text);
  }
}

TEST(TokenizerRoundTrip, SmolLM2RandomUtf8) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  std::mt19937 rng(7);
  for (int i = 0; i < kRounds; ++i) check_round_trip(tok, random_utf8(rng, 60), true);
}

TEST(TokenizerRoundTrip, SmolLM2RandomBytesAreLossless) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  std::mt19937 rng(8);
  for (int i = 0; i < kRounds; ++i) check_round_trip(tok, random_bytes(rng, 80), true);
}

TEST(TokenizerRoundTrip, SmolLM2SpecialTextRoundTrips) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  std::mt19937 rng(9);
  const char* specials[] = {"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<reponame>"};
  for (int i = 0; i < 100; ++i) {
    std::string text = random_utf8(rng, 10) + specials[i % 4] + random_utf8(rng, 10) + specials[(i + 1) % 4];
    const auto parsed = tok.encode(text, false, true);
    DecodeOptions render;
    render.render_special = true;
    text = spellable(tok, text);
    EXPECT_EQ(tok.decode(parsed, render), text);
    EXPECT_EQ(stream(tok, parsed, render), tokenizer::to_valid_utf8(text));
    // Parsed, the special strings are single tokens; as plain text they are not.
    const auto plain = tok.encode(text, false, false);
    EXPECT_EQ(tok.decode(plain), text);
    for (int32_t id : plain) EXPECT_FALSE(tok.is_control(id)) << escaped(text);
  }
}

TEST(TokenizerRoundTrip, SpmRandomUtf8WithLeadingSpaceRule) {
  const auto& tok = testing::tiny_spm_tokenizer();
  std::mt19937 rng(10);
  for (int i = 0; i < kRounds; ++i) check_round_trip(tok, random_utf8(rng, 60), false);
  // Leading and repeated spaces survive: the one added space is the only one removed.
  for (std::string text : {" x", "  two", "\tt", " ", "a  b ", "\n lead"}) {
    check_round_trip(tok, text, false);
  }
}

TEST(TokenizerRoundTrip, SpmRandomBytesAreLossless) {
  const auto& tok = testing::tiny_spm_tokenizer();
  std::mt19937 rng(11);
  for (int i = 0; i < kRounds; ++i) check_round_trip(tok, random_bytes(rng, 80), true);
}

TEST(TokenizerRoundTrip, SpmSpecialTokensKeepSurroundingSpaces) {
  const auto& tok = testing::tiny_spm_tokenizer();
  DecodeOptions render;
  render.render_special = true;
  for (std::string text : {"<|im_start|>user hi<|im_end|>", "a <|im_end|> b", "<tool_call>x</tool_call>",
                           "x<s>y", "<s> spaced"}) {
    const auto ids = tok.encode(text, false, true);
    EXPECT_EQ(tok.decode(ids, render), text) << escaped(text);
    EXPECT_EQ(stream(tok, ids, render), text) << escaped(text);
  }
}

TEST(TokenizerRoundTrip, SpmContinuationKeepsLeadingSpace) {
  const auto& tok = testing::tiny_spm_tokenizer();
  const auto ids = tok.encode("the trains", false, false);
  EXPECT_EQ(tok.decode(ids), "the trains");
  DecodeOptions continuation;
  continuation.strip_leading_space = false;
  EXPECT_EQ(tok.decode(ids, continuation), " the trains");
  EXPECT_EQ(stream(tok, ids, continuation), " the trains");
}

TEST(TokenizerRoundTrip, StreamingEqualsDecodingForRandomIds) {
  REQUIRE_MODEL();
  for (const Tokenizer* tok : {&testing::smollm2_tokenizer(), &testing::tiny_spm_tokenizer()}) {
    std::mt19937 rng(12);
    std::uniform_int_distribution<int32_t> any_id(-3, tok->n_vocab() + 3);
    for (int i = 0; i < kRounds; ++i) {
      std::vector<int32_t> ids(std::uniform_int_distribution<size_t>(0, 30)(rng));
      for (auto& id : ids) id = any_id(rng);
      for (bool render : {false, true}) {
        DecodeOptions opt;
        opt.render_special = render;
        EXPECT_EQ(stream(*tok, ids, opt), tokenizer::to_valid_utf8(tok->decode(ids, opt)));
      }
    }
  }
}

TEST(TokenizerRoundTrip, ConcurrentEncodeEqualsSequential) {
  REQUIRE_MODEL();
  const auto& tok = testing::smollm2_tokenizer();
  std::mt19937 rng(13);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_utf8(rng, 200) + " the trains ran on time");
  std::vector<std::vector<int32_t>> want;
  for (const auto& t : texts) want.push_back(tok.encode(t, true, true));
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i + static_cast<size_t>(t) * 7) % texts.size();
          if (tok.encode(texts[k], true, true) != want[k]) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

}  // namespace
}  // namespace metro
