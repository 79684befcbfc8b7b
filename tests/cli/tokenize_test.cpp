#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "gguf/gguf_test_util.h"
#include "support/test_util.h"
#include "tokenizer/tokenizer_test_util.h"

namespace metro {
namespace {

using metro::testing::run_metro;
using metro::testing::TempFile;

TEST(TokenizeCli, PrintsIdsAndPieces) {
  REQUIRE_MODEL();
  auto r = run_metro({"tokenize", "-m", metro::testing::default_model_path(), "Hello world<|im_end|>"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "   19556  'Hello'\n     905  ' world'\n       2  '<|im_end|>'\n");
}

TEST(TokenizeCli, JsonMatchesLibrary) {
  REQUIRE_MODEL();
  const std::string text = "The trains ran on time: 12 stations, 家族 👨‍👩‍👧.\n<|im_start|>";
  auto r = run_metro({"tokenize", "-m", metro::testing::default_model_path(), "--json", text});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  const auto ids = j["ids"].get<std::vector<int32_t>>();
  const auto& tok = metro::testing::smollm2_tokenizer();
  EXPECT_EQ(ids, tok.encode(text, true, true));
  ASSERT_EQ(j["pieces"].size(), ids.size());
  EXPECT_EQ(j["pieces"][0], "The");
  EXPECT_EQ(j["pieces"].back(), "<|im_start|>");
}

TEST(TokenizeCli, NoSpecialTreatsSpecialTextAsText) {
  REQUIRE_MODEL();
  auto r = run_metro({"tokenize", "-m", metro::testing::default_model_path(), "--json", "--no-special",
                      "<|im_start|>"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>();
  EXPECT_GT(ids.size(), 1u);
  for (int32_t id : ids) EXPECT_NE(id, 1);
}

TEST(TokenizeCli, ReadsFileAndSentencePieceVocab) {
  TempFile text(".txt");
  text.write(std::string("Trains and stations\n"));
  auto r = run_metro({"tokenize", "-m", metro::testing::source_path("tests/fixtures/tokenizer/tiny_spm.gguf"),
                      "--json", "--file", text.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto ids = nlohmann::json::parse(r.out)["ids"].get<std::vector<int32_t>>();
  const auto& tok = metro::testing::tiny_spm_tokenizer();
  EXPECT_EQ(ids, tok.encode("Trains and stations\n", true, true));
  EXPECT_EQ(ids.front(), 1);  // BOS: this vocabulary adds one
}

TEST(TokenizeCli, UsageAndLoadErrors) {
  auto none = run_metro({"tokenize", "-m", "x.gguf"});
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_NE(none.err.find("TEXT or --file"), std::string::npos) << none.err;

  auto missing = run_metro({"tokenize", "-m", "/definitely/not/here.gguf", "hi"});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.signal, 0);
  // The command line names the whole path the user typed (the library's own message, which
  // may reach HTTP clients elsewhere, names the base name only).
  EXPECT_NE(missing.err.find("'/definitely/not/here.gguf': cannot open 'here.gguf'"), std::string::npos)
      << missing.err;

  // A valid GGUF without a tokenizer: one line naming what is missing.
  TempFile bad;
  bad.write(metro::testing::small_valid_gguf());
  auto r = run_metro({"tokenize", "-m", bad.path(), "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("tokenizer.ggml.model"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;

  auto no_file = run_metro({"tokenize", "-m", bad.path(), "--file", "/definitely/not/here.txt"});
  EXPECT_EQ(no_file.exit_code, 1);
}

}  // namespace
}  // namespace metro

namespace metro {
namespace {

TEST(TokenizeCli, InspectWarnsAboutUnknownPreTokenizer) {
  auto spec = metro::testing::byte_level_spec({});
  spec.pre = "martian";
  TempFile f;
  f.write(metro::testing::vocab_gguf(spec));
  auto r = metro::testing::run_metro({"inspect", f.path()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("pre martian"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("unknown pre-tokenizer"), std::string::npos) << r.out;
  auto j = metro::testing::run_metro({"inspect", f.path(), "--json"});
  EXPECT_EQ(nlohmann::json::parse(j.out)["tokenizer"]["pre_known"], false);
  if (metro::testing::have_default_model()) {
    auto smol = metro::testing::run_metro({"inspect", metro::testing::default_model_path()});
    EXPECT_EQ(smol.out.find("unknown pre-tokenizer"), std::string::npos) << smol.out;
  }
}

}  // namespace
}  // namespace metro
