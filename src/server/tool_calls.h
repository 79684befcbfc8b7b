// Tool calling on /v1/chat/completions: the request's `tools`, `tool_choice` and
// `parallel_tool_calls`, the grammar that holds the model's calls to the functions and their
// parameter schemas, and the parsing of its output back into OpenAI's `tool_calls`.
//
// A model writes tool calls in the format its chat template was trained with; metro reads
// the format off the template's source:
//
//   hermes   <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, one block per call
//            (Qwen2.5 and other templates that render `<tool_call>`)
//   llama3   {"name": "f", "parameters": {...}}, one call, the whole message (Llama 3.1 /
//            3.2 templates: `<|python_tag|>`, the `ipython` role)
//   mistral  [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (templates that render
//            `[TOOL_CALLS]`)
//   generic  any other template (it ignores `tools`): metro adds a system message that lists
//            the tools and asks for {"tool_calls": [{"name": "f", "arguments": {...}}]} or
//            {"response": "text"}, and constrains the output to exactly that.
//
// tool_choice `required` or a named function: the whole output is calls (to that function),
// arguments following each function's `parameters` schema. `auto`: the generic format
// constrains the output to calls or a response; the native formats leave the text free until
// the model opens a call (the format's trigger, e.g. `<tool_call>`), then constrain the call
// (Request::grammar_trigger). `none`: the tools are shown to the model, nothing is parsed.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "server/api_error.h"

namespace metro::server {

enum class ToolFormat : uint8_t { kGeneric, kHermes, kLlama3, kMistral };
const char* tool_format_name(ToolFormat f);
// The format a chat template renders tool calls in (generic when it renders none).
ToolFormat detect_tool_format(std::string_view template_source);

struct ToolFunction {
  std::string name;
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON schema (an object); {} when not given
};

// What a request's tool fields ask for.
struct ToolRequest {
  enum class Mode : uint8_t { kNone, kAuto, kRequired };
  ToolFormat format = ToolFormat::kGeneric;
  Mode mode = Mode::kAuto;
  std::vector<ToolFunction> functions;  // as sent (tool_choice naming one keeps only it)
  bool parallel = true;                 // parallel_tool_calls
  bool named = false;                   // tool_choice named a function
  // Whether the output is parsed into tool_calls (every mode but none).
  bool parses() const { return mode != Mode::kNone; }
  // Whether the output is constrained from its first byte (required, named, or the generic
  // format); else, under auto, from the format's trigger on.
  bool constrained_from_start() const { return mode == Mode::kRequired || format == ToolFormat::kGeneric; }
};

// `tools`, `tool_choice`, `parallel_tool_calls` of a chat body (`ordered` the same body with
// key order kept, or null). nullopt in *out: no tools (or tool_choice none with none given).
// 400 for malformed fields, unknown function names, duplicate names; a parameters schema
// the grammar cannot hold is refused when its grammar is built.
std::optional<ApiError> parse_tool_request(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                                           ToolFormat format, std::optional<ToolRequest>* out);

// The grammar of the calls a request allows: from the start of the output when
// constrained_from_start(), else from the trigger on (the grammar starts with it).
Expected<grammar::Grammar> tool_call_grammar(const ToolRequest& t);
// The text that opens a call in the native formats ("" for generic).
std::string_view tool_call_trigger(ToolFormat f);
// A key for the grammar cache: the format, mode and every function's name and schema.
std::string tool_grammar_key(const ToolRequest& t);
// The generic format's system message: the tools and how to call them.
std::string generic_tool_instructions(const ToolRequest& t);

struct ToolCall {
  std::string name;
  std::string arguments;  // JSON text (an object)
};
struct ParsedToolOutput {
  std::string content;  // text outside the calls (the generic format's response)
  std::vector<ToolCall> calls;
};
// A whole output. Text that does not parse as calls of the format stays content; an array
// of calls cut short (the length bound) keeps the calls that were complete.
ParsedToolOutput parse_tool_output(ToolFormat f, std::string_view text);

// The same, fed as the text streams: content goes out as soon as it cannot be the start of
// a call; each call goes out once it is complete.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolFormat f) : format_(f) {}
  ParsedToolOutput feed(std::string_view text);
  // The output ended: what is still held (a call cut short stays content).
  ParsedToolOutput finish();

 private:
  ToolFormat format_;
  std::string held_;       // text not yet given out
  bool in_calls_ = false;  // the trigger was seen: everything from it is held until parsed
  bool after_call_ = false;   // a call just ended: whitespace after it is not content
  bool passthrough_ = false;  // llama3: the message did not open with a call, it is all text
  // generic and mistral: where the array of calls is read up to, whether it went wrong,
  // and how many calls went out.
  size_t array_pos_ = std::string::npos;
  bool array_bad_ = false;
  size_t emitted_ = 0;
  void read_array(ParsedToolOutput* out);
};

// "call_" and 24 random alphanumerics.
std::string make_tool_call_id();

}  // namespace metro::server
