// Reading tool calls out of model text (internal to server/): the formats' markers, a
// JSON scanner for text that may still be growing, and the whole-text readers the stream
// falls back on. Shared by tool_calls.cpp (whole outputs) and tool_call_stream.cpp.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "server/tool_calls.h"

namespace metro::server::detail {

inline constexpr std::string_view kHermesOpen = "<tool_call>";
inline constexpr std::string_view kHermesClose = "</tool_call>";
inline constexpr std::string_view kMistralTrigger = "[TOOL_CALLS]";
inline constexpr std::string_view kLlamaTrigger = "{\"name\"";
inline constexpr std::string_view kPythonTag = "<|python_tag|>";

inline bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// Matching a fixed shape against text that may still be growing.
enum class Match : uint8_t { kMore, kNo, kYes };
struct Cursor {
  std::string_view s;
  size_t i;
  // Past whitespace; false when the text ends there.
  bool ws() {
    while (i < s.size() && is_ws(s[i])) ++i;
    return i < s.size();
  }
  Match lit(std::string_view w) {
    const size_t n = std::min(w.size(), s.size() - i);
    if (s.substr(i, n) != w.substr(0, n)) return Match::kNo;
    if (n < w.size()) return Match::kMore;
    i += n;
    return Match::kYes;
  }
  // ws, the literal, ws.
  Match token(std::string_view w) {
    if (!ws()) return Match::kMore;
    const Match m = lit(w);
    if (m != Match::kYes) return m;
    return ws() ? Match::kYes : Match::kMore;
  }
};

// The end (one past) of the JSON object or array that opens at s[at], or npos while open.
size_t json_end(std::string_view s, size_t at);
std::string_view ltrim(std::string_view s);
void rtrim(std::string& s);
std::optional<nlohmann::ordered_json> parse_json(std::string_view s);
// A call object read from its JSON (`text` its source, for the arguments' own text).
std::optional<ToolCall> call_from(const nlohmann::ordered_json& j, std::string_view text);
ParsedToolOutput parse_hermes(std::string_view text);
// The longest suffix of `s` that is a proper prefix of `word`.
size_t partial_suffix(std::string_view s, std::string_view word);
Match match_call_head(std::string_view s, size_t at, std::string_view key, std::string* name, size_t* value_at);
Match match_generic_head(std::string_view s, bool* calls, size_t* end);
Match decode_json_string(std::string_view s, size_t* i, std::string* out);

}  // namespace metro::server::detail
