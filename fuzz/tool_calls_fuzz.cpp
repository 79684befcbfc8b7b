// libFuzzer target: tool calls are read out of model output, which a client steers through
// its prompt, and tool fields arrive in requests. Reading any text in any format, whole or
// streamed in any pieces, must never crash, leak or hang, and the streamed reading must give
// the calls the whole reading gives; any JSON as a request's tool fields is a ToolRequest or
// a 400, and a ToolRequest's grammar compiles or is an error Status.
// Input: a format byte, a piece-size byte, then the text (also tried as a request body).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "fuzz_util.h"
#include "server/tool_calls.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using metro::server::ToolFormat;
  if (size < 2 || size > 64 * 1024) return 0;
  const auto format = static_cast<ToolFormat>(data[0] % 4);
  const size_t piece = 1 + data[1] % 16;
  const std::string_view text(reinterpret_cast<const char*>(data + 2), size - 2);
  if (!metro::fuzz::shallow(text)) return 0;

  const metro::server::ParsedToolOutput whole = metro::server::parse_tool_output(format, text);
  metro::server::ToolCallStream stream(format);
  size_t calls = 0;
  for (size_t i = 0; i < text.size(); i += piece) calls += stream.feed(text.substr(i, piece)).calls.size();
  calls += stream.finish().calls.size();
  // An array cut short is read as far as it is whole either way; elsewhere the same calls.
  if (format == ToolFormat::kHermes && calls != whole.calls.size()) std::abort();

  const nlohmann::json body = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (body.is_object()) {
    std::optional<metro::server::ToolRequest> t;
    if (!metro::server::parse_tool_request(body, nullptr, format, &t) && t && t->parses()) {
      auto g = metro::server::tool_call_grammar(*t);
      (void)g;
    }
  }
  return 0;
}
