// GBNF, the grammar text llama.cpp reads, compiled to a byte-level grammar: `metro.grammar`.
//
//   grammar  := rule+                      the rule named `root` is where the text starts
//   rule     := NAME "::=" alts            a rule runs until the next `NAME ::=`
//   alts     := seq ("|" seq)*
//   seq      := (item quantifier?)*
//   item     := NAME | "literal" | [class] | "." | "(" alts ")"
//   quantifier := "*" | "+" | "?" | "{m}" | "{m,}" | "{m,n}"   (n at most 4096)
//
// Names are letters, digits, '-' and '_'. Literals are any UTF-8 text with the escapes \n \t \f
// \r \\ \" \xHH \uHHHH (ASCII); classes hold ASCII characters and ranges, negated with a
// leading ^ (matching every other character, multi-byte ones included), with the same
// escapes; '.' is any character. '#' starts a comment to the end of the line; whitespace
// and newlines separate items anywhere. Refused, naming the rule or place: an undefined or
// twice-defined rule, no `root`, left recursion (a rule that reaches itself before any
// byte), non-ASCII inside a class, more than 1M grammar elements, nesting deeper than 64.
#pragma once

#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::grammar {

Expected<Grammar> gbnf_grammar(std::string_view text);

}  // namespace metro::grammar
