#include "jinja/lexer.h"

#include <algorithm>
#include <cstdio>

#include "jinja/error.h"
#include "jinja/string.h"

namespace metro::jinja {
namespace {

bool is_space(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }
int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

namespace {

// Python's str.rstrip() (Unicode whitespace) for `{%-`.
std::string_view rstrip_py(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, &len);
    i += len;
    if (!is_py_space(cp)) end = i;
  }
  return s.substr(0, end);
}

// Index just past the run of Unicode whitespace starting at i (`\s*` after `-%}`).
size_t skip_py_space(std::string_view s, size_t i) {
  while (i < s.size()) {
    size_t len = 1;
    if (!is_py_space(decode_utf8(s, i, &len))) break;
    i += len;
  }
  return i;
}

bool only_py_space(std::string_view s) {
  return !s.empty() && skip_py_space(s, 0) == s.size();
}

class Lexer {
 public:
  Lexer(std::string source, const LexOptions& options) : src_(std::move(source)), opt_(options) {}

  LexResult run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t tag = find_tag(pos);
      if (tag == std::string::npos) {
        emit_text(std::string_view(src_).substr(pos), pos);
        break;
      }
      const char type = src_[tag + 1];
      size_t after = tag + 2;
      char sign = 0;
      if (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) sign = src_[after++];

      size_t raw_body = 0;
      const bool raw = type == '%' && match_raw_begin(after, &raw_body);
      std::string_view text = std::string_view(src_).substr(pos, tag - pos);
      text = control_text(text, sign, type != '{', line_starting);
      emit_text(text, pos);

