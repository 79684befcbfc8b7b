#include "server/tool_calls.h"

#include <algorithm>
#include <set>

#include "grammar/json_schema.h"
#include "server/request_id.h"
#include "server/tool_call_text.h"

namespace metro::server {

namespace detail {

using OJson = nlohmann::ordered_json;

constexpr size_t kMaxTools = 128;
constexpr size_t kMaxDescriptionBytes = 8192;


bool valid_name(const std::string& s) {
  if (s.empty() || s.size() > 64) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
  });
}

std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}


// The end (one past) of the JSON object or array that opens at s[at], or npos while it is
// not closed in s (brackets counted outside strings).
size_t json_end(std::string_view s, size_t at) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = at; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

// The end of the JSON value that starts at s[at] (npos when cut short).
size_t value_end(std::string_view s, size_t at) {
  if (at >= s.size()) return std::string_view::npos;
  if (s[at] == '{' || s[at] == '[') return json_end(s, at);
  if (s[at] == '"') {
    for (size_t i = at + 1; i < s.size(); ++i) {
      if (s[i] == '\\') {
        ++i;
      } else if (s[i] == '"') {
        return i + 1;
      }
    }
    return std::string_view::npos;
  }
  size_t i = at;
  while (i < s.size() && !is_ws(s[i]) && s[i] != ',' && s[i] != ']' && s[i] != '}') ++i;
  return i;
}

// The text of the members' values of the JSON object `obj` whose key is written exactly
// `key` (without escapes), or the elements of the array `arr`: spans into the text.
std::optional<std::string_view> raw_member(std::string_view obj, std::string_view key) {
  size_t i = 0;
  while (i < obj.size() && is_ws(obj[i])) ++i;
  if (i >= obj.size() || obj[i] != '{') return std::nullopt;
  ++i;
  while (true) {
    while (i < obj.size() && (is_ws(obj[i]) || obj[i] == ',')) ++i;
    if (i >= obj.size() || obj[i] != '"') return std::nullopt;
    const size_t kend = value_end(obj, i);
    if (kend == std::string_view::npos) return std::nullopt;
    const std::string_view k = obj.substr(i + 1, kend - i - 2);
    i = kend;
    while (i < obj.size() && is_ws(obj[i])) ++i;
    if (i >= obj.size() || obj[i] != ':') return std::nullopt;
    ++i;
    while (i < obj.size() && is_ws(obj[i])) ++i;
    const size_t vend = value_end(obj, i);
    if (vend == std::string_view::npos) return std::nullopt;
    if (k == key) return obj.substr(i, vend - i);
    i = vend;
  }
}
std::vector<std::string_view> raw_elements(std::string_view arr) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < arr.size() && is_ws(arr[i])) ++i;
  if (i >= arr.size() || arr[i] != '[') return out;
  ++i;
  while (true) {
    while (i < arr.size() && (is_ws(arr[i]) || arr[i] == ',')) ++i;
    if (i >= arr.size() || arr[i] == ']') return out;
    const size_t end = value_end(arr, i);
    if (end == std::string_view::npos || end == i) return out;
    out.push_back(arr.substr(i, end - i));
    i = end;
  }
}

// A call object {"name": ..., "arguments" | "parameters": {...} or a JSON string}, read from
// `text` (its JSON text, or empty). Object arguments are the text the model wrote, so that a
// stream of their fragments adds up to the same string; where that text cannot be found,
// their compact JSON.
std::optional<ToolCall> call_from(const OJson& j, std::string_view text) {
  if (!j.is_object()) return std::nullopt;
  auto n = j.find("name");
  if (n == j.end() || !n->is_string()) return std::nullopt;
  auto a = j.find("arguments");
  if (a == j.end()) a = j.find("parameters");
  ToolCall c;
  c.name = n->get<std::string>();
  if (a == j.end() || a->is_null()) {
    c.arguments = "{}";
  } else if (a->is_string()) {
    c.arguments = a->get<std::string>();
  } else {
    c.arguments = a->dump();
    if (auto raw = raw_member(text, a.key()); raw) {
      const OJson back = OJson::parse(*raw, nullptr, /*allow_exceptions=*/false);
      if (!back.is_discarded() && back == *a) c.arguments = std::string(*raw);
    }
  }
  return c;
}

