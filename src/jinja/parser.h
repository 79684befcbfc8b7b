// Builds the syntax tree (ast.h) of a template from its tokens, following Jinja's
// grammar and operator precedence (lowest first): `x if c else y`, or, and, not,
// comparisons (==, !=, <, <=, >, >=, in, not in; chained), + and -, ~, * / // %, **,
// unary - and +, then primaries with postfix `.attr`, `[key]`, `[a:b:c]`, `(args)` and
// the filter/test suffixes `| f(args)` and `is [not] t(args)`.
//
// Statements: if/elif/else, for (loop `if` filter, else), set (expression, tuple unpacking,
// namespace attribute, block form), macro, call, filter, raw, break/continue, and HF's
// generation tag. include/import/extends/block are refused: the sandbox has no files.
#pragma once

#include <memory>
#include <string_view>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace metro::jinja {

// Expression trees taller than this are syntax errors (a left-deep chain like
// `a + a + a + ...` would otherwise recurse once per term when evaluated and destroyed).
inline constexpr uint32_t kMaxExprHeight = 200;

// Throws jinja::Error(kSyntax) naming the offset of the offending token.
std::unique_ptr<Program> parse_template(std::string_view source, const LexOptions& options = {});

}  // namespace metro::jinja
