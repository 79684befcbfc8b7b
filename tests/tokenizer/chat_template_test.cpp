// ChatTemplate API: the SmolLM2 template from the real GGUF file, the ChatML fallback,
// options, content parts and error mapping. Reference renders for these expectations came
// from Python jinja2 with Hugging Face's settings (tests/fixtures/chat_templates/README.md).
#include "tokenizer/chat_template.h"

#include <thread>

#include <gtest/gtest.h>

#include "gguf/gguf.h"
#include "gguf/writer.h"
#include "support/test_util.h"

namespace metro::tokenizer {
namespace {

using nlohmann::ordered_json;

ordered_json msgs(std::initializer_list<std::pair<const char*, const char*>> turns) {
  ordered_json out = ordered_json::array();
  for (const auto& [role, content] : turns) out.push_back({{"role", role}, {"content", content}});
  return out;
}

TEST(ChatTemplate, SmolLM2TemplateFromModelFile) {
  REQUIRE_MODEL();
  auto file = gguf::File::open(testing::default_model_path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_FALSE(t->is_fallback());
  EXPECT_FALSE(t->renders_content_parts());
  EXPECT_EQ(t->default_bos_token(), "<|im_start|>");
  EXPECT_EQ(t->default_eos_token(), "<|im_end|>");

  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  auto out = t->render(msgs({{"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Write a haiku."}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
            "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
            "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n");

  opts.add_generation_prompt = false;
  out = t->render(msgs({{"system", "Be brief."}, {"user", "Hi"}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST(ChatTemplate, FallsBackToChatmlWithoutTemplate) {
  gguf::Writer w;
  w.add_string("general.architecture", "llama");
  w.add_string_array("tokenizer.ggml.tokens", {"<s>", "</s>", "x"});
  w.add_u32("tokenizer.ggml.bos_token_id", 0);
  w.add_u32("tokenizer.ggml.eos_token_id", 7);  // out of range: no default, no crash
  const auto bytes = w.serialize();
  auto file = gguf::File::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->is_fallback());
  EXPECT_EQ(t->source(), ChatTemplate::chatml_source());
  EXPECT_EQ(t->default_bos_token(), "<s>");
  EXPECT_EQ(t->default_eos_token(), "");
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  auto out = t->render(msgs({{"system", "S"}, {"user", "U"}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
}

// A Gemma file without a template gets Gemma's turns (the format of Gemma 3's own template):
// the system message leads the first user turn, the assistant's role is "model".
TEST(ChatTemplate, FallsBackToGemmaTurnsForGemmaFiles) {
  gguf::Writer w;
  w.add_string("general.architecture", "gemma3");
  w.add_string_array("tokenizer.ggml.tokens", {"<pad>", "<eos>", "<bos>"});
  w.add_u32("tokenizer.ggml.bos_token_id", 2);
  w.add_u32("tokenizer.ggml.eos_token_id", 1);
  const auto bytes = w.serialize();
  auto file = gguf::File::parse(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->is_fallback());
  ChatTemplateOptions opts;
  opts.add_generation_prompt = true;
  auto out = t->render(msgs({{"system", "Be brief."}, {"user", " Hi "}, {"assistant", "Hello!"}, {"user", "Why?"}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out,
            "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
            "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n");
  opts.add_generation_prompt = false;
  out = t->render(msgs({{"user", "U"}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<bos><start_of_turn>user\nU<end_of_turn>\n");
}

TEST(ChatTemplate, TemplateOfWrongTypeInFileIsAnError) {
  gguf::Writer w;
  w.add_u32("tokenizer.chat_template", 3);
  const auto bytes = w.serialize();
  auto file = gguf::File::parse(bytes);
  ASSERT_TRUE(file.ok());
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tokenizer.chat_template"), std::string::npos);
}

TEST(ChatTemplate, BrokenTemplateInFileIsAnErrorWithLocation) {
  gguf::Writer w;
  w.add_string("tokenizer.chat_template", "{% for m in messages %}\n{{ m.content }");
  const auto bytes = w.serialize();
  auto file = gguf::File::parse(bytes);
  ASSERT_TRUE(file.ok());
  auto t = ChatTemplate::from_gguf(*file);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().message();
}

TEST(ChatTemplate, ChatmlFlattensContentParts) {
  const ChatTemplate t = ChatTemplate::chatml();
  EXPECT_FALSE(t.renders_content_parts());
  ordered_json m = ordered_json::array();
  m.push_back({{"role", "user"},
               {"content", ordered_json::array({{{"type", "text"}, {"text", "one"}},
                                                {{"type", "image_url"}, {"image_url", "x"}},
                                                {{"type", "text"}, {"text", "two"}}})}});
  auto out = t.render(m, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>user\none\ntwo<|im_end|>\n");
}

TEST(ChatTemplate, TemplateThatIteratesPartsGetsTheList) {
  auto t = ChatTemplate::parse(
      "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_TRUE(t->renders_content_parts());
  ordered_json m = ordered_json::array();
  m.push_back({{"role", "user"}, {"content", ordered_json::array({{{"type", "text"}, {"text", "a"}},
                                                                 {{"type", "text"}, {"text", "b"}}})}});
  m.push_back({{"role", "user"}, {"content", "c"}});
  auto out = t->render(m, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "[a][b]c");
}

TEST(ChatTemplate, ChatMessageStructRendersLikeJson) {
  const ChatTemplate t = ChatTemplate::chatml();
  std::vector<ChatMessage> m(2);
  m[0].role = "user";
  m[0].content = "hi";
  m[1].role = "assistant";
  m[1].content_parts = ordered_json::array({{{"type", "text"}, {"text", "yo"}}});
  auto out = t.render(m, {});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n");
}

TEST(ChatTemplate, OptionsReachTheTemplate) {
  auto t = ChatTemplate::parse(
      "{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools is none }}|"
      "{{ documents is none }}|{{ flavour }}|{{ messages|length }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChatTemplateOptions opts;
  opts.bos_token = "<B>";
  opts.eos_token = "<E>";
  opts.extra_context = {{"flavour", "mint"}};
  auto out = t->render(msgs({{"user", "x"}}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<B>|<E>|False|True|True|mint|1");
  opts.tools = ordered_json::array({{{"name", "f"}}});
  opts.add_generation_prompt = true;
  opts.extra_context = {{"bos_token", "<override>"}};
  out = t->render(msgs({}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<override>|<E>|True|False|True||0");
}

TEST(ChatTemplate, RejectsNonArrayMessagesAndBadOptions) {
  const ChatTemplate t = ChatTemplate::chatml();
  EXPECT_FALSE(t.render(ordered_json::object(), {}).ok());
  ChatTemplateOptions opts;
  opts.extra_context = ordered_json::array();
  EXPECT_FALSE(t.render(msgs({}), opts).ok());
  opts = {};
  opts.tools = "not a list";
  EXPECT_FALSE(t.render(msgs({}), opts).ok());
}

TEST(ChatTemplate, RaiseExceptionGivesTheTemplatesMessage) {
  auto t = ChatTemplate::parse("{% if messages[0].role != 'user' %}{{ raise_exception('First must be user') }}{% endif %}ok");
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto out = t->render(msgs({{"assistant", "x"}}), {});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "First must be user");
  out = t->render(msgs({{"user", "x"}}), {});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "ok");
}

TEST(ChatTemplate, StrftimeNowUsesTheInjectedClock) {
  auto t = ChatTemplate::parse("{{ strftime_now('%d %b %Y %H:%M') }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  ChatTemplateOptions opts;
  opts.local_time = false;
  opts.now = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200)); };
  auto out = t->render(msgs({}), opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "26 Jul 2024 12:00");
}

TEST(ChatTemplate, RenderIsRepeatableAndIndependent) {
  auto t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  for (int i = 0; i < 3; ++i) {
    auto out = t->render(msgs({{"user", "a"}, {"user", "b"}}), {});
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, "2");  // namespaces do not survive between renders
  }
}

TEST(ChatTemplate, AcceptsPlainJsonAsWellAsOrderedJson) {
  const ChatTemplate t = ChatTemplate::chatml();
  nlohmann::json m = nlohmann::json::array();
  m.push_back({{"role", "user"}, {"content", "plain"}});
  ChatTemplateOptions opts;
  opts.tools = nlohmann::json::array();  // converts to ordered_json
  auto out = t.render(m, opts);
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(*out, "<|im_start|>user\nplain<|im_end|>\n");
}

TEST(ChatTemplate, ConcurrentRendersOfOneTemplateAgree) {
  auto t = ChatTemplate::parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content|length %}"
      "{{ loop.index }}:{{ m.content|upper }};{% endfor %}{{ ns.n }}{{ messages|tojson }}");
  ASSERT_TRUE(t.ok()) << t.status().message();
  const ordered_json m = msgs({{"user", "alpha"}, {"assistant", "beta"}, {"user", "gamma"}});
  auto expected = t->render(m, {});
  ASSERT_TRUE(expected.ok());
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int i = 0; i < 200; ++i) {
        auto out = t->render(m, {});
        if (!out.ok() || *out != *expected) ++mismatches[static_cast<size_t>(k)];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int n : mismatches) EXPECT_EQ(n, 0);
}

}  // namespace
}  // namespace metro::tokenizer
