#include "jinja/parser.h"

#include "jinja/builtins.h"
#include "jinja/parser_impl.h"

namespace metro::jinja {
namespace detail {

// ---- statements -------------------------------------------------------------------------

// Parses statements until a `{% name %}` with name in `end_tags`, leaving the parser just
// after that name (the caller parses the rest of the tag). With no end tags, parses to
// the end of the template.
Body Parser::parse_body(std::initializer_list<std::string_view> end_tags, std::string_view* found,
                const char* block, uint32_t block_offset) {
  Nesting guard(*this);
  Body body;
  while (true) {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kEof:
        if (end_tags.size() != 0) {
          fail(std::string("unexpected end of template: the '") + block +
                   "' block is not closed (expected " + quote_list(end_tags) + ")",
               Token{TokenKind::kEof, block_offset});
        }
        return body;
      case TokenKind::kText: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kText;
        s->offset = t.offset;
        s->text = next().text;
        body.push_back(std::move(s));
        break;
      }
      case TokenKind::kVarBegin: {
        auto s = std::make_unique<Stmt>();
        s->kind = StmtKind::kOutput;
        s->offset = next().offset;
        s->expr = parse_tuple(true, false);
        if (peek().kind != TokenKind::kVarEnd) unexpected(describe(Token{TokenKind::kVarEnd}));
        next();
        body.push_back(std::move(s));
        break;
      }
      case TokenKind::kBlockBegin: {
        const Token& name = peek(1);
        if (name.kind != TokenKind::kName) {
          fail("expected a statement name after '{%', got " + describe(name), name);
        }
        for (std::string_view end : end_tags) {
          if (name.text == end) {
            next();
            *found = end;
            next();
            return body;
          }
        }
        if (is_closing_tag(name.text)) {
          std::string msg = "unexpected '" + name.text + "'";
          if (block != nullptr) {
            msg += " (expected " + quote_list(end_tags) + " to close the '" + block +
                   "' block at " + describe_location(lexed_.source, block_offset) + ")";
          }
          fail(msg, name);
        }
        next();
        body.push_back(parse_statement(t.offset));
        break;
      }
      default:
        fail("unexpected " + describe(t), t);
    }
  }
}

bool Parser::is_closing_tag(const std::string& name) {
  return name == "else" || name == "elif" || name.rfind("end", 0) == 0;
}

std::unique_ptr<Stmt> Parser::parse_statement(uint32_t offset) {
  const Token& name = next();
  const std::string& n = name.text;
  auto s = std::make_unique<Stmt>();
  s->offset = offset;
  if (n == "if") {
    parse_if(*s);
  } else if (n == "for") {
    parse_for(*s);
  } else if (n == "set") {
    parse_set(*s);
  } else if (n == "macro") {
    parse_macro(*s);
  } else if (n == "call") {
    parse_call_block(*s);
  } else if (n == "filter") {
    parse_filter_block(*s);
  } else if (n == "break" || n == "continue") {
    if (loop_depth_ == 0) fail("'" + n + "' outside of a for loop", name);
    s->kind = n == "break" ? StmtKind::kBreak : StmtKind::kContinue;
    expect_block_end();
  } else if (n == "generation") {
    // Hugging Face's tag marking assistant text; rendering is unchanged.
    s->kind = StmtKind::kScope;
    expect_block_end();
    std::string_view found;
    s->body = parse_body({"endgeneration"}, &found, "generation", offset);
    expect_block_end();
  } else if (n == "include" || n == "import" || n == "from" || n == "extends" ||
             n == "block") {
    fail("'" + n + "' is not supported: chat templates cannot load other templates", name);
  } else {
    fail("unknown tag '" + n + "'", name);
  }
  return s;
}

void Parser::parse_if(Stmt& s) {
  s.kind = StmtKind::kIf;
  Soft soft(*this, true);
  while (true) {
    IfBranch branch;
    branch.condition = parse_tuple(true, false);
    expect_block_end();
    std::string_view found;
    branch.body = parse_body({"elif", "else", "endif"}, &found, "if", s.offset);
    s.branches.push_back(std::move(branch));
    if (found == "elif") continue;
    if (found == "else") {
      expect_block_end();
      IfBranch last;
      last.body = parse_body({"endif"}, &found, "if", s.offset);
      s.branches.push_back(std::move(last));
    }
    expect_block_end();
    return;
  }
}

