// Regular expressions compiled to grammar elements: `metro.regex` (the whole output matches)
// and a JSON schema's string `pattern` (the string's contents contain a match, as JSON
// Schema's ECMAScript semantics say, unless anchored with ^ and $).
//
// Syntax (the common subset of ECMAScript and Python `re`): literals (any UTF-8 text),
// `.` (any character but a newline), classes `[...]` and `[^...]` of ASCII characters and
// ranges, escapes \d \D \w \W \s \S \t \n \r \f \v \xHH \uHHHH and any escaped punctuation,
// groups `(...)`, `(?:...)`, `(?<name>...)`, `(?P<name>...)`, alternation `|`, quantifiers
// `*` `+` `?` `{n}` `{n,}` `{n,m}` (m <= 4096; a lazy `?` after one changes no language),
// and `^` / `$` at the very start / end. Refused, by name: backreferences, lookaround, `\b`
// and `\B`, inline flags, possessive quantifiers, non-ASCII characters inside a class.
// A negated class or `\D`-like escape matches every character outside it, multi-byte
// UTF-8 ones included.
#pragma once

#include <optional>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::grammar {

struct RegexOptions {
  // The text sits inside a JSON string: `"`, `\` and control characters the pattern asks
  // for are written escaped (\", \\, \n, \t, \r); other control characters cannot be.
  bool json_string = false;
  // Search semantics (JSON Schema `pattern`): without a leading ^ any text may precede the
  // match, without a trailing $ any may follow, drawn from `any_char`.
  bool search = false;
  std::optional<Element> any_char;  // required when search is set
};

// The pattern as an element of b's grammar; errors name what is not supported and where.
Expected<Element> regex_element(Builder& b, std::string_view pattern, const RegexOptions& opts);
// A grammar whose sentences are exactly the texts the pattern matches whole.
Expected<Grammar> regex_grammar(std::string_view pattern);

}  // namespace metro::grammar
