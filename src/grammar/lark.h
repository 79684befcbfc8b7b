// Lark-style EBNF, the grammar text of Python's Lark (which LLGuidance reads too), compiled
// to a byte-level grammar: `metro.grammar` takes it beside GBNF, and text_grammar() tells
// the two apart.
//
//   grammar    := (definition | directive)*    the rule `start` is where the text starts
//   definition := ("?" | "!")? NAME ("." PRIORITY)? ":" alts
//   alts       := alias ("|" alias)*
//   alias      := seq ("->" NAME)?
//   seq        := (item quantifier?)*
//   item       := NAME | "literal" | "literal"i | "a".."z" | /regex/ | "(" alts ")" | "[" alts "]"
//   quantifier := "*" | "+" | "?" | "~" N | "~" N ".." M   (at most 4096)
//   directive  := "%ignore" alts | "%import common." NAME ("->" NAME)?
//               | "%import common (" NAME ("," NAME)* ")"
//
// Lower-case names are rules, upper-case ones terminals (after any leading '_'); a terminal
// uses only terminals. Rule modifiers ('?', '!'), priorities and aliases ('->') shape Lark's
// parse tree, not its language, and are read and ignored. Literals take the escapes \n \t
// \r \\ \" \xHH \uHHHH (ASCII) and any UTF-8 text; "..."i matches ASCII letters in either
// case; a range's ends are single ASCII characters. Regular expressions are those of
// regex.h, without flags. `//` and `#` start comments. `%import common` offers Lark's
// common terminals: DIGIT, HEXDIGIT, INT, SIGNED_INT, DECIMAL, FLOAT, SIGNED_FLOAT, NUMBER,
// SIGNED_NUMBER, ESCAPED_STRING, LCASE_LETTER, UCASE_LETTER, LETTER, WORD, CNAME,
// WS_INLINE, WS, CR, LF, NEWLINE, SH_COMMENT, CPP_COMMENT, C_COMMENT, SQL_COMMENT.
//
// The language is a scannerless reading of the grammar: a terminal's text is matched as
// part of one context-free grammar over bytes, and what %ignore names may stand before
// every terminal a rule uses (a literal or regex written in a rule is a terminal) and at
// the end of the text. That is what Lark's Earley parser with lexer="dynamic_complete"
// accepts (the fixture test checks it against Lark itself) but for one thing: Lark cuts an
// ignored terminal at its regular expression's greedy match, metro anywhere it matches, so
// with `%ignore /\/\/[^\n]*/` metro also reads "//x" as a comment "//" and a name "x".
// Lark's other lexers read more texts differently: they cut every terminal by longest
// match, so two terminals written with nothing between them can lex as one.
//
// Direct left recursion, Lark's usual way of writing lists and operators (`sum: sum "+"
// term | term`), is read as the repetition it means (`term ("+" term)*`).
//
// Refused, by name: other libraries and relative imports, %declare, %override, %extend,
// rule templates (`name{...}`), regular expression flags, a terminal using a rule, an
// undefined or twice-defined name, no `start`, left recursion through other rules or
// through something that can match nothing, and the size bounds of GBNF (256 KiB of text,
// 1024 named rules and terminals, 1M elements, nesting 64 deep).
#pragma once

#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::grammar {

Expected<Grammar> lark_grammar(std::string_view text);

// Whether grammar text reads as Lark (its first definition is `name:` or a `%` directive)
// rather than GBNF (`name ::=`).
bool looks_like_lark(std::string_view text);

// `metro.grammar`: GBNF or Lark, as looks_like_lark() tells.
Expected<Grammar> text_grammar(std::string_view text);

}  // namespace metro::grammar
