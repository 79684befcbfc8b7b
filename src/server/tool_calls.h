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

// What a stream of output gives out, in order: text, the start of a call (its function's
// name), and fragments of the last started call's arguments as they are written.
struct ToolStreamPiece {
  enum class Kind : uint8_t { kContent, kCall, kArguments };
  Kind kind;
  std::string text;
};
using ToolStreamPieces = std::vector<ToolStreamPiece>;

// The whole-output reading, fed as the text streams. Content goes out as soon as it cannot
// be the start of a call. A call written `{"name": "f", "arguments": {` (any whitespace)
// starts as soon as its name is read and its arguments go out as they are written, their
// concatenation the same text parse_tool_output gives; a call in another shape goes out
// whole once complete. The generic format's {"response": "..."} streams as its string is
// written. A call cut short (the length bound) has gone out in part; parse_tool_output
// drops it.
class ToolCallStream {
 public:
  explicit ToolCallStream(ToolFormat f);
  ToolStreamPieces feed(std::string_view text);
  // The output ended: what is still held (text that did not become a call).
  ToolStreamPieces finish();

  // One call object being read, from its '{' at `start` in held_.
  struct CallReader {
    enum class Phase : uint8_t { kHead, kArguments, kTail, kWhole };
    size_t start = 0;
    size_t scan = 0;  // read up to (kArguments: the next byte to look at)
    Phase phase = Phase::kHead;
    bool begun = false;  // its name went out
    int depth = 0;
    bool in_string = false;
    bool escape = false;
  };

 private:
  enum class Phase : uint8_t {
    kText,          // hermes, mistral: free text, looking for the trigger
    kLlamaStart,    // llama3: a call or text, decided by the first bytes
    kGenericStart,  // generic: {"tool_calls": [ or {"response": " or something else
    kHermesOpen,    // after <tool_call>: a call object or other text up to </tool_call>
    kHermesCall,    // reading the call object of a <tool_call> block
    kHermesTail,    // after it: whitespace, then </tool_call>
    kHermesRaw,     // a block that is not a call object: held until </tool_call>
    kMistralOpen,   // after [TOOL_CALLS]: an array of calls or one call
    kArray,         // between the calls of an array
    kArrayCall,     // reading a call of an array
    kLone,          // reading the one call of a llama3 message or a mistral call
    kResponse,      // generic: the response string, streamed as it is decoded
    kDone,          // the calls (or the response) are complete: what follows is dropped
    kHold,          // an unusual shape: held whole until the end, then parsed whole
    kPass,          // llama3: the message is text
  };
  enum class ReadResult : uint8_t { kMore, kCall, kNotACall };
  ReadResult read_call(ToolStreamPieces* out);
  void start_call(size_t at);
  void text(ToolStreamPieces* out);
  void emit_content(ToolStreamPieces* out, std::string_view s);

  ToolFormat format_;
  Phase phase_;
  std::string held_;   // kText: text not yet given out; else from the trigger or start on
  size_t pos_ = 0;     // where reading goes on in held_
  bool after_call_ = false;  // hermes: a call just ended, whitespace after it is not content
  bool begun_ = false;       // a call of the current block or array went out in part
  std::string pending_ws_;   // whitespace before the trigger: text unless a call follows
  CallReader call_;
};

// "call_" and 24 random alphanumerics.
std::string make_tool_call_id();

}  // namespace metro::server