      if (raw) {
        pos = lex_raw(raw_body, tag, &line_starting);
      } else if (type == '#') {
        pos = lex_comment(after, tag, &line_starting);
      } else {
        pos = lex_tag(type, after, tag, &line_starting);
      }
    }
    push(TokenKind::kEof, static_cast<uint32_t>(src_.size()));
    return LexResult{std::move(src_), std::move(tokens_)};
  }

 private:
  [[noreturn]] void fail(const std::string& msg, size_t offset) const {
    throw Error(ErrorKind::kSyntax, msg, static_cast<uint32_t>(offset));
  }

  Token& push(TokenKind kind, size_t offset, std::string text = {}) {
    Token t;
    t.kind = kind;
    t.offset = static_cast<uint32_t>(offset);
    t.text = std::move(text);
    tokens_.push_back(std::move(t));
    return tokens_.back();
  }

  void emit_text(std::string_view text, size_t offset) {
    if (!text.empty()) push(TokenKind::kText, offset, std::string(text));
  }

  size_t find_tag(size_t pos) const {
    for (size_t i = src_.find('{', pos); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) {
        return i;
      }
    }
    return std::string::npos;
  }

  // Whitespace control on the text before a tag. `block_like`: {% or {# (lstrip applies).
  std::string_view control_text(std::string_view text, char sign, bool block_like,
                                bool line_starting) const {
    if (sign == '-') return rstrip_py(text);
    if (sign == '+' || !opt_.lstrip_blocks || !block_like) return text;
    const size_t nl = text.rfind('\n');
    const size_t line_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((line_pos > 0 || line_starting) && only_py_space(text.substr(line_pos))) {
      return text.substr(0, line_pos);
    }
    return text;
  }

  // After a block or comment end: trim_blocks drops one newline; `-` drops all whitespace.
  size_t after_end(size_t end, char sign, bool trim, bool* line_starting) const {
    size_t pos = end;
    if (sign == '-') {
      pos = skip_py_space(src_, end);
    } else if (sign != '+' && trim && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    *line_starting = pos > 0 && src_[pos - 1] == '\n';
    return pos;
  }

  // `{%[-+]? raw [-]?%}` starting after the sign; sets *body to the raw text start.
  bool match_raw_begin(size_t i, size_t* body) const {
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0) return false;
    i += 3;
    if (i < src_.size() && is_name_char(src_[i])) return false;
    while (i < src_.size() && is_space(src_[i])) ++i;
    if (src_.compare(i, 3, "-%}") == 0) {
      *body = skip_py_space(src_, i + 3);
      return true;
    }
    if (src_.compare(i, 2, "%}") == 0) {
      *body = i + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t body, size_t tag, bool* line_starting) {
    for (size_t i = src_.find("{%", body); i != std::string::npos; i = src_.find("{%", i + 1)) {
      size_t j = i + 2;
      char sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) sign = src_[j++];
      while (j < src_.size() && is_space(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && is_space(src_[j])) ++j;
      char end_sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_sign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(body, i - body);
      emit_text(control_text(text, sign, true, false), body);
      return after_end(j + 2, end_sign, opt_.trim_blocks, line_starting);
    }
    fail("missing end of raw directive ({% endraw %})", tag);
  }

  size_t lex_comment(size_t body, size_t tag, bool* line_starting) {
    const size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail("missing end of comment tag '#}'", tag);
    char sign = 0;
    if (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) sign = src_[end - 1];
    return after_end(end + 2, sign, opt_.trim_blocks, line_starting);
  }

  size_t lex_tag(char type, size_t pos, size_t tag, bool* line_starting) {
    const bool block = type == '%';
    push(block ? TokenKind::kBlockBegin : TokenKind::kVarBegin, tag);
    std::vector<std::pair<char, size_t>> brackets;
    const char closer = block ? '%' : '}';
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        fail(std::string("unexpected end of template, expected '") + closer + "}'", tag);
      }
      if (brackets.empty()) {
        // Tag ends: `-%}`/`+%}`/`%}` or `-}}`/`}}`, tried before any operator.
        char sign = 0;
        size_t k = pos;
        if (src_[k] == '-' || (block && src_[k] == '+')) sign = src_[k++];
        if (k + 1 < src_.size() && src_[k] == closer && src_[k + 1] == '}') {
          push(block ? TokenKind::kBlockEnd : TokenKind::kVarEnd, pos);
          return after_end(k + 2, sign, block && opt_.trim_blocks, line_starting);
        }
      }
      const char c = src_[pos];
      if (is_name_start(c)) {
        size_t end = pos;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        push(TokenKind::kName, pos, src_.substr(pos, end - pos));
        pos = end;
      } else if (is_digit(c)) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        pos = lex_operator(pos, &brackets);
      }
    }
  }

  size_t lex_number(size_t pos) {
    const size_t start = pos;
    auto digits = [&](size_t i, int base) {
      // Digits with single underscores between them, as Python literals allow.
      const size_t begin = i;
      while (i < src_.size()) {
        const int d = hex_value(src_[i]);
        if (d >= 0 && d < base) {
          ++i;
        } else if (src_[i] == '_' && i > begin && i + 1 < src_.size() && hex_value(src_[i + 1]) >= 0 &&
                   hex_value(src_[i + 1]) < base) {
          ++i;
        } else {
          break;
        }
      }
      return i;
    };
    if (src_[pos] == '0' && pos + 1 < src_.size()) {
      const char p = static_cast<char>(src_[pos + 1] | 0x20);
      const int base = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
      if (base) {
        const size_t end = digits(pos + 2, base);
        if (end == pos + 2) fail("invalid integer literal", start);
        return push_int(start, end, base);
      }
    }
    size_t end = digits(pos, 10);
    // A float needs digits after '.' or an exponent; not after a '.' (so `x.0.1` is
    // attribute access, as in Jinja).
    const bool after_dot = start > 0 && src_[start - 1] == '.';
    bool is_float = false;
    if (!after_dot && end + 1 < src_.size() && src_[end] == '.' && is_digit(src_[end + 1])) {
      end = digits(end + 1, 10);
      is_float = true;
    }
    if (!after_dot && end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t k = end + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      if (k < src_.size() && is_digit(src_[k])) {
        end = digits(k, 10);
        is_float = true;
      }
    }
    if (!is_float) return push_int(start, end, 10);
    const auto v = parse_py_float(std::string_view(src_).substr(start, end - start));
    if (!v) fail("invalid float literal", start);
    Token& t = push(TokenKind::kFloat, start);
    t.float_value = *v;
    return end;
  }

  size_t push_int(size_t start, size_t end, int base) {
    std::string_view text = std::string_view(src_).substr(start, end - start);
    if (base != 10) text.remove_prefix(2);
    const auto v = parse_py_int(text, base);
    if (!v) fail("integer literal out of range", start);
    Token& t = push(TokenKind::kInt, start);
    t.int_value = *v;
    return end;
  }

  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t i = pos + 1;
    while (true) {
      if (i >= src_.size()) fail("unterminated string literal", pos);
      const char c = src_[i];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail("unterminated string literal", pos);
      i = decode_escape(i, &value);
    }
    push(TokenKind::kString, pos, std::move(value));
    return i + 1;
  }

  // Python's unicode-escape decoding of one `\...` sequence at i; returns the next index.
  size_t decode_escape(size_t i, std::string* out) {
    const char e = src_[i + 1];
    auto hex_escape = [&](size_t n) {
      uint32_t cp = 0;
      for (size_t k = 0; k < n; ++k) {
        const size_t at = i + 2 + k;
        const int d = at < src_.size() ? hex_value(src_[at]) : -1;
        if (d < 0) fail("truncated \\x, \\u or \\U escape in string literal", i);
        cp = cp * 16 + static_cast<uint32_t>(d);
      }
      return cp;
    };
    uint32_t cp = 0;
    size_t next = i + 2;
    switch (e) {
      case '\n': return next;  // line continuation
      case '\\': *out += '\\'; return next;
      case '\'': *out += '\''; return next;
      case '"': *out += '"'; return next;
      case 'a': *out += '\a'; return next;
      case 'b': *out += '\b'; return next;
      case 'f': *out += '\f'; return next;
      case 'n': *out += '\n'; return next;
      case 'r': *out += '\r'; return next;
      case 't': *out += '\t'; return next;
      case 'v': *out += '\v'; return next;
      case 'x': cp = hex_escape(2); next = i + 4; break;
      case 'u': cp = hex_escape(4); next = i + 6; break;
      case 'U': cp = hex_escape(8); next = i + 10; break;
      case 'N': fail("\\N{...} escapes are not supported in string literals", i);
      default:
        if (e >= '0' && e <= '7') {
          size_t k = i + 1;
          while (k < i + 4 && k < src_.size() && src_[k] >= '0' && src_[k] <= '7') {
            cp = cp * 8 + static_cast<uint32_t>(src_[k] - '0');
            ++k;
          }
          next = k;
          break;
        }
        // Unknown escapes stay as written, backslash included.
        *out += '\\';
        return i + 1;
    }
    if (cp >= 0xD800 && cp <= 0xDBFF && src_.compare(next, 2, "\\u") == 0) {
      // A surrogate pair written as two \u escapes: combine it.
      const size_t save = i;
      i = next;
      const uint32_t lo = hex_escape(4);
      if (lo >= 0xDC00 && lo <= 0xDFFF) {
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        next += 6;
      }
      i = save;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
      fail("escape in string literal is not a valid Unicode scalar value", i);
    }
    append_utf8(*out, cp);
    return next;
  }

  size_t lex_operator(size_t pos, std::vector<std::pair<char, size_t>>* brackets) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(pos, 2, op) == 0) {
        push(TokenKind::kOp, pos, std::string(op));
        return pos + 2;
      }
    }
    const char c = src_[pos];
    static constexpr std::string_view kOne = "+-/*%~[](){}<>=.:|,;";
    if (kOne.find(c) == std::string_view::npos) {
      char buf[64];
      if (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7F) {
        std::snprintf(buf, sizeof(buf), "unexpected character '%c'", c);
      } else {
        std::snprintf(buf, sizeof(buf), "unexpected byte 0x%02x", static_cast<unsigned char>(c));
      }
      fail(buf, pos);
    }
    if (c == '(' || c == '[' || c == '{') {
      if (brackets->size() >= kMaxBracketDepth) fail("brackets nested too deeply", pos);
      brackets->emplace_back(c == '(' ? ')' : c == '[' ? ']' : '}', pos);
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty()) fail(std::string("unexpected '") + c + "'", pos);
      if (brackets->back().first != c) {
        fail(std::string("unexpected '") + c + "', expected '" + brackets->back().first + "'", pos);
      }
      brackets->pop_back();
    }
    push(TokenKind::kOp, pos, std::string(1, c));
    return pos + 1;
  }

  static constexpr size_t kMaxBracketDepth = 256;

  std::string src_;
  LexOptions opt_;
  std::vector<Token> tokens_;
};

}  // namespace

LexResult lex(std::string_view source, const LexOptions& options) {
  return Lexer(normalize_newlines(source), options).run();
}

LineColumn line_column(std::string_view source, uint32_t offset) {
  LineColumn lc;
  const size_t end = std::min<size_t>(offset, source.size());
  size_t line_start = 0;
  for (size_t i = 0; i < end; ++i) {
    if (source[i] == '\n') {
      ++lc.line;
      line_start = i + 1;
    }
  }
  lc.column = static_cast<uint32_t>(end - line_start + 1);
  return lc;
}

std::string describe_location(std::string_view source, uint32_t offset) {
  const LineColumn lc = line_column(source, offset);
  return "line " + std::to_string(lc.line) + ", column " + std::to_string(lc.column);
}

}  // namespace metro::jinja
