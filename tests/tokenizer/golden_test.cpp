// Token ids equal to llama.cpp's, on the fixtures in tests/fixtures/tokenizer (see its
// README for how they were made).
#include <gtest/gtest.h>

#include <cctype>
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

// The pre-tokenizers golden_bpe_pre.json holds, one test each.
constexpr const char* kPreVariants[] = {
    "default",        "gpt-2",       "llama-bpe", "qwen2",     "starcoder", "falcon",
    "deepseek-llm",   "deepseek-coder", "deepseek-v3", "poro-chat", "viking", "tekken",
    "gpt-4o",         "chatglm-bpe", "qwen35"};

const json& pre_fixture() {
  static const json fx = load_fixture("golden_bpe_pre.json");
  return fx;
}

TEST(TokenizerGolden, PreVariantFixtureHasEveryVariant) {
  std::vector<std::string> in_file;
  for (const json& v : pre_fixture()["variants"]) in_file.push_back(v["pre"].get<std::string>());
  EXPECT_EQ(in_file, std::vector<std::string>(std::begin(kPreVariants), std::end(kPreVariants)));
}

class TokenizerGoldenPre : public ::testing::TestWithParam<const char*> {};

TEST_P(TokenizerGoldenPre, SmolLM2VocabUnderOtherPreTokenizer) {
  REQUIRE_MODEL();
  const std::string pre = GetParam();
  const json* cases = nullptr;
  for (const json& v : pre_fixture()["variants"]) {
    if (v["pre"] == pre) cases = &v["cases"];
  }
  ASSERT_NE(cases, nullptr) << pre;
  auto file = gguf::File::open(testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tok = testing::tokenizer_from(testing::smollm2_with_pre(*file, pre));
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_TRUE(tok->pre_tokenizer_recognized()) << pre;
  EXPECT_EQ(check_cases(*tok, *cases, pre), cases->size());
}

INSTANTIATE_TEST_SUITE_P(Variants, TokenizerGoldenPre, ::testing::ValuesIn(kPreVariants),
                         [](const ::testing::TestParamInfo<const char*>& param) {
                           std::string name = param.param;
                           for (char& c : name) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return name;
                         });

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
