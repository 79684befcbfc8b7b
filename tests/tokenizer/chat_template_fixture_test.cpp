// Golden renders: every case in tests/fixtures/chat_templates/expected.json (templates
// written after the Llama 3 / 3.1, Qwen2.5, Gemma, Mistral and Phi-3 families, SmolLM2's own
// template, and a constructs template) rendered by metro must equal what Python jinja2
// rendered with Hugging Face's settings (make_expected.py; see the folder's README).
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "support/test_util.h"
#include "tokenizer/chat_template.h"

namespace metro::tokenizer {
namespace {

using nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string fixture_path(const std::string& name) {
  return testing::source_path("tests/fixtures/chat_templates/" + name);
}

const ordered_json& expected_cases() {
  static const ordered_json cases = [] {
    const std::string text = read_file(fixture_path("expected.json"));
    return text.empty() ? ordered_json::array() : ordered_json::parse(text).at("cases");
  }();
  return cases;
}

class ChatTemplateGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateGolden, MatchesJinja2) {
  const std::string file = GetParam() + ".jinja";
  const std::string source = read_file(fixture_path("templates/" + file));
  ASSERT_FALSE(source.empty()) << "missing fixture " << file;
  auto t = ChatTemplate::parse(source);
  ASSERT_TRUE(t.ok()) << t.status().message();

  int n = 0;
  for (const ordered_json& c : expected_cases()) {
    if (c.at("template") != file) continue;
    ++n;
    SCOPED_TRACE(c.at("name").get<std::string>());
    ChatTemplateOptions opts;
    opts.add_generation_prompt = c.at("add_generation_prompt").get<bool>();
    opts.bos_token = c.at("bos_token").get<std::string>();
    opts.eos_token = c.at("eos_token").get<std::string>();
    opts.tools = c.at("tools");
    opts.extra_context = c.at("extra");
    opts.local_time = false;
    opts.now = [] {  // 2024-07-26 12:00:00, the reference's fixed datetime.now()
      return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200));
    };
    auto out = t->render(c.at("messages"), opts);
    const ordered_json& expected = c.at("expected");
    if (expected.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ(*out, expected.at("output").get<std::string>());
    } else {
      ASSERT_FALSE(out.ok()) << "expected an error, rendered:\n" << *out;
      if (expected.at("raised").get<bool>()) {
        EXPECT_EQ(out.status().code(), ErrorCode::kInvalidArgument);
        EXPECT_EQ(out.status().message(), expected.at("error").get<std::string>());
      }
    }
  }
  EXPECT_GT(n, 10) << "too few cases for " << file;
}

INSTANTIATE_TEST_SUITE_P(Families, ChatTemplateGolden,
                         ::testing::Values("smollm2", "llama3", "llama31_tools", "qwen25_tools",
                                           "gemma", "mistral", "mistral_v1", "phi3", "constructs"));

TEST(ChatTemplateGoldenFiles, EveryCaseHasAKnownTemplate) {
  const std::set<std::string> known = {"smollm2.jinja", "llama3.jinja", "llama31_tools.jinja",
                                       "qwen25_tools.jinja", "gemma.jinja", "mistral.jinja",
                                       "mistral_v1.jinja", "phi3.jinja", "constructs.jinja"};
  ASSERT_GT(expected_cases().size(), 100u);
  for (const ordered_json& c : expected_cases()) {
    EXPECT_TRUE(known.count(c.at("template").get<std::string>())) << c.at("name");
  }
}

TEST(ChatTemplateGoldenFiles, SmolLM2FixtureIsTheModelsTemplate) {
  REQUIRE_MODEL();
  auto file = gguf::File::open(testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(t->source(), read_file(fixture_path("templates/smollm2.jinja")));
}

TEST(ChatTemplateGoldenFiles, ContentPartsDetection) {
  // Gemma's template iterates parts itself; the others expect strings.
  const std::map<std::string, bool> expect = {{"gemma", true}, {"llama3", false},
                                              {"qwen25_tools", false}, {"constructs", true}};
  for (const auto& [name, parts] : expect) {
    auto t = ChatTemplate::parse(read_file(fixture_path("templates/" + name + ".jinja")));
    ASSERT_TRUE(t.ok()) << name << ": " << t.status().message();
    EXPECT_EQ(t->renders_content_parts(), parts) << name;
  }
}

}  // namespace
}  // namespace metro::tokenizer

namespace metro::tokenizer {
namespace {

// Language conformance: tests/fixtures/chat_templates/snippets.json holds small templates
// (whitespace control, literals, operators, scoping, loops, macros, filters, tests, methods,
// undefined values, run-time and syntax errors) with jinja2's result for each.
TEST(ChatTemplateSnippets, MatchJinja2) {
  const std::string text = read_file(fixture_path("snippets.json"));
  ASSERT_FALSE(text.empty());
  const ordered_json doc = ordered_json::parse(text);
  const ordered_json& ctx = doc.at("context");
  ChatTemplateOptions opts;
  opts.add_generation_prompt = ctx.at("add_generation_prompt").get<bool>();
  opts.bos_token = ctx.at("bos_token").get<std::string>();
  opts.eos_token = ctx.at("eos_token").get<std::string>();
  opts.tools = ctx.at("tools");
  opts.extra_context = ordered_json::object();
  for (auto it = ctx.begin(); it != ctx.end(); ++it) {
    if (it.key() != "messages" && it.key() != "tools" && it.key() != "documents" &&
        it.key() != "add_generation_prompt" && it.key() != "bos_token" && it.key() != "eos_token") {
      opts.extra_context[it.key()] = it.value();
    }
  }
  opts.local_time = false;
  opts.now = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200)); };

  int n = 0;
  for (const ordered_json& c : doc.at("snippets")) {
    ++n;
    const std::string src = c.at("template").get<std::string>();
    SCOPED_TRACE("template: " + src);
    const ordered_json& expected = c.at("expected");
    auto t = ChatTemplate::parse(src);
    if (expected.value("stage", "") == "parse") {
      EXPECT_FALSE(t.ok()) << "jinja2 refused it: " << expected.at("error").get<std::string>();
      continue;
    }
    ASSERT_TRUE(t.ok()) << t.status().message();
    auto out = t->render(ctx.at("messages"), opts);
    if (expected.contains("output")) {
      ASSERT_TRUE(out.ok()) << out.status().message();
      EXPECT_EQ(*out, expected.at("output").get<std::string>());
      continue;
    }
    EXPECT_FALSE(out.ok()) << "jinja2 failed with: " << expected.at("error").get<std::string>()
                           << "\nmetro rendered: " << *out;
    if (!out.ok() && expected.value("raised", false)) {
      EXPECT_EQ(out.status().message(), expected.at("error").get<std::string>());
    }
  }
  EXPECT_GT(n, 150);
}

}  // namespace
}  // namespace metro::tokenizer
