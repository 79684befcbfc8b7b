// Chat templates: turn a list of chat messages into the prompt text a model was trained on,
// by rendering the Jinja template shipped in the GGUF file (`tokenizer.chat_template`).
//
// The template is code from an untrusted file, so it runs in a sandboxed interpreter for the
// subset of Jinja that real chat templates use (src/jinja/): plain data only, no
// I/O, and bounded steps, output size, recursion depth, source size and time
// (ChatTemplateLimits). A template that breaks a bound fails with an error; it never hangs
// or crashes the process.
//
// Rendering matches Hugging Face transformers' apply_chat_template: Jinja with
// trim_blocks=True, lstrip_blocks=True, the raise_exception(msg) and strftime_now(fmt)
// globals, HF's tojson filter (no HTML escaping, key order kept), and the variables
// `messages`, `tools` (none when absent), `documents` (none), `add_generation_prompt`,
// `bos_token`, `eos_token`, plus any extra context.
//
// Content parts. OpenAI clients may send `content` as a list of parts
// [{"type": "text", "text": "..."}]. When a template is parsed, metro renders it once with
// such a list; unless the part's text comes out on its own (not inside a printed list, as
// `content | trim` would print it), the template expects strings, and render() then replaces
// every list content by its text parts joined with "\n" (non-text parts are dropped).
// Templates that handle lists themselves (they iterate the parts) get the list.
//
// Thread-safety: a ChatTemplate is immutable after parse; render() may run concurrently.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "jinja/limits.h"

namespace metro::gguf {
class File;
}

namespace metro::jinja {
struct Program;
}

namespace metro::tokenizer {

// Sandbox bounds; see jinja/limits.h for each field and its default.
using ChatTemplateLimits = jinja::Limits;

// One chat message, for callers that do not hold JSON. render() also takes messages as
// JSON directly (an array of objects with these keys).
struct ChatMessage {
  std::string role;
  std::string content;
  // When not null, a list of parts [{"type":"text","text":...}] used instead of `content`.
  nlohmann::ordered_json content_parts;
  std::string name;                  // omitted when empty
  std::string tool_call_id;          // omitted when empty
  nlohmann::ordered_json tool_calls; // omitted when null; else an array of tool calls
};

// The JSON form of messages as templates see them.
nlohmann::ordered_json messages_to_json(const std::vector<ChatMessage>& messages);

struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  // Unset: the template's defaults (from the GGUF vocabulary with from_gguf(), else "").
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  // Tool definitions (an array); null makes `tools` none, as HF passes tools=None. Pass
  // ordered_json to keep each object's key order in tojson output (nlohmann::json sorts).
  nlohmann::ordered_json tools;
  // More template variables (an object), e.g. {"enable_thinking": false}; they override
  // the variables above of the same name.
  nlohmann::ordered_json extra_context = nlohmann::ordered_json::object();
  // The clock behind strftime_now(); unset means the system clock. Tests inject a fixed one.
  std::function<std::chrono::system_clock::time_point()> now;
  // strftime_now() formats local time like Python's datetime.now(); false formats UTC.
  bool local_time = true;
};

class ChatTemplate {
 public:
  // Parses template source. Syntax errors name the line and column.
  static Expected<ChatTemplate> parse(std::string source, const ChatTemplateLimits& limits = {});

  // The template in `tokenizer.chat_template`; when the file has none, the ChatML fallback
  // (is_fallback() is then true). A template that does not parse is an error, not a
  // fallback: the model would be prompted in a format it was not trained on. BOS/EOS
  // token texts from the file's vocabulary become the bos_token/eos_token defaults.
  static Expected<ChatTemplate> from_gguf(const gguf::File& file, const ChatTemplateLimits& limits = {});

  // ChatML: "<|im_start|>{role}\n{content}<|im_end|>\n" per message, then
  // "<|im_start|>assistant\n" when add_generation_prompt. The fallback of from_gguf().
  static std::string_view chatml_source();
  static ChatTemplate chatml(const ChatTemplateLimits& limits = {});

  // Renders `messages` (a JSON array). Errors: a template's raise_exception(msg) gives
  // kInvalidArgument with exactly msg; a sandbox bound gives kResourceExhausted; other
  // template errors give kInvalidArgument naming the template line and column.
  Expected<std::string> render(const nlohmann::json& messages, const ChatTemplateOptions& opts) const;
  Expected<std::string> render(const nlohmann::ordered_json& messages,
                               const ChatTemplateOptions& opts) const;
  Expected<std::string> render(const std::vector<ChatMessage>& messages,
                               const ChatTemplateOptions& opts) const;

  const std::string& source() const { return source_; }
  bool is_fallback() const { return is_fallback_; }
  // True when the template renders list-of-parts content itself (see the file comment).
  bool renders_content_parts() const { return renders_content_parts_; }
  const ChatTemplateLimits& limits() const { return limits_; }
  const std::string& default_bos_token() const { return default_bos_; }
  const std::string& default_eos_token() const { return default_eos_; }

 private:
  ChatTemplate() = default;
  template <class Json>
  Expected<std::string> render_json(const Json& messages, const ChatTemplateOptions& opts) const;

  std::string source_;
  std::shared_ptr<const jinja::Program> program_;
  ChatTemplateLimits limits_;
  bool is_fallback_ = false;
  bool renders_content_parts_ = false;
  std::string default_bos_;
  std::string default_eos_;
};

}  // namespace metro::tokenizer
