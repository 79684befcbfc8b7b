// Tool calling: the format read off each chat template, the request's tool fields, the
// grammar of the calls per format, the parsing of outputs (whole and streamed), the OpenAI
// shapes of the answer, and tools and tool calls through the templates.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <sstream>

#include "engine/engine_test_util.h"
#include "grammar/grammar_test_util.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "support/test_util.h"
#include "tokenizer/chat_template.h"

namespace metro::server {
namespace {

using nlohmann::json;
using OJson = nlohmann::ordered_json;

std::string read_template(const std::string& name) {
  std::ifstream in(testing::source_path("tests/fixtures/chat_templates/templates/" + name), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A Mistral-style template reduced to what the format detection reads.
constexpr const char* kMistralTools =
    "{%- if tools %}[AVAILABLE_TOOLS]{{ tools|tojson }}[/AVAILABLE_TOOLS]{%- endif %}"
    "{%- for m in messages %}{%- if m.tool_calls %}[TOOL_CALLS]{{ m.tool_calls|tojson }}{%- endif %}{%- endfor %}";

TEST(ToolFormat, ReadOffTheTemplate) {
  EXPECT_EQ(detect_tool_format(read_template("qwen25_tools.jinja")), ToolFormat::kHermes);
  EXPECT_EQ(detect_tool_format(read_template("llama31_tools.jinja")), ToolFormat::kLlama3);
  EXPECT_EQ(detect_tool_format(kMistralTools), ToolFormat::kMistral);
  EXPECT_EQ(detect_tool_format(read_template("smollm2.jinja")), ToolFormat::kGeneric);
  EXPECT_EQ(detect_tool_format(read_template("mistral.jinja")), ToolFormat::kGeneric);  // renders no tools
}

json weather_body() {
  return json::parse(R"({
    "tools": [
      {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"},
          "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
      {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
        "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}]})");
}

std::optional<ToolRequest> parsed(const json& body, ToolFormat f = ToolFormat::kHermes) {
  std::optional<ToolRequest> t;
  auto err = parse_tool_request(body, nullptr, f, &t);
  EXPECT_FALSE(err) << err->message;
  return t;
}

TEST(ToolRequest, ModesFromToolChoice) {
  json b = weather_body();
  auto t = parsed(b);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->mode, ToolRequest::Mode::kAuto);
  EXPECT_EQ(t->functions.size(), 2u);
  EXPECT_TRUE(t->parallel);
  EXPECT_FALSE(t->constrained_from_start());
  EXPECT_TRUE(parsed(b, ToolFormat::kGeneric)->constrained_from_start());
  b["tool_choice"] = "required";
  b["parallel_tool_calls"] = false;
  t = parsed(b);
  EXPECT_EQ(t->mode, ToolRequest::Mode::kRequired);
  EXPECT_FALSE(t->parallel);
  EXPECT_TRUE(t->constrained_from_start());
  b["tool_choice"] = json::parse(R"({"type": "function", "function": {"name": "get_time"}})");
  t = parsed(b);
  EXPECT_EQ(t->mode, ToolRequest::Mode::kRequired);
  EXPECT_TRUE(t->named);
  ASSERT_EQ(t->functions.size(), 1u);
  EXPECT_EQ(t->functions[0].name, "get_time");
  b["tool_choice"] = "none";
  t = parsed(b);
  EXPECT_FALSE(t->parses());
  EXPECT_FALSE(parsed(json::object()));  // no tools
}

TEST(ToolRequest, MalformedFieldsAreRefusedNamingThem) {
  struct Case {
    const char* body;
    const char* param;
  };
  const Case cases[] = {
      {R"({"tools": {}})", "tools"},
      {R"({"tools": [{"type": "code", "function": {"name": "f"}}]})", "tools[0].type"},
      {R"({"tools": [{"type": "function", "function": {"name": "bad name"}}]})", "tools[0].function.name"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}, {"type": "function", "function": {"name": "f"}}]})",
       "tools[1].function.name"},
      {R"({"tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})",
       "tools[0].function.parameters"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "sometimes"})", "tool_choice"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}})",
       "tool_choice.function.name"},
      {R"({"tool_choice": "required"})", "tool_choice"},
      {R"({"tools": [{"type": "function", "function": {"name": "f"}}], "parallel_tool_calls": "yes"})",
       "parallel_tool_calls"},
  };
  for (const Case& c : cases) {
    std::optional<ToolRequest> t;
    auto err = parse_tool_request(json::parse(c.body), nullptr, ToolFormat::kHermes, &t);
    ASSERT_TRUE(err) << c.body;
    EXPECT_EQ(err->status, 400) << c.body;
    EXPECT_EQ(err->param, c.param) << c.body << ": " << err->message;
  }
}

