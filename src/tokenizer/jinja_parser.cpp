#include "tokenizer/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "tokenizer/jinja_builtins.h"
#include "tokenizer/jinja_error.h"
#include "tokenizer/jinja_limits.h"

namespace metro::tokenizer::jinja {
namespace {

std::string describe(const Token& t) {
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

std::string quote_list(std::initializer_list<std::string_view> names) {
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

  // Parses statements until a `{% name %}` with name in `end_tags`, leaving the parser just
  // after that name (the caller parses the rest of the tag). With no end tags, parses to
  // the end of the template.
  Body parse_body(std::initializer_list<std::string_view> end_tags, std::string_view* found,
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

  static bool is_closing_tag(const std::string& name) {
    return name == "else" || name == "elif" || name.rfind("end", 0) == 0;
  }

  std::unique_ptr<Stmt> parse_statement(uint32_t offset) {
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

  void parse_if(Stmt& s) {
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

  void parse_for(Stmt& s) {
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
  std::vector<std::string> parse_assign_names() {
    std::vector<std::string> names;
    const bool parens = skip_op("(");
    do {
      if (parens && at_op(")")) break;
      names.push_back(expect_name());
    } while (skip_op(","));
    if (parens) expect_op(")");
    return names;
  }

  void parse_set(Stmt& s) {
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

  void parse_params(MacroDef& m) {
    expect_op("(");
    while (!at_op(")")) {
      if (!m.params.empty()) expect_op(",");
      if (at_op(")")) break;
      m.params.push_back(expect_name());
      m.defaults.push_back(skip_op("=") ? parse_expression() : nullptr);
    }
    expect_op(")");
  }

  void parse_macro(Stmt& s) {
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

  void parse_call_block(Stmt& s) {
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

  void parse_filter_block(Stmt& s) {
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

  // ---- expressions ------------------------------------------------------------------------

  ExprPtr parse_expression() { return parse_condexpr(true); }

  // Comma-separated expressions: one is returned as is, several become a tuple.
  ExprPtr parse_tuple(bool with_condexpr, bool explicit_parens) {
    const uint32_t offset = peek().offset;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
      }
      if (tuple_ends(explicit_parens)) break;
      items.push_back(parse_condexpr(with_condexpr));
    }
    if (items.size() == 1 && !saw_comma) return std::move(items[0]);
    if (items.empty() && !explicit_parens) unexpected("an expression");
    auto t = node(ExprKind::kTuple, offset);
    t->children = std::move(items);
    return finish(std::move(t));
  }

  bool tuple_ends(bool explicit_parens) const {
    const Token& t = peek();
    if (t.kind == TokenKind::kVarEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEof) {
      return true;
    }
    return explicit_parens && at_op(")");
  }

  ExprPtr parse_condexpr(bool with_condexpr) {
    Nesting guard(*this);
    const size_t unknown_mark = unknown_names_.size();
    ExprPtr expr = parse_or();
    while (with_condexpr && at_name("if")) {
      // The whole conditional expression is soft, its first operand included.
      unknown_names_.resize(unknown_mark);
      Soft soft(*this, true);
      const uint32_t offset = next().offset;
      auto c = node(ExprKind::kCondition, offset);
      ExprPtr cond = parse_or();
      ExprPtr otherwise = skip_name("else") ? parse_condexpr(true) : nullptr;
      c->children.push_back(std::move(expr));
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(otherwise));
      expr = finish(std::move(c));
    }
    return expr;
  }

  ExprPtr binary(BinaryOp op, ExprPtr left, ExprPtr right, uint32_t offset) {
    auto b = node(ExprKind::kBinary, offset);
    b->binary_op = op;
    b->children.push_back(std::move(left));
    b->children.push_back(std::move(right));
    return finish(std::move(b));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const uint32_t offset = next().offset;
      left = binary(BinaryOp::kOr, std::move(left), parse_and(), offset);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const uint32_t offset = next().offset;
      left = binary(BinaryOp::kAnd, std::move(left), parse_not(), offset);
    }
    return left;
  }

  ExprPtr parse_not() {
    if (at_name("not")) {
      Nesting guard(*this);
      auto n = node(ExprKind::kUnary, next().offset);
      n->unary_op = UnaryOp::kNot;
      n->children.push_back(parse_not());
      return finish(std::move(n));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const uint32_t offset = peek().offset;
    ExprPtr first = parse_math1();
    std::vector<CompareOp> ops;
    std::vector<ExprPtr> operands;
    while (true) {
      CompareOp op;
      if (at_op("==")) {
        op = CompareOp::kEq;
      } else if (at_op("!=")) {
        op = CompareOp::kNe;
      } else if (at_op("<")) {
        op = CompareOp::kLt;
      } else if (at_op("<=")) {
        op = CompareOp::kLe;
      } else if (at_op(">")) {
        op = CompareOp::kGt;
      } else if (at_op(">=")) {
        op = CompareOp::kGe;
      } else if (at_name("in")) {
        op = CompareOp::kIn;
      } else if (at_name("not") && at_name("in", 1)) {
        next();
        op = CompareOp::kNotIn;
      } else {
        break;
      }
      next();
      ops.push_back(op);
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto c = node(ExprKind::kCompare, offset);
    c->compare_ops = std::move(ops);
    c->children.push_back(std::move(first));
    for (auto& o : operands) c->children.push_back(std::move(o));
    return finish(std::move(c));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_op("+") || at_op("-")) {
      const Token& t = next();
      const BinaryOp op = t.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
      left = binary(op, std::move(left), parse_concat(), t.offset);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_op("~")) {
      const uint32_t offset = next().offset;
      left = binary(BinaryOp::kConcat, std::move(left), parse_math2(), offset);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const Token& t = next();
      const BinaryOp op = t.text == "*"   ? BinaryOp::kMul
                          : t.text == "/" ? BinaryOp::kDiv
                          : t.text == "//" ? BinaryOp::kFloorDiv
                                           : BinaryOp::kMod;
      left = binary(op, std::move(left), parse_pow(), t.offset);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_op("**")) {
      const uint32_t offset = next().offset;
      left = binary(BinaryOp::kPow, std::move(left), parse_unary(true), offset);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    Nesting guard(*this);
    ExprPtr e;
    if (at_op("-") || at_op("+")) {
      const Token& t = next();
      auto u = node(ExprKind::kUnary, t.offset);
      u->unary_op = t.text == "-" ? UnaryOp::kNeg : UnaryOp::kPos;
      u->children.push_back(parse_unary(false));
      e = finish(std::move(u));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    switch (t.kind) {
      case TokenKind::kName: {
        next();
        auto e = node(ExprKind::kLiteral, t.offset);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = ExprKind::kName;
          e->name = t.text;
        }
        return e;
      }
      case TokenKind::kString: {
        std::string s = next().text;
        while (peek().kind == TokenKind::kString) s += next().text;  // "a" "b" concatenates
        auto e = node(ExprKind::kLiteral, t.offset);
        e->literal = Value::string(std::move(s));
        return e;
      }
      case TokenKind::kInt: {
        auto e = node(ExprKind::kLiteral, next().offset);
        e->literal = Value::integer(t.int_value);
        return e;
      }
      case TokenKind::kFloat: {
        auto e = node(ExprKind::kLiteral, next().offset);
        e->literal = Value::number(t.float_value);
        return e;
      }
      case TokenKind::kOp:
        if (t.text == "(") {
          next();
          ExprPtr e = parse_tuple(true, true);
          expect_op(")");
          return e;
        }
        if (t.text == "[") return parse_list();
        if (t.text == "{") return parse_dict();
        break;
      default:
        break;
    }
    unexpected("an expression");
  }

  ExprPtr parse_list() {
    auto e = node(ExprKind::kList, next().offset);
    while (!at_op("]")) {
      if (!e->children.empty()) {
        expect_op(",");
        if (at_op("]")) break;
      }
      e->children.push_back(parse_expression());
    }
    expect_op("]");
    return finish(std::move(e));
  }

  ExprPtr parse_dict() {
    auto e = node(ExprKind::kDict, next().offset);
    while (!at_op("}")) {
      if (!e->children.empty()) {
        expect_op(",");
        if (at_op("}")) break;
      }
      e->children.push_back(parse_expression());
      expect_op(":");
      e->children.push_back(parse_expression());
    }
    expect_op("}");
    return finish(std::move(e));
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (at_op(".")) {
        const uint32_t offset = next().offset;
        if (peek().kind == TokenKind::kInt) {
          // `x.0` is `x[0]`.
          auto key = node(ExprKind::kLiteral, peek().offset);
          key->literal = Value::integer(next().int_value);
          auto g = node(ExprKind::kGetItem, offset);
          g->children.push_back(std::move(e));
          g->children.push_back(std::move(key));
          e = finish(std::move(g));
          continue;
        }
        auto g = node(ExprKind::kGetAttr, offset);
        g->name = expect_name();
        g->children.push_back(std::move(e));
        e = finish(std::move(g));
      } else if (at_op("[")) {
        e = parse_subscript(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr obj) {
    Nesting guard(*this);
    const uint32_t offset = next().offset;  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    for (int i = 0; i < 3; ++i) {
      if (i > 0) {
        if (!skip_op(":")) break;
        is_slice = true;
      }
      if (!at_op(":") && !at_op("]")) parts[i] = parse_expression();
      if (i == 0 && !at_op(":")) break;
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) unexpected("a subscript");
      auto g = node(ExprKind::kGetItem, offset);
      g->children.push_back(std::move(obj));
      g->children.push_back(std::move(parts[0]));
      return finish(std::move(g));
    }
    auto s = node(ExprKind::kSlice, offset);
    s->children.push_back(std::move(obj));
    for (auto& p : parts) s->children.push_back(std::move(p));
    return finish(std::move(s));
  }

  // Arguments after '(' into `e` (children after the first, and kwargs).
  void parse_call_args(Expr& e) {
    Nesting guard(*this);
    expect_op("(");
    bool first = true;
    while (!at_op(")")) {
      if (!first) {
        expect_op(",");
        if (at_op(")")) break;
      }
      first = false;
      if (at_op("*") || at_op("**")) fail("*args and **kwargs are not supported", peek());
      if (peek().kind == TokenKind::kName && at_op("=", 1)) {
        Keyword kw;
        kw.name = next().text;
        next();
        kw.value = parse_expression();
        e.kwargs.push_back(std::move(kw));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after a keyword argument", peek());
        e.children.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto c = node(ExprKind::kCall, peek().offset);
    c->children.push_back(std::move(callee));
    parse_call_args(*c);
    return finish(std::move(c));
  }

  // Jinja allows dotted filter and test names; none of ours have dots.
  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (at_op(".")) {
      next();
      name += "." + expect_name();
    }
    return name;
  }

  ExprPtr parse_filter(ExprPtr operand) {
    const Token& at = peek();
    auto f = node(ExprKind::kFilter, at.offset);
    f->name = parse_dotted_name();
    if (!is_filter_name(f->name)) unknown_name("no filter named '" + f->name + "'", at);
    f->children.push_back(std::move(operand));
    if (at_op("(")) parse_call_args(*f);
    return finish(std::move(f));
  }

  ExprPtr parse_filter_expr(ExprPtr e) {
    while (true) {
      if (at_op("|")) {
        next();
        e = parse_filter(std::move(e));
      } else if (at_name("is")) {
        next();
        e = parse_test(std::move(e));
      } else if (at_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_test(ExprPtr operand) {
    const bool negated = skip_name("not");
    const Token& at = peek();
    auto t = node(ExprKind::kTest, at.offset);
    t->negated = negated;
    t->name = parse_dotted_name();
    if (!is_test_name(t->name)) unknown_name("no test named '" + t->name + "'", at);
    t->children.push_back(std::move(operand));
    const Token& n = peek();
    const bool arg_start = n.kind == TokenKind::kName || n.kind == TokenKind::kString ||
                           n.kind == TokenKind::kInt || n.kind == TokenKind::kFloat ||
                           at_op("[") || at_op("{");
    if (at_op("(")) {
      parse_call_args(*t);
    } else if (arg_start && !at_name("else") && !at_name("or") && !at_name("and")) {
      // `x is divisibleby 3`: one argument without parentheses.
      if (at_name("is")) fail("tests cannot be chained with 'is'", n);
      Nesting guard(*this);
      t->children.push_back(parse_postfix(parse_primary()));
    }
    return finish(std::move(t));
  }

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

}  // namespace

std::unique_ptr<Program> parse_template(std::string_view source, const LexOptions& options) {
  return Parser(lex(source, options)).run();
}

}  // namespace metro::tokenizer::jinja
