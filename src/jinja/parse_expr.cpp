// Expression parsing of the Jinja parser (see parser_impl.h).
#include "jinja/builtins.h"
#include "jinja/parser_impl.h"

namespace metro::jinja::detail {

ExprPtr Parser::parse_expression() { return parse_condexpr(true); }

// Comma-separated expressions: one is returned as is, several become a tuple.
ExprPtr Parser::parse_tuple(bool with_condexpr, bool explicit_parens) {
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

bool Parser::tuple_ends(bool explicit_parens) const {
  const Token& t = peek();
  if (t.kind == TokenKind::kVarEnd || t.kind == TokenKind::kBlockEnd || t.kind == TokenKind::kEof) {
    return true;
  }
  return explicit_parens && at_op(")");
}

ExprPtr Parser::parse_condexpr(bool with_condexpr) {
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

ExprPtr Parser::binary(BinaryOp op, ExprPtr left, ExprPtr right, uint32_t offset) {
  auto b = node(ExprKind::kBinary, offset);
  b->binary_op = op;
  b->children.push_back(std::move(left));
  b->children.push_back(std::move(right));
  return finish(std::move(b));
}

ExprPtr Parser::parse_or() {
  ExprPtr left = parse_and();
  while (at_name("or")) {
    const uint32_t offset = next().offset;
    left = binary(BinaryOp::kOr, std::move(left), parse_and(), offset);
  }
  return left;
}

ExprPtr Parser::parse_and() {
  ExprPtr left = parse_not();
  while (at_name("and")) {
    const uint32_t offset = next().offset;
    left = binary(BinaryOp::kAnd, std::move(left), parse_not(), offset);
  }
  return left;
}

ExprPtr Parser::parse_not() {
  if (at_name("not")) {
    Nesting guard(*this);
    auto n = node(ExprKind::kUnary, next().offset);
    n->unary_op = UnaryOp::kNot;
    n->children.push_back(parse_not());
    return finish(std::move(n));
  }
  return parse_compare();
}

ExprPtr Parser::parse_compare() {
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

ExprPtr Parser::parse_math1() {
  ExprPtr left = parse_concat();
  while (at_op("+") || at_op("-")) {
    const Token& t = next();
    const BinaryOp op = t.text == "+" ? BinaryOp::kAdd : BinaryOp::kSub;
    left = binary(op, std::move(left), parse_concat(), t.offset);
  }
  return left;
}

ExprPtr Parser::parse_concat() {
  ExprPtr left = parse_math2();
  while (at_op("~")) {
    const uint32_t offset = next().offset;
    left = binary(BinaryOp::kConcat, std::move(left), parse_math2(), offset);
  }
  return left;
}

ExprPtr Parser::parse_math2() {
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

ExprPtr Parser::parse_pow() {
  ExprPtr left = parse_unary(true);
  while (at_op("**")) {
    const uint32_t offset = next().offset;
    left = binary(BinaryOp::kPow, std::move(left), parse_unary(true), offset);
  }
  return left;
}

ExprPtr Parser::parse_unary(bool with_filter) {
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

ExprPtr Parser::parse_primary() {
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

ExprPtr Parser::parse_list() {
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

ExprPtr Parser::parse_dict() {
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

ExprPtr Parser::parse_postfix(ExprPtr e) {
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

ExprPtr Parser::parse_subscript(ExprPtr obj) {
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
void Parser::parse_call_args(Expr& e) {
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

ExprPtr Parser::parse_call(ExprPtr callee) {
  auto c = node(ExprKind::kCall, peek().offset);
  c->children.push_back(std::move(callee));
  parse_call_args(*c);
  return finish(std::move(c));
}

// Jinja allows dotted filter and test names; none of ours have dots.
std::string Parser::parse_dotted_name() {
  std::string name = expect_name();
  while (at_op(".")) {
    next();
    name += "." + expect_name();
  }
  return name;
}

ExprPtr Parser::parse_filter(ExprPtr operand) {
  const Token& at = peek();
  auto f = node(ExprKind::kFilter, at.offset);
  f->name = parse_dotted_name();
  if (!is_filter_name(f->name)) unknown_name("no filter named '" + f->name + "'", at);
  f->children.push_back(std::move(operand));
  if (at_op("(")) parse_call_args(*f);
  return finish(std::move(f));
}

ExprPtr Parser::parse_filter_expr(ExprPtr e) {
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

ExprPtr Parser::parse_test(ExprPtr operand) {
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

}  // namespace metro::jinja::detail