bool matches(const ToolRequest& t, const std::string& text) {
  auto g = tool_call_grammar(t);
  EXPECT_TRUE(g.ok()) << g.status().message();
  auto c = grammar::CompiledGrammar::compile(std::move(*g), grammar::test_support::byte_trie());
  EXPECT_TRUE(c.ok());
  return grammar::test_support::matches(*c, text);
}

TEST(ToolGrammar, EachFormatHoldsNamesAndArguments) {
  json b = weather_body();
  b["tool_choice"] = "required";
  const std::string paris = R"({"name": "get_weather", "arguments": {"city": "Paris"}})";
  const std::string tokyo = R"({"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}})";

  ToolRequest h = *parsed(b, ToolFormat::kHermes);
  EXPECT_TRUE(matches(h, "<tool_call>\n" + paris + "\n</tool_call>"));
  EXPECT_TRUE(matches(h, "<tool_call>\n" + paris + "\n</tool_call>\n<tool_call>\n" + tokyo + "\n</tool_call>"));
  EXPECT_FALSE(matches(h, "<tool_call>\n" + std::string(R"({"name": "get_wetter", "arguments": {"city": "Paris"}})") +
                              "\n</tool_call>"));
  EXPECT_FALSE(matches(h, "<tool_call>\n" + std::string(R"({"name": "get_weather", "arguments": {"city": 5}})") +
                              "\n</tool_call>"));
  EXPECT_FALSE(matches(h, "<tool_call>\n" + std::string(R"({"name": "get_weather", "arguments": {}})") +
                              "\n</tool_call>"));  // city is required
  EXPECT_FALSE(matches(h, "Sure! <tool_call>\n" + paris + "\n</tool_call>"));  // required: calls only
  h.parallel = false;
  EXPECT_FALSE(matches(h, "<tool_call>\n" + paris + "\n</tool_call>\n<tool_call>\n" + tokyo + "\n</tool_call>"));

  ToolRequest m = *parsed(b, ToolFormat::kMistral);
  EXPECT_TRUE(matches(m, "[TOOL_CALLS][" + paris + ", " + tokyo + "]"));
  EXPECT_FALSE(matches(m, "[TOOL_CALLS]" + paris));

  ToolRequest l = *parsed(b, ToolFormat::kLlama3);
  EXPECT_TRUE(matches(l, R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "c"}})"));
  EXPECT_FALSE(matches(l, R"({"name": "get_weather", "parameters": {"city": "Paris", "unit": "k"}})"));

  ToolRequest g = *parsed(b, ToolFormat::kGeneric);
  EXPECT_TRUE(matches(g, "{\"tool_calls\": [" + paris + "]}"));
  EXPECT_FALSE(matches(g, R"({"response": "It is sunny."})"));  // required
  b["tool_choice"] = "auto";
  g = *parsed(b, ToolFormat::kGeneric);
  EXPECT_TRUE(matches(g, R"({"response": "It is sunny."})"));
  EXPECT_TRUE(matches(g, "{\"tool_calls\": [" + paris + ", " + tokyo + "]}"));

  // A parameters schema the grammar cannot hold is refused, naming the function.
  json bad = weather_body();
  bad["tools"][1]["function"]["parameters"] = json::parse(R"({"type": "integer", "multipleOf": 3})");
  auto err = tool_call_grammar(*parsed(bad));
  ASSERT_FALSE(err.ok());
  EXPECT_NE(err.status().message().find("tools[1].function.parameters"), std::string::npos) << err.status().message();
}

