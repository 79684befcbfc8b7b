// The Jinja parser (internal to jinja/): a recursive-descent parser over the lexer's
// tokens. Statements are parsed in parser.cpp, expressions in parse_expr.cpp.
#pragma once

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/error.h"
#include "jinja/lexer.h"
#include "jinja/limits.h"
#include "jinja/parser.h"

namespace metro::jinja::detail {

inline std::string describe(const Token& t) {
  switch (t.kind) {
    case TokenKind::kText: return "text";
    case TokenKind::kVarBegin: return "'{{'";
    case TokenKind::kVarEnd: return "end of print statement '}}'";
    case TokenKind::kBlockBegin: return "'{%'";
    case TokenKind::kBlockEnd: return "end of statement block '%}'";
    case TokenKind::kName: return "'" + t.text + "'";
    case TokenKind::kString: return "string literal";
    case TokenKind::kInt: return "integer literal";
    case TokenKind::kFloat: return "float literal";
    case TokenKind::kOp: return "'" + t.text + "'";
    case TokenKind::kEof: return "end of template";
  }
  return "token";
}

inline std::string quote_list(std::initializer_list<std::string_view> names) {
  std::string s;
  for (std::string_view n : names) {
    if (!s.empty()) s += " or ";
    s += "'";
    s += n;
    s += "'";
  }
  return s;
}

class Parser {
 public:
  explicit Parser(LexResult lexed) : lexed_(std::move(lexed)), toks_(lexed_.tokens) {}

  std::unique_ptr<Program> run() {
    auto program = std::make_unique<Program>();
    std::string_view found;
    program->body = parse_body({}, &found, nullptr, 0);
    if (!unknown_names_.empty()) fail(unknown_names_.front().message, unknown_names_.front().at);
    program->source = std::move(lexed_.source);
    return program;
  }

 private:
  // ---- token helpers ----------------------------------------------------------------------

  const Token& peek(size_t k = 0) const { return toks_[std::min(pos_ + k, toks_.size() - 1)]; }
  const Token& next() {
    const Token& t = peek();
    if (pos_ < toks_.size() - 1) ++pos_;
    return t;
  }
  bool at_op(std::string_view op, size_t k = 0) const {
    return peek(k).kind == TokenKind::kOp && peek(k).text == op;
  }
  bool at_name(std::string_view name, size_t k = 0) const {
    return peek(k).kind == TokenKind::kName && peek(k).text == name;
  }
  bool skip_op(std::string_view op) {
    if (!at_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!at_name(name)) return false;
    next();
    return true;
  }

  [[noreturn]] void fail(const std::string& msg, const Token& at) const {
    throw Error(ErrorKind::kSyntax, msg, at.offset);
  }
  [[noreturn]] void unexpected(const std::string& expected) const {
    fail("expected " + expected + ", got " + describe(peek()), peek());
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op)) unexpected("'" + std::string(op) + "'");
  }
  std::string expect_name() {
    if (peek().kind != TokenKind::kName) unexpected("a name");
    return next().text;
  }
  void expect_block_end() {
    if (peek().kind != TokenKind::kBlockEnd) unexpected(describe(Token{TokenKind::kBlockEnd}));
    next();
  }

  // Jinja checks filter and test names at compile time, except inside an if-statement or
  // a conditional expression (its "soft" frames), where an unknown name only fails if it
  // is actually applied at run time. New scopes (for bodies, macros, call and filter
  // blocks, block set) are not soft again.
  class Soft {
   public:
    Soft(Parser& p, bool soft) : p_(p), saved_(p.soft_) { p_.soft_ = soft; }
    ~Soft() { p_.soft_ = saved_; }
    Soft(const Soft&) = delete;
    Soft& operator=(const Soft&) = delete;

   private:
    Parser& p_;
    bool saved_;
  };

  void unknown_name(const std::string& message, const Token& at) {
    if (!soft_) unknown_names_.push_back({message, at});
  }

  // Guards recursion: brackets, blocks, `not`/unary chains and nested conditionals.
  class Nesting {
   public:
    explicit Nesting(Parser& p) : p_(p) {
      if (++p_.nesting_ > kMaxParseNesting) {
        p_.fail("template nested deeper than " + std::to_string(kMaxParseNesting) + " levels",
                p_.peek());
      }
    }
    ~Nesting() { --p_.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;

   private:
    Parser& p_;
  };

  ExprPtr node(ExprKind kind, uint32_t offset) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->offset = offset;
    return e;
  }

  // Checks the height of a finished composite node (see kMaxExprHeight).
  ExprPtr finish(ExprPtr e) {
    uint32_t h = 0;
    for (const auto& c : e->children) {
      if (c) h = std::max(h, height_of(*c));
    }
    for (const auto& kw : e->kwargs) h = std::max(h, height_of(*kw.value));
    if (h + 1 > kMaxExprHeight) {
      throw Error(ErrorKind::kSyntax,
                  "expression nested deeper than " + std::to_string(kMaxExprHeight) + " levels",
                  e->offset);
    }
    e->height = h + 1;
    return e;
  }
  static uint32_t height_of(const Expr& e) { return e.height; }

  // ---- statements -------------------------------------------------------------------------
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string_view* found,
                  const char* block, uint32_t block_offset);
  static bool is_closing_tag(const std::string& name);
  std::unique_ptr<Stmt> parse_statement(uint32_t offset);
  void parse_if(Stmt& s);
  void parse_for(Stmt& s);
  std::vector<std::string> parse_assign_names();
  void parse_set(Stmt& s);
  void parse_params(MacroDef& m);
  void parse_macro(Stmt& s);
  void parse_call_block(Stmt& s);
  void parse_filter_block(Stmt& s);

  // ---- expressions ------------------------------------------------------------------------
  ExprPtr parse_expression();
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens);
  bool tuple_ends(bool explicit_parens) const;
  ExprPtr parse_condexpr(bool with_condexpr);
  ExprPtr binary(BinaryOp op, ExprPtr left, ExprPtr right, uint32_t offset);
  ExprPtr parse_or();
  ExprPtr parse_and();
  ExprPtr parse_not();
  ExprPtr parse_compare();
  ExprPtr parse_math1();
  ExprPtr parse_concat();
  ExprPtr parse_math2();
  ExprPtr parse_pow();
  ExprPtr parse_unary(bool with_filter);
  ExprPtr parse_primary();
  ExprPtr parse_list();
  ExprPtr parse_dict();
  ExprPtr parse_postfix(ExprPtr e);
  ExprPtr parse_subscript(ExprPtr obj);
  void parse_call_args(Expr& e);
  ExprPtr parse_call(ExprPtr callee);
  std::string parse_dotted_name();
  ExprPtr parse_filter(ExprPtr operand);
  ExprPtr parse_filter_expr(ExprPtr e);
  ExprPtr parse_test(ExprPtr operand);

  LexResult lexed_;
  const std::vector<Token>& toks_;
  size_t pos_ = 0;
  uint32_t nesting_ = 0;
  uint32_t loop_depth_ = 0;
  bool soft_ = false;
  struct UnknownName {
    std::string message;
    Token at;
  };
  std::vector<UnknownName> unknown_names_;  // reported when parsing ends
};

}  // namespace metro::jinja::detail
