// libFuzzer target: tool calls are read out of model output, which a client steers through
// its prompt, and tool fields arrive in requests. Reading any text in any format, whole or
// streamed in any pieces, must never crash, leak or hang; the streamed reading must not depend
// on how the text is cut, and its arguments must only ever follow a call's start; any JSON as a request's tool fields is a ToolRequest or
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
  (void)whole;
  // Each stream's pieces put together (adjacent content or arguments pieces joined; each call
  // start its own), for any piece size the same.
  using Kind = metro::server::ToolStreamPiece::Kind;
  auto read = [&](size_t step) {
    metro::server::ToolCallStream stream(format);
    metro::server::ToolStreamPieces acc;
    size_t calls = 0;
    auto add = [&](const metro::server::ToolStreamPieces& pieces) {
      for (const auto& p : pieces) {
        if (p.kind == Kind::kArguments && calls == 0) std::abort();
        if (p.kind == Kind::kCall) ++calls;
        if (p.kind != Kind::kCall && !acc.empty() && acc.back().kind == p.kind) {
          acc.back().text += p.text;
        } else {
          acc.push_back(p);
        }
      }
    };
    for (size_t i = 0; i < text.size(); i += step) add(stream.feed(text.substr(i, step)));
    add(stream.finish());
    return acc;
  };
  const metro::server::ToolStreamPieces a = read(piece);
  const metro::server::ToolStreamPieces b = read(text.empty() ? 1 : text.size());
  if (a.size() != b.size()) std::abort();
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].kind != b[i].kind || a[i].text != b[i].text) std::abort();
  }

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