TEST(ToolOutput, ParsedPerFormatAndWhatIsNotACallStaysText) {
  auto one = [](const ParsedToolOutput& p, const std::string& name, const json& args) {
    ASSERT_EQ(p.calls.size(), 1u) << p.content;
    EXPECT_EQ(p.calls[0].name, name);
    EXPECT_EQ(json::parse(p.calls[0].arguments), args);
  };
  const json paris = {{"city", "Paris"}};
  one(parse_tool_output(ToolFormat::kHermes,
                        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
                        "</tool_call>"),
      "get_weather", paris);
  EXPECT_EQ(parse_tool_output(ToolFormat::kHermes, "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", "
                                                   "\"arguments\": {}}\n</tool_call>")
                .content,
            "Let me check.");
  one(parse_tool_output(ToolFormat::kLlama3, R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})"),
      "get_weather", paris);
  one(parse_tool_output(ToolFormat::kMistral, R"([TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}])"),
      "get_weather", paris);
  one(parse_tool_output(ToolFormat::kGeneric,
                        R"({"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]})"),
      "get_weather", paris);
  // String arguments (some models write them so) pass through as the JSON text they hold.
  auto s = parse_tool_output(ToolFormat::kHermes,
                             "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>");
  ASSERT_EQ(s.calls.size(), 1u);
  EXPECT_EQ(s.calls[0].arguments, R"({"a": 1})");
  // An array cut short (the length bound) keeps its complete calls.
  auto cut = parse_tool_output(ToolFormat::kGeneric, R"({"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b)");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].name, "a");
  EXPECT_EQ(cut.content, "");
  auto g = parse_tool_output(ToolFormat::kGeneric, R"({"response": "It is sunny."})");
  EXPECT_TRUE(g.calls.empty());
  EXPECT_EQ(g.content, "It is sunny.");
  for (const char* text : {"<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}\n</tool_call>",  // cut JSON
                           "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                       // no name
                           "plain words", "{\"name\": 5}"}) {
    for (ToolFormat f : {ToolFormat::kHermes, ToolFormat::kLlama3, ToolFormat::kMistral, ToolFormat::kGeneric}) {
      auto p = parse_tool_output(f, text);
      EXPECT_TRUE(p.calls.empty()) << tool_format_name(f) << ": " << text;
      EXPECT_EQ(p.content, text) << tool_format_name(f);
    }
  }
}

// What a stream gave out, put together as a client does.
ParsedToolOutput assemble(const ToolStreamPieces& pieces, ParsedToolOutput acc = {}) {
  for (const ToolStreamPiece& p : pieces) {
    switch (p.kind) {
      case ToolStreamPiece::Kind::kContent:
        acc.content += p.text;
        break;
      case ToolStreamPiece::Kind::kCall:
        acc.calls.push_back(ToolCall{p.text, ""});
        break;
      case ToolStreamPiece::Kind::kArguments:
        EXPECT_FALSE(acc.calls.empty()) << "arguments before any call";
        if (!acc.calls.empty()) acc.calls.back().arguments += p.text;
        break;
    }
  }
  return acc;
}

ParsedToolOutput stream_in_pieces(ToolFormat format, std::string_view text, size_t piece) {
  ToolCallStream s(format);
  ParsedToolOutput acc;
  for (size_t i = 0; i < text.size(); i += piece) acc = assemble(s.feed(text.substr(i, piece)), std::move(acc));
  return assemble(s.finish(), std::move(acc));
}

