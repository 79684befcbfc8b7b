// Splits template text into tokens the way Jinja's lexer does with Hugging Face's settings
// (trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=False):
//
// - Newlines (\r\n, \r, \n) become \n and one trailing newline of the template is dropped.
// - `{%- `, `{{-`, `{#-` strip all whitespace before the tag; `-%}`, `-}}`, `-#}` after it.
// - trim_blocks: one newline right after `%}` or `#}` is dropped (`+%}` keeps it).
// - lstrip_blocks: spaces and tabs between a line start and `{%` or `{#` are dropped
//   (`{%+` keeps them); `{{` is never lstripped.
// - `{# #}` comments vanish; `{% raw %}...{% endraw %}` becomes text.
//
// Text between tags comes out as kText tokens with whitespace control already applied.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace metro::jinja {

enum class TokenKind : uint8_t {
  kText,
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the decoded value
  kInt,
  kFloat,
  kOp,          // text holds the operator
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  uint32_t offset = 0;  // into the normalized source
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

struct LexResult {
  std::string source;  // newline-normalized; token offsets point into it
  std::vector<Token> tokens;  // ends with kEof
};

// \r\n and \r become \n; one trailing newline is dropped. Offsets in errors refer to this.
std::string normalize_newlines(std::string_view source);

// Throws jinja::Error(kSyntax) with the offset of the problem.
LexResult lex(std::string_view source, const LexOptions& options = {});

struct LineColumn {
  uint32_t line = 1;    // 1-based
  uint32_t column = 1;  // 1-based, in bytes
};
LineColumn line_column(std::string_view source, uint32_t offset);

// "line 3, column 14" for error messages.
std::string describe_location(std::string_view source, uint32_t offset);

}  // namespace metro::jinja