std::optional<OJson> parse_json(std::string_view s) {
  OJson j = OJson::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// Calls from an array of call objects or one call object (`text` its JSON text); nullopt if
// any element is not one.
std::optional<std::vector<ToolCall>> calls_from(const OJson& j, std::string_view text) {
  std::vector<ToolCall> out;
  if (j.is_array()) {
    std::vector<std::string_view> raw = raw_elements(text);
    if (raw.size() != j.size()) raw.assign(j.size(), std::string_view());
    for (size_t k = 0; k < j.size(); ++k) {
      auto c = call_from(j[k], raw[k]);
      if (!c) return std::nullopt;
      out.push_back(std::move(*c));
    }
    return out;
  }
  auto c = call_from(j, text);
  if (!c) return std::nullopt;
  out.push_back(std::move(*c));
  return out;
}

std::string_view ltrim(std::string_view s) {
  const size_t n = s.find_first_not_of(" \n\t\r");
  return n == std::string_view::npos ? std::string_view() : s.substr(n);
}
void rtrim(std::string& s) {
  const size_t n = s.find_last_not_of(" \n\t\r");
  s.erase(n == std::string::npos ? 0 : n + 1);
}

// Whitespace between text and a call belongs to neither: it is dropped on both sides of each
// call (ToolCallStream does the same as the text streams).
ParsedToolOutput parse_hermes(std::string_view text) {
  ParsedToolOutput out;
  size_t pos = 0;
  bool after_call = false;
  while (true) {
    const size_t open = text.find(kHermesOpen, pos);
    if (open == std::string_view::npos) break;
    const size_t body = open + kHermesOpen.size();
    // The block's body is the call object up to its own end (a string inside it may hold
    // "</tool_call>"), then whitespace and the close; else whatever runs to the first close.
    size_t obj = body;
    while (obj < text.size() && is_ws(text[obj])) ++obj;
    size_t close = std::string_view::npos;
    size_t obj_end = obj < text.size() && text[obj] == '{' ? json_end(text, obj) : std::string_view::npos;
    if (obj_end != std::string_view::npos) {
      size_t t = obj_end;
      while (t < text.size() && is_ws(text[t])) ++t;
      if (text.substr(t, kHermesClose.size()) == kHermesClose) close = t;
    }
    if (close == std::string_view::npos) {
      obj_end = std::string_view::npos;
      close = text.find(kHermesClose, body);
    }
    if (close == std::string_view::npos) break;
    const std::string_view call_text =
        obj_end != std::string_view::npos ? text.substr(obj, obj_end - obj) : trim(text.substr(body, close - body));
    auto j = parse_json(call_text);
    auto c = j ? call_from(*j, call_text) : std::nullopt;
    const std::string_view before = text.substr(pos, open - pos);
    out.content += after_call ? ltrim(before) : before;
    if (c) {
      rtrim(out.content);
      out.calls.push_back(std::move(*c));
      after_call = true;
    } else {
      out.content += text.substr(open, close + kHermesClose.size() - open);
      after_call = false;
    }
    pos = close + kHermesClose.size();
  }
  const std::string_view rest = text.substr(pos);
  out.content += after_call ? ltrim(rest) : rest;
  return out;
}

ParsedToolOutput parse_llama3(std::string_view text) {
  std::string_view t = trim(text);
  if (t.substr(0, kPythonTag.size()) == kPythonTag) t = trim(t.substr(kPythonTag.size()));
  if (auto j = parse_json(t)) {
    if (auto c = call_from(*j, t)) return {{}, {std::move(*c)}};
  }
  return {std::string(text), {}};
}

// The complete call objects of a JSON array of calls from *pos (just inside its '[', or
// after an item read before) on, *pos moved past each. False when something other than a
// call object (or the array's end) is there.
bool array_calls(std::string_view s, size_t* pos, std::vector<ToolCall>* out) {
  while (true) {
    size_t i = *pos;
    while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' || s[i] == ',')) ++i;
    if (i >= s.size() || s[i] == ']') return true;
    if (s[i] != '{') return false;
    const size_t end = json_end(s, i);
    if (end == std::string_view::npos) return true;  // not yet complete
    auto j = parse_json(s.substr(i, end - i));
    auto c = j ? call_from(*j, s.substr(i, end - i)) : std::nullopt;
    if (!c) return false;
    out->push_back(std::move(*c));
    *pos = end;
  }
}

// Where the array of calls opens, just inside its '[': after the Mistral trigger, or after
// the generic format's {"tool_calls": (npos: not there, or not yet).
size_t calls_array_start(ToolFormat f, std::string_view s) {
  size_t i;
  if (f == ToolFormat::kMistral) {
    i = s.find(kMistralTrigger);
    if (i == std::string_view::npos) return i;
    i += kMistralTrigger.size();
  } else {
    const std::string_view head = "{\"tool_calls\":";
    const std::string_view t = ltrim(s);
    if (t.substr(0, head.size()) != head) return std::string_view::npos;
    i = (s.size() - t.size()) + head.size();
  }
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return i < s.size() && s[i] == '[' ? i + 1 : std::string_view::npos;
}

// The complete calls of an array cut short (the length bound): what was whole is kept.
std::vector<ToolCall> calls_cut_short(ToolFormat f, std::string_view s) {
  std::vector<ToolCall> calls;
  size_t pos = calls_array_start(f, s);
  if (pos == std::string_view::npos || !array_calls(s, &pos, &calls)) calls.clear();
  return calls;
}


// The head of a call object whose arguments can stream: `{"name": "NAME", "KEY": {` with any
// whitespace, KEY "arguments" (or "parameters" for llama3, as its format writes it). The
// name must be plain (no escapes). On kYes, *value_at is the arguments' '{'.
Match match_call_head(std::string_view s, size_t at, std::string_view key, std::string* name, size_t* value_at) {
  Cursor c{s, at};
  Match m;
  if ((m = c.lit("{")) != Match::kYes) return m;
  if ((m = c.token("\"name\"")) != Match::kYes) return m;
  if ((m = c.lit(":")) != Match::kYes) return m;
  if ((m = c.token("\"")) != Match::kYes) return m;
  const size_t n0 = c.i;
  while (c.i < s.size() && s[c.i] != '"') {
    if (s[c.i] == '\\' || static_cast<unsigned char>(s[c.i]) < 0x20) return Match::kNo;
    ++c.i;
  }
  if (c.i >= s.size()) return Match::kMore;
  *name = std::string(s.substr(n0, c.i - n0));
  ++c.i;
  if ((m = c.token(",")) != Match::kYes) return m;
  if ((m = c.lit("\"")) != Match::kYes) return m;
  if ((m = c.lit(key)) != Match::kYes) return m;
  if ((m = c.lit("\"")) != Match::kYes) return m;
  if ((m = c.token(":")) != Match::kYes) return m;
  if (s[c.i] != '{') return Match::kNo;
  *value_at = c.i;
  return Match::kYes;
}

// The generic format's opening: `{"tool_calls": [` (*calls true) or `{"response": "`; *end
// is just past its last byte.
Match match_generic_head(std::string_view s, bool* calls, size_t* end) {
  Cursor c{s, 0};
  Match m;
  if (!c.ws()) return Match::kMore;
  if ((m = c.lit("{")) != Match::kYes) return m;
  if ((m = c.token("\"")) != Match::kYes) return m;
  Cursor r = c;
  const Match mc = c.lit("tool_calls\"");
  const Match mr = r.lit("response\"");
  if (mc == Match::kNo && mr == Match::kNo) return Match::kNo;
  if (mc != Match::kYes && mr != Match::kYes) return Match::kMore;
  Cursor& k = mc == Match::kYes ? c : r;
  if ((m = k.token(":")) != Match::kYes) return m;
  if ((m = k.lit(mc == Match::kYes ? "[" : "\"")) != Match::kYes) return m;
  *calls = mc == Match::kYes;
  *end = k.i;
  return Match::kYes;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    *out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    *out += static_cast<char>(0xC0 | (cp >> 6));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    *out += static_cast<char>(0xE0 | (cp >> 12));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    *out += static_cast<char>(0xF0 | (cp >> 18));
    *out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    *out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    *out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::optional<uint32_t> hex4(std::string_view s) {
  uint32_t v = 0;
  for (char c : s) {
    v <<= 4;
    if (c >= '0' && c <= '9') {
      v |= static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      v |= static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      v |= static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return std::nullopt;
    }
  }
  return v;
}

// Decodes a JSON string's body from s[*i] on (just past its opening quote) into *out, as far
// as the text is complete (an escape cut short waits); *i moves past what was decoded.
// kYes: the closing quote was read; kNo: the string is malformed (a control character, a bad
// escape) and reading stops there. A lone surrogate becomes U+FFFD.
Match decode_json_string(std::string_view s, size_t* i, std::string* out) {
  size_t k = *i;
  while (k < s.size()) {
    const char c = s[k];
    if (c == '"') {
      *i = k + 1;
      return Match::kYes;
    }
    if (static_cast<unsigned char>(c) < 0x20) break;
    if (c != '\\') {
      *out += c;
      ++k;
      continue;
    }
    if (k + 1 >= s.size()) {
      *i = k;
      return Match::kMore;
    }
    const char e = s[k + 1];
    const std::string_view simple = "\"\\/bfnrt";
    const std::string_view value = "\"\\/\b\f\n\r\t";
    if (const size_t at = simple.find(e); at != std::string_view::npos) {
      *out += value[at];
      k += 2;
      continue;
    }
    if (e != 'u') break;
    if (k + 6 > s.size()) {
      *i = k;
      return Match::kMore;
    }
    auto cp = hex4(s.substr(k + 2, 4));
    if (!cp) break;
    if (*cp >= 0xD800 && *cp < 0xDC00) {
      // A high surrogate may be followed by the low one, still being written.
      const std::string_view next = s.substr(k + 6, 6);
      if (next.size() < 6 && std::string_view("\\u").substr(0, std::min<size_t>(next.size(), 2)) ==
                                 next.substr(0, std::min<size_t>(next.size(), 2))) {
        *i = k;
        return Match::kMore;
      }
      auto lo = s.substr(k + 6, 2) == "\\u" ? hex4(s.substr(k + 8, 4)) : std::nullopt;
      if (lo && *lo >= 0xDC00 && *lo < 0xE000) {
        append_utf8(out, 0x10000 + ((*cp - 0xD800) << 10) + (*lo - 0xDC00));
        k += 12;
        continue;
      }
      append_utf8(out, 0xFFFD);
    } else if (*cp >= 0xDC00 && *cp < 0xE000) {
      append_utf8(out, 0xFFFD);
    } else {
      append_utf8(out, *cp);
    }
    k += 6;
  }
  *i = k;
  return k < s.size() ? Match::kNo : Match::kMore;
}

ParsedToolOutput parse_mistral(std::string_view text) {
  const size_t at = text.find(kMistralTrigger);
  if (at == std::string_view::npos) return {std::string(text), {}};
  const std::string_view body = trim(text.substr(at + kMistralTrigger.size()));
  if (auto j = parse_json(body)) {
    if (auto calls = calls_from(*j, body)) {
      std::string before(text.substr(0, at));
      rtrim(before);
      return {std::move(before), std::move(*calls)};
    }
  }
  if (auto calls = calls_cut_short(ToolFormat::kMistral, text); !calls.empty()) {
    std::string before(text.substr(0, at));
    rtrim(before);
    return {std::move(before), std::move(calls)};
  }
  return {std::string(text), {}};
}

ParsedToolOutput parse_generic(std::string_view text) {
  const std::string_view t = trim(text);
  auto j = parse_json(t);
  if (j && j->is_object()) {
    if (auto tc = j->find("tool_calls"); tc != j->end()) {
      if (auto calls = calls_from(*tc, raw_member(t, "tool_calls").value_or(std::string_view()))) {
        return {{}, std::move(*calls)};
      }
    } else if (auto one = j->find("tool_call"); one != j->end()) {
      if (auto calls = calls_from(*one, raw_member(t, "tool_call").value_or(std::string_view()))) {
        return {{}, std::move(*calls)};
      }
    } else if (auto r = j->find("response"); r != j->end() && r->is_string()) {
      return {r->get<std::string>(), {}};
    }
  }
  if (auto calls = calls_cut_short(ToolFormat::kGeneric, text); !calls.empty()) return {{}, std::move(calls)};
  // A response cut short (the length bound): the part of its string that was written.
  bool calls = false;
  size_t at = 0;
  if (match_generic_head(text, &calls, &at) == Match::kYes && !calls) {
    std::string r;
    if (decode_json_string(text, &at, &r) != Match::kNo) return {std::move(r), {}};
  }
  return {std::string(text), {}};
}

// The longest suffix of `s` that is a proper prefix of `word` (what may yet become it).
size_t partial_suffix(std::string_view s, std::string_view word) {
  for (size_t n = std::min(s.size(), word.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == word.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace detail

using namespace detail;

const char* tool_format_name(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return "hermes";
    case ToolFormat::kLlama3:
      return "llama3";
    case ToolFormat::kMistral:
      return "mistral";
    case ToolFormat::kGeneric:
      break;
  }
  return "generic";
}

ToolFormat detect_tool_format(std::string_view src) {
  if (src.find("tools") == std::string_view::npos && src.find("tool_calls") == std::string_view::npos) {
    return ToolFormat::kGeneric;
  }
  if (src.find(kHermesOpen) != std::string_view::npos) return ToolFormat::kHermes;
  if (src.find(kMistralTrigger) != std::string_view::npos) return ToolFormat::kMistral;
  if (src.find(kPythonTag) != std::string_view::npos || src.find("ipython") != std::string_view::npos) {
    return ToolFormat::kLlama3;
  }
  return ToolFormat::kGeneric;
}

std::optional<ApiError> parse_tool_request(const nlohmann::json& body, const nlohmann::ordered_json* ordered,
                                           ToolFormat format, std::optional<ToolRequest>* out) {
  out->reset();
  auto tools = body.find("tools");
  const bool has_tools = tools != body.end() && !tools->is_null();
  ToolRequest t;
  t.format = format;
  if (has_tools) {
    if (!tools->is_array()) return bad_request("tools must be an array", "tools");
    if (tools->size() > kMaxTools) {
      return bad_request("tools may list at most " + std::to_string(kMaxTools) + " functions", "tools");
    }
    const OJson* sent = nullptr;
    if (ordered != nullptr) {
      if (auto ot = ordered->find("tools"); ot != ordered->end() && ot->is_array() && ot->size() == tools->size()) {
        sent = &*ot;
      }
    }
    std::set<std::string> names;
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      const nlohmann::json& tool = (*tools)[i];
      if (!tool.is_object()) return bad_request(p + " must be an object", p);
      if (auto ty = tool.find("type"); ty == tool.end() || !ty->is_string() || ty->get<std::string>() != "function") {
        return bad_request(p + ".type must be \"function\"", p + ".type");
      }
      auto fn = tool.find("function");
      if (fn == tool.end() || !fn->is_object()) return bad_request(p + ".function must be an object", p + ".function");
      ToolFunction f;
      auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || !valid_name(name->get<std::string>())) {
        return bad_request(p + ".function.name must be 1 to 64 letters, digits, underscores or dashes",
                           p + ".function.name");
      }
      f.name = name->get<std::string>();
      if (!names.insert(f.name).second) {
        return bad_request("tools names the function " + f.name + " twice", p + ".function.name");
      }
      if (auto d = fn->find("description"); d != fn->end() && !d->is_null()) {
        if (!d->is_string() || d->get<std::string>().size() > kMaxDescriptionBytes) {
          return bad_request(p + ".function.description must be a string of at most 8192 bytes",
                             p + ".function.description");
        }
        f.description = d->get<std::string>();
      }
      if (auto s = fn->find("strict"); s != fn->end() && !s->is_null() && !s->is_boolean()) {
        return bad_request(p + ".function.strict must be a boolean", p + ".function.strict");
      }
      if (auto params = fn->find("parameters"); params != fn->end() && !params->is_null()) {
        if (!params->is_object()) {
          return bad_request(p + ".function.parameters must be a JSON schema (an object)", p + ".function.parameters");
        }
        const OJson* op = nullptr;
        if (sent != nullptr) {
          const OJson& st = (*sent)[i];
          if (st.is_object() && st.contains("function") && st["function"].is_object() &&
              st["function"].contains("parameters")) {
            op = &st["function"]["parameters"];
          }
        }
        f.parameters = op != nullptr ? *op : OJson::parse(params->dump());
      } else {
        f.parameters = OJson::object();
      }
      t.functions.push_back(std::move(f));
    }
  }
  if (auto pc = body.find("parallel_tool_calls"); pc != body.end() && !pc->is_null()) {
    if (!pc->is_boolean()) return bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls");
    t.parallel = pc->get<bool>();
  }
  t.mode = has_tools && !t.functions.empty() ? ToolRequest::Mode::kAuto : ToolRequest::Mode::kNone;
  if (auto tc = body.find("tool_choice"); tc != body.end() && !tc->is_null()) {
    const char* shape =
        "tool_choice must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": "
        "...}}";
    if (tc->is_string()) {
      const std::string v = tc->get<std::string>();
      if (v == "none") {
        t.mode = ToolRequest::Mode::kNone;
      } else if (v == "auto") {
        if (t.functions.empty()) return bad_request("tool_choice auto needs tools", "tool_choice");
      } else if (v == "required") {
        if (t.functions.empty()) return bad_request("tool_choice required needs tools", "tool_choice");
        t.mode = ToolRequest::Mode::kRequired;
      } else {
        return bad_request(shape, "tool_choice");
      }
    } else if (tc->is_object()) {
      auto fn = tc->find("function");
      auto ty = tc->find("type");
      if (ty == tc->end() || !ty->is_string() || ty->get<std::string>() != "function" || fn == tc->end() ||
          !fn->is_object() || !fn->contains("name") || !(*fn)["name"].is_string()) {
        return bad_request(shape, "tool_choice");
      }
      const std::string name = (*fn)["name"].get<std::string>();
      auto it = std::find_if(t.functions.begin(), t.functions.end(),
                             [&](const ToolFunction& f) { return f.name == name; });
      if (it == t.functions.end()) {
        return bad_request("tool_choice names a function that tools does not list: " + name.substr(0, 64),
                           "tool_choice.function.name");
      }
      ToolFunction only = std::move(*it);
      t.functions.clear();
      t.functions.push_back(std::move(only));
      t.mode = ToolRequest::Mode::kRequired;
      t.named = true;
    } else {
      return bad_request(shape, "tool_choice");
    }
  }
  if (!has_tools) return std::nullopt;
  *out = std::move(t);
  return std::nullopt;
}

std::string_view tool_call_trigger(ToolFormat f) {
  switch (f) {
    case ToolFormat::kHermes:
      return kHermesOpen;
    case ToolFormat::kLlama3:
      return kLlamaTrigger;
    case ToolFormat::kMistral:
      return kMistralTrigger;
    case ToolFormat::kGeneric:
      break;
  }
  return {};
}

std::string tool_grammar_key(const ToolRequest& t) {
  OJson k = OJson::object();
  k["format"] = tool_format_name(t.format);
  k["required"] = t.mode == ToolRequest::Mode::kRequired;
  k["parallel"] = t.parallel;
  OJson fns = OJson::array();
  for (const ToolFunction& f : t.functions) fns.push_back(OJson{{"name", f.name}, {"parameters", f.parameters}});
  k["functions"] = std::move(fns);
  return "tools:" + k.dump();
}

Expected<grammar::Grammar> tool_call_grammar(const ToolRequest& t) {
  if (t.functions.empty()) return invalid_argument("no functions to call");
  grammar::Builder b;
  using grammar::Element;
  const char* args_key = t.format == ToolFormat::kLlama3 ? "parameters" : "arguments";
  std::vector<Element> fns;
  for (size_t i = 0; i < t.functions.size(); ++i) {
    const ToolFunction& f = t.functions[i];
    auto g = grammar::json_schema_grammar(f.parameters);
    if (!g.ok()) {
      return invalid_argument("tools[" + std::to_string(i) + "].function.parameters: " + g.status().message());
    }
    fns.push_back(b.seq({b.literal("{\"name\": \"" + f.name + "\", \"" + args_key + "\": "),
                         b.embed(*g, "f" + std::to_string(i) + "."), b.byte('}')},
                        "call." + f.name));
  }
  const Element one = fns.size() == 1 ? fns[0] : b.alt(fns, "call");
  // One call, or (parallel) one or more joined by `sep`.
  auto list = [&](Element item, std::string_view sep) {
    return t.parallel ? b.seq({item, b.star(b.seq({b.literal(sep), item}, "next"))}, "calls") : item;
  };
  Element root;
  switch (t.format) {
    case ToolFormat::kHermes: {
      const Element call = b.seq({b.literal(kHermesOpen), b.byte('\n'), one, b.byte('\n'), b.literal(kHermesClose)},
                                 "tool_call");
      root = list(call, "\n");
      break;
    }
    case ToolFormat::kLlama3:
      root = one;  // the format holds one call per message
      break;
    case ToolFormat::kMistral:
      root = b.seq({b.literal(kMistralTrigger), b.byte('['), list(one, ", "), b.byte(']')}, "tool_calls");
      break;
    case ToolFormat::kGeneric: {
      const Element calls = b.seq({b.literal("{\"tool_calls\": ["), list(one, ", "), b.literal("]}")}, "tool_calls");
      if (t.mode == ToolRequest::Mode::kRequired) {
        root = calls;
      } else {
        auto s = grammar::json_schema_grammar(OJson{{"type", "string"}});
        if (!s.ok()) return s.status();
        const Element response =
            b.seq({b.literal("{\"response\": "), b.embed(*s, "response."), b.byte('}')}, "response");
        root = b.alt({calls, response}, "answer");
      }
      break;
    }
  }
  const Element top = b.seq({root, b.empty()}, "root");
  return b.take(top.index);
}

std::string generic_tool_instructions(const ToolRequest& t) {
  std::string s = t.mode == ToolRequest::Mode::kRequired
                      ? "Call one or more of these tools. "
                      : "You may call one or more of these tools, or answer directly. ";
  s += "Tools:\n";
  for (const ToolFunction& f : t.functions) {
    s += "- " + f.name;
    if (!f.description.empty()) s += ": " + f.description;
    s += "\n  arguments (JSON schema): " + f.parameters.dump() + "\n";
  }
  s += "To call tools, reply with only {\"tool_calls\": [{\"name\": <tool name>, \"arguments\": {<arguments>}}]}";
  if (t.mode != ToolRequest::Mode::kRequired) {
    s += "; to answer directly, reply with only {\"response\": \"<your answer>\"}";
  }
  s += ".";
  return s;
}

ParsedToolOutput parse_tool_output(ToolFormat f, std::string_view text) {
  switch (f) {
    case ToolFormat::kHermes:
      return parse_hermes(text);
    case ToolFormat::kLlama3:
      return parse_llama3(text);
    case ToolFormat::kMistral:
      return parse_mistral(text);
    case ToolFormat::kGeneric:
      break;
  }
  return parse_generic(text);
}

std::string make_tool_call_id() { return random_id("call_"); }

}  // namespace metro::server