// The streamed reading gives what the whole reading gives, however the text is cut; a call
// cut short by the length bound has gone out in part (the whole reading drops it).
TEST(ToolOutput, StreamedInAnyPiecesEqualsTheWhole) {
  struct Case {
    ToolFormat format;
    std::string text;
    bool cut = false;
  };
  const Case cases[] = {
      {ToolFormat::kHermes,
       "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
       "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>"},
      {ToolFormat::kHermes, "No tools needed: it is 4 < 5 and <tool is not a call."},
      {ToolFormat::kHermes, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa", true},
      // A string argument holding the close, arguments with odd spacing, members in another
      // order (read whole), a block that is not a call (text).
      {ToolFormat::kHermes,
       "<tool_call>{\"name\": \"note\", \"arguments\": {\"text\": \"</tool_call> }]\\\" {\"}}</tool_call>"},
      {ToolFormat::kHermes, "<tool_call>\n{ \"name\" :\"f\" ,\n \"arguments\":{\"a\":  [1, {\"b\": 2}]}  }\n</tool_call>"},
      {ToolFormat::kHermes, "<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call> then text"},
      {ToolFormat::kHermes, "<tool_call>{\"x\": 1}</tool_call> and <tool_call>plain</tool_call>."},
      {ToolFormat::kGeneric,
       R"({"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y": "]} \" {"}}]})"},
      {ToolFormat::kGeneric, R"({"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "argu)", true},
      {ToolFormat::kGeneric, R"({"tool_calls": [{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {"y)",
       true},
      {ToolFormat::kGeneric, R"({"response": "plain [words] {here}"})"},
      {ToolFormat::kGeneric, R"({"response": "caf\u00e9 \ud83d\ude00 \"q\" \\ \n"})"},
      {ToolFormat::kGeneric, R"({"response": "cut sh)", true},
      {ToolFormat::kGeneric, R"({"tool_call": {"name": "a", "arguments": {}}})"},
      {ToolFormat::kMistral, R"(Sure.[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"s": "[x"}}])"},
      {ToolFormat::kMistral, R"([TOOL_CALLS] [{"name": "a", "arguments": {}}, {"na)", true},
      {ToolFormat::kMistral, R"([TOOL_CALLS] {"name": "a", "arguments": {"k": true}})"},
      {ToolFormat::kLlama3, R"(<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}})"},
      {ToolFormat::kLlama3, R"(  {"name": "get_weather", "parameters": {"city": "Pa)", true},
      {ToolFormat::kLlama3, "Paris is sunny {\"name\": \"x\"}"},
  };
  for (const Case& c : cases) {
    const ParsedToolOutput whole = parse_tool_output(c.format, c.text);
    const ParsedToolOutput at_once = stream_in_pieces(c.format, c.text, c.text.size());
    for (size_t piece = 1; piece <= 7; ++piece) {
      const ParsedToolOutput got = stream_in_pieces(c.format, c.text, piece);
      // However the text is cut, the stream gives the same.
      EXPECT_EQ(got.content, at_once.content) << "piece " << piece << ": " << c.text;
      ASSERT_EQ(got.calls.size(), at_once.calls.size()) << "piece " << piece << ": " << c.text;
      for (size_t k = 0; k < got.calls.size(); ++k) {
        EXPECT_EQ(got.calls[k].name, at_once.calls[k].name);
        EXPECT_EQ(got.calls[k].arguments, at_once.calls[k].arguments);
      }
    }
    // And what the whole reading gives: the same calls (the streamed arguments the text the
    // model wrote), and the same content unless a call was cut short.
    if (!c.cut) {
      EXPECT_EQ(at_once.content, whole.content) << c.text;
    }
    ASSERT_GE(at_once.calls.size(), whole.calls.size()) << c.text;
    EXPECT_LE(at_once.calls.size(), whole.calls.size() + (c.cut ? 1 : 0)) << c.text;
    for (size_t k = 0; k < whole.calls.size(); ++k) {
      EXPECT_EQ(at_once.calls[k].name, whole.calls[k].name) << c.text;
      EXPECT_EQ(at_once.calls[k].arguments, whole.calls[k].arguments) << c.text;
    }
  }
  // The whole reading keeps the model's own text of the arguments.
  auto odd = parse_tool_output(ToolFormat::kHermes,
                               "<tool_call>\n{ \"name\" :\"f\" ,\n \"arguments\":{\"a\":  [1, {\"b\": 2}]}  }\n</tool_call>");
  ASSERT_EQ(odd.calls.size(), 1u);
  EXPECT_EQ(odd.calls[0].arguments, "{\"a\":  [1, {\"b\": 2}]}");
  auto held = parse_tool_output(ToolFormat::kHermes,
                                "<tool_call>{\"name\": \"note\", \"arguments\": {\"text\": \"</tool_call>\"}}</tool_call>");
  ASSERT_EQ(held.calls.size(), 1u);
  EXPECT_EQ(json::parse(held.calls[0].arguments)["text"], "</tool_call>");
  EXPECT_EQ(parse_tool_output(ToolFormat::kGeneric, R"({"response": "cut sh)").content, "cut sh");
  EXPECT_EQ(parse_tool_output(ToolFormat::kGeneric, R"({"response": "caf\u00e9 \ud83d\ude00"})").content,
            "caf\xC3\xA9 \xF0\x9F\x98\x80");

  // Content before a call goes out before the call is complete.
  ToolCallStream s(ToolFormat::kHermes);
  EXPECT_EQ(assemble(s.feed("Checking. <tool")).content, "Checking.");  // the space waits: a call may follow
  EXPECT_TRUE(s.feed("_call>\n{\"name\": \"f").empty());
  // A call starts as soon as its name is read; its arguments go out as they are written.
  ToolStreamPieces p = s.feed("\", \"arguments\": {\"city\": \"Pa");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].kind, ToolStreamPiece::Kind::kCall);
  EXPECT_EQ(p[0].text, "f");
  EXPECT_EQ(p[1].kind, ToolStreamPiece::Kind::kArguments);
  EXPECT_EQ(p[1].text, "{\"city\": \"Pa");
  p = s.feed("ris\"}}\n</tool_call>\nDone.");
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].kind, ToolStreamPiece::Kind::kArguments);
  EXPECT_EQ(p[0].text, "ris\"}");
  EXPECT_EQ(p[1].kind, ToolStreamPiece::Kind::kContent);
  EXPECT_EQ(p[1].text, "Done.");
  // The generic format's response streams as its string is decoded; an escape cut short waits.
  ToolCallStream g(ToolFormat::kGeneric);
  EXPECT_EQ(assemble(g.feed("{\"response\": \"It is")).content, "It is");
  EXPECT_EQ(assemble(g.feed(" caf\\u00")).content, " caf");
  EXPECT_EQ(assemble(g.feed("e9\\n\"}")).content, "\xC3\xA9\n");
  EXPECT_TRUE(g.finish().empty());
  // Llama 3: a message that does not open with a call streams as text at once.
  ToolCallStream l(ToolFormat::kLlama3);
  EXPECT_TRUE(l.feed("  ").empty());
  EXPECT_EQ(assemble(l.feed("Paris is")).content, "  Paris is");
  EXPECT_EQ(assemble(l.feed(" sunny")).content, " sunny");
}

class ToolResponseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    REQUIRE_MODEL();
    tok_ = testing::default_model().tokenizer.get();
  }
  engine::Event delta(std::string text) {
    engine::Event e;
    e.kind = engine::Event::Kind::kDelta;
    e.text = std::move(text);
    return e;
  }
  engine::Event finish() {
    engine::Event e;
    e.kind = engine::Event::Kind::kFinish;
    e.reason = engine::FinishReason::kStop;
    return e;
  }
  engine::Event done() {
    engine::Event e;
    e.kind = engine::Event::Kind::kDone;
    return e;
  }
  ResponseSpec spec(bool stream) {
    ResponseSpec s;
    s.endpoint = Endpoint::kChatCompletions;
    s.stream = stream;
    s.model = "m";
    json b = weather_body();
    s.tools = std::make_shared<const ToolRequest>(*parsed(b, ToolFormat::kHermes));
    return s;
  }
  const tokenizer::Tokenizer* tok_ = nullptr;
};

const char* kTwoCalls =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"zone\": \"UTC\"}}\n</tool_call>";

TEST_F(ToolResponseTest, ABodyCarriesToolCallsAndFinishReason) {
  ResponseFormatter f(spec(false), *tok_, 1, "chatcmpl-t", 1);
  std::string out;
  f.on_event(0, delta(kTwoCalls), &out);
  f.on_event(0, finish(), &out);
  f.on_event(0, done(), &out);
  const json body = json::parse(f.finish());
  const json& choice = body["choices"][0];
  EXPECT_EQ(choice["finish_reason"], "tool_calls");
  EXPECT_TRUE(choice["message"]["content"].is_null());
  const json& calls = choice["message"]["tool_calls"];
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["type"], "function");
  EXPECT_EQ(calls[0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_NE(calls[0]["id"], calls[1]["id"]);
  EXPECT_EQ(calls[0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(calls[0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(calls[1]["function"]["name"], "get_time");
}

TEST_F(ToolResponseTest, AStreamCarriesEachCallAsOpenAiDoes) {
  ResponseFormatter f(spec(true), *tok_, 1, "chatcmpl-s", 1);
  std::string out;
  const std::string text = std::string("Checking.\n") + kTwoCalls;
  for (size_t i = 0; i < text.size(); i += 5) f.on_event(0, delta(text.substr(i, 5)), &out);
  f.on_event(0, finish(), &out);
  f.on_event(0, done(), &out);
  out += f.finish();
  // Accumulated as the openai SDK does: by tool call index.
  std::string content;
  std::map<int, json> calls;
  std::map<int, int> fragments;
  std::string finish_reason;
  for (size_t pos = 0; pos < out.size();) {
    const size_t end = out.find("\n\n", pos);
    const std::string data = out.substr(pos + 6, end - pos - 6);
    pos = end + 2;
    if (data == "[DONE]") break;
    const json ev = json::parse(data);
    const json& c = ev["choices"][0];
    if (!c["finish_reason"].is_null()) finish_reason = c["finish_reason"];
    const json& d = c["delta"];
    if (d.contains("content") && d["content"].is_string()) content += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& tc : d["tool_calls"]) {
        json& acc = calls[tc["index"].get<int>()];
        if (tc.contains("id")) {
          EXPECT_FALSE(acc.contains("id")) << "a call is named once";
          acc["id"] = tc["id"];
          acc["name"] = tc["function"]["name"];
          acc["arguments"] = "";
        }
        acc["arguments"] = acc["arguments"].get<std::string>() + tc["function"]["arguments"].get<std::string>();
        if (!tc.contains("id")) ++fragments[tc["index"].get<int>()];
      }
    }
  }
  EXPECT_EQ(content, "Checking.");
  EXPECT_EQ(finish_reason, "tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["name"], "get_weather");
  EXPECT_EQ(calls[0]["arguments"], "{\"city\": \"Paris\"}");  // the model's text, in pieces as it came
  EXPECT_GT(fragments[0], 1);
  EXPECT_EQ(calls[1]["name"], "get_time");
  EXPECT_EQ(calls[1]["arguments"], "{\"zone\": \"UTC\"}");
}

// Tools and tool calls reach the template: the generic format describes them in a system
// message, a native template renders them and the calls' arguments as objects.
TEST(ToolPrompt, ToolsAndCallsGoThroughTheTemplate) {
  REQUIRE_MODEL();
  const auto& tok = *testing::default_model().tokenizer;
  json body = weather_body();
  body["messages"] = json::parse(R"([
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}])");
  auto render = [&](const std::string& source) {
    auto tmpl = tokenizer::ChatTemplate::parse(source);
    EXPECT_TRUE(tmpl.ok()) << tmpl.status().message();
    if (!tmpl.ok()) return std::string();
    PromptContext ctx;
    ctx.tokenizer = &tok;
    ctx.chat_template = &*tmpl;
    ctx.n_ctx = 8192;
    const ToolFormat f = detect_tool_format(source);
    std::optional<ToolRequest> t;
    EXPECT_FALSE(parse_tool_request(body, nullptr, f, &t));
    auto ids = detail::chat_prompt(body, ctx, t ? &*t : nullptr);
    EXPECT_TRUE(ids.ok()) << ids.error().message;
    return ids.ok() ? tok.decode(*ids) : std::string();
  };
  const std::string generic = render(read_template("smollm2.jinja"));
  EXPECT_NE(generic.find("get_weather: Weather in a city"), std::string::npos) << generic;
  EXPECT_NE(generic.find("{\"tool_calls\": [{\"name\": <tool name>"), std::string::npos) << generic;
  // The assistant's earlier call, in the generic format's words, and the tool's result.
  EXPECT_NE(generic.find(R"({"tool_calls":[{"name":"get_weather","arguments":{"city":"Paris"}}]})"), std::string::npos)
      << generic;
  EXPECT_NE(generic.find("sunny, 21 C"), std::string::npos);
  const std::string hermes = render(read_template("qwen25_tools.jinja"));
  EXPECT_NE(hermes.find("\"name\": \"get_weather\""), std::string::npos) << hermes;
  EXPECT_NE(hermes.find(R"("arguments": {"city": "Paris"})"), std::string::npos) << hermes;  // an object, not a string
  EXPECT_NE(hermes.find("<tool_response>\nsunny, 21 C\n</tool_response>"), std::string::npos) << hermes;
  EXPECT_EQ(hermes.find("You may call one or more of these tools"), std::string::npos);  // the template's own words
}

}  // namespace
}  // namespace metro::server
