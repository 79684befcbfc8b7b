// libFuzzer target: chat templates are code from untrusted model files. Parsing any bytes as
// a template and rendering it against a fixed conversation must never crash, leak, read out
// of bounds or hang; every failure is an error Status. The sandbox bounds are lowered so
// that each input runs in milliseconds; they are what keeps hostile inputs finite.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tokenizer/chat_template.h"

namespace {

using nlohmann::ordered_json;

const ordered_json& conversation() {
  static const ordered_json messages = ordered_json::parse(R"([
    {"role": "system", "content": "You are helpful."},
    {"role": "user", "content": "Hi there \u00e9\u65e5\ud83d\ude00"},
    {"role": "assistant", "content": null, "tool_calls": [
      {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
    {"role": "tool", "name": "get_weather", "content": "21C"},
    {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "two"}]}
  ])");
  return messages;
}

const ordered_json& tools() {
  static const ordered_json t = ordered_json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "Weather",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                    "required": ["city"]}}}
  ])");
  return t;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  metro::tokenizer::ChatTemplateLimits limits;
  limits.max_steps = 20'000;
  limits.max_output_bytes = 1 << 16;
  limits.max_recursion_depth = 128;
  limits.max_render_ms = 0;  // deterministic; libFuzzer's -timeout catches real hangs
  auto t = metro::tokenizer::ChatTemplate::parse(std::string(reinterpret_cast<const char*>(data), size), limits);
  if (!t.ok()) return 0;
  metro::tokenizer::ChatTemplateOptions opts;
  opts.add_generation_prompt = (size & 1) != 0;
  opts.bos_token = "<s>";
  opts.eos_token = "</s>";
  if (size & 2) opts.tools = tools();
  opts.now = [] { return std::chrono::system_clock::time_point(std::chrono::seconds(1721995200)); };
  opts.local_time = false;
  auto out = t->render(conversation(), opts);
  if (out.ok()) {
    volatile size_t sink = out->size();
    (void)sink;
  }
  return 0;
}
