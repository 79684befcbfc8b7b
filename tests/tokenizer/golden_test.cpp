// Token ids equal to llama.cpp's, on the fixtures in tests/fixtures/tokenizer (see its
// README for how they were made).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "support/test_util.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using nlohmann::json;
using testing::escaped;
using testing::ids_string;

json load_fixture(const std::string& name) {
  std::ifstream f(testing::source_path("tests/fixtures/tokenizer/" + name));
  if (!f) throw std::runtime_error("missing fixture " + name);
  std::stringstream ss;
  ss << f.rdbuf();
  return json::parse(ss.str());
}

// Checks every case; returns how many matched.
size_t check_cases(const tokenizer::Tokenizer& tok, const json& cases, const std::string& label) {
  size_t matched = 0;
  for (const json& c : cases) {
    const std::string text = c["text"].get<std::string>();
    const bool add_special = c["add_special"].get<bool>();
    const bool parse_special = c["parse_special"].get<bool>();
    const auto want = c["ids"].get<std::vector<int32_t>>();
    const auto got = tok.encode(text, add_special, parse_special);
    if (got == want) {
      ++matched;
      continue;
    }
    ADD_FAILURE() << label << " text " << escaped(text) << " add_special=" << add_special
                  << " parse_special=" << parse_special << "\n  llama.cpp: " << ids_string(want)
                  << "\n  metro:     " << ids_string(got);
  }
  return matched;
}

TEST(TokenizerGolden, SmolLM2MatchesLlamaCpp) {
  REQUIRE_MODEL();
  const json fx = load_fixture("golden_smollm2.json");
  const auto& tok = testing::smollm2_tokenizer();
  EXPECT_EQ(tok.pre_tokenizer_name(), fx["pre"].get<std::string>());
  EXPECT_TRUE(tok.pre_tokenizer_recognized());
  const size_t n = fx["cases"].size();
  EXPECT_GT(n, 300u);
  EXPECT_EQ(check_cases(tok, fx["cases"], "smollm2"), n);
}

TEST(TokenizerGolden, OtherPreTokenizersOnSmolLM2Vocab) {
  REQUIRE_MODEL();
  const json fx = load_fixture("golden_bpe_pre.json");
  auto file = gguf::File::open(testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  for (const json& variant : fx["variants"]) {
    const std::string pre = variant["pre"].get<std::string>();
    SCOPED_TRACE("pre " + pre);
    const auto bytes = testing::smollm2_with_pre(*file, pre);
    auto tok = testing::tokenizer_from(bytes);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    EXPECT_TRUE(tok->pre_tokenizer_recognized()) << pre;
    EXPECT_EQ(check_cases(*tok, variant["cases"], pre), variant["cases"].size());
  }
}

TEST(TokenizerGolden, SentencePieceMatchesLlamaCpp) {
  const json fx = load_fixture("golden_spm.json");
  const auto& tok = testing::tiny_spm_tokenizer();
  EXPECT_EQ(tok.kind(), tokenizer::VocabKind::kSpm);
  const size_t n = fx["cases"].size();
  EXPECT_EQ(check_cases(tok, fx["cases"], "tiny_spm"), n);
}

std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST(TokenizerGolden, SentencePiecePiecesMatchLlamaCpp) {
  const json fx = load_fixture("golden_spm.json");
  const auto& tok = testing::tiny_spm_tokenizer();
  const auto& pieces = fx["pieces_hex"];
  ASSERT_EQ(pieces.size(), static_cast<size_t>(tok.n_vocab()));
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    EXPECT_EQ(tok.token_to_piece(id), from_hex(pieces[static_cast<size_t>(id)].get<std::string>()))
        << "token " << id;
  }
}

}  // namespace
}  // namespace metro