void Parser::parse_for(Stmt& s) {
  s.kind = StmtKind::kFor;
  s.targets = parse_assign_names();
  if (!skip_name("in")) unexpected("'in'");
  s.expr = parse_tuple(false, false);
  if (skip_name("if")) {
    Soft inner(*this, false);
    s.filter = parse_expression();
  }
  if (at_name("recursive")) fail("recursive for loops are not supported", peek());
  expect_block_end();
  ++loop_depth_;
  std::string_view found;
  {
    Soft inner(*this, false);
    s.body = parse_body({"endfor", "else"}, &found, "for", s.offset);
  }
  --loop_depth_;
  if (found == "else") {
    expect_block_end();
    // break/continue in the else block belong to an enclosing loop, if any.
    s.else_body = parse_body({"endfor"}, &found, "for", s.offset);
  }
  expect_block_end();
}

// `a` or `a, b` or `(a, b)`: names for for-loops and set.
std::vector<std::string> Parser::parse_assign_names() {
  std::vector<std::string> names;
  const bool parens = skip_op("(");
  do {
    if (parens && at_op(")")) break;
    names.push_back(expect_name());
  } while (skip_op(","));
  if (parens) expect_op(")");
  return names;
}

void Parser::parse_set(Stmt& s) {
  if (peek().kind == TokenKind::kName && at_op(".", 1)) {
    s.targets.push_back(next().text);
    next();
    s.attr = expect_name();
  } else {
    s.targets = parse_assign_names();
  }
  if (skip_op("=")) {
    s.kind = StmtKind::kSet;
    s.expr = parse_tuple(true, false);
    expect_block_end();
    return;
  }
  if (!s.attr.empty() || s.targets.size() != 1) unexpected("'='");
  s.kind = StmtKind::kSetBlock;
  if (at_op("|")) fail("filters on block set are not supported", peek());
  expect_block_end();
  std::string_view found;
  Soft inner(*this, false);
  s.body = parse_body({"endset"}, &found, "set", s.offset);
  expect_block_end();
}

void Parser::parse_params(MacroDef& m) {
  expect_op("(");
  while (!at_op(")")) {
    if (!m.params.empty()) expect_op(",");
    if (at_op(")")) break;
    m.params.push_back(expect_name());
    m.defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
  }
  expect_op(")");
}

void Parser::parse_macro(Stmt& s) {
  s.kind = StmtKind::kMacro;
  Soft inner(*this, false);
  s.macro.name = expect_name();
  parse_params(s.macro);
  expect_block_end();
  const uint32_t saved_loops = loop_depth_;
  loop_depth_ = 0;  // break/continue cannot cross a macro boundary
  std::string_view found;
  s.macro.body = parse_body({"endmacro"}, &found, "macro", s.offset);
  loop_depth_ = saved_loops;
  expect_block_end();
}

void Parser::parse_call_block(Stmt& s) {
  s.kind = StmtKind::kCallBlock;
  s.macro.name = "caller";
  if (at_op("(")) parse_params(s.macro);
  s.expr = parse_expression();
  if (s.expr->kind != ExprKind::kCall) fail("expected a call after 'call'", toks_[pos_]);
  expect_block_end();
  const uint32_t saved_loops = loop_depth_;
  loop_depth_ = 0;
  std::string_view found;
  Soft inner(*this, false);
  s.body = parse_body({"endcall"}, &found, "call", s.offset);
  loop_depth_ = saved_loops;
  expect_block_end();
}

void Parser::parse_filter_block(Stmt& s) {
  s.kind = StmtKind::kFilterBlock;
  Soft inner(*this, false);
  do {
    s.filters.push_back(parse_filter(nullptr));
  } while (skip_op("|"));
  expect_block_end();
  std::string_view found;
  s.body = parse_body({"endfilter"}, &found, "filter", s.offset);
  expect_block_end();
}

}  // namespace detail

std::unique_ptr<Program> parse_template(std::string_view source, const LexOptions& options) {
  return detail::Parser(lex(source, options)).run();
}

}  // namespace metro::jinja
