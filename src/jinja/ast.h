// The syntax tree of a parsed template. Built once by the parser, then only read (shared
// by every render of the template, from any thread).
//
// Every node records the byte offset of its first token in the newline-normalized source,
// from which error messages derive line and column.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "jinja/value.h"

namespace metro::jinja {

enum class ExprKind : uint8_t {
  kLiteral,    // value
  kName,       // name
  kList,       // children: items
  kTuple,      // children: items
  kDict,       // children: key0, value0, key1, value1, ...
  kUnary,      // unary_op, children[0]
  kBinary,     // binary_op, children[0], children[1]
  kCompare,    // children: operands (n+1), compare_ops: n operators, chained as in Python
  kCondition,  // children: then, condition, else (null when absent)
  kGetAttr,    // children[0].name
  kGetItem,    // children[0][children[1]]
  kSlice,      // children[0][start:stop:step], missing parts null
  kCall,       // children[0](children[1..], kwargs)
  kFilter,     // children[0] | name(children[1..], kwargs); children[0] null in {% filter %}
  kTest,       // children[0] is name(children[1..], kwargs); negated for `is not`
};

enum class UnaryOp : uint8_t { kNot, kNeg, kPos };
enum class BinaryOp : uint8_t {
  kAnd, kOr, kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kConcat,
};
enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Keyword {
  std::string name;
  ExprPtr value;
};

struct Expr {
  ExprKind kind = ExprKind::kLiteral;
  uint32_t offset = 0;
  uint32_t height = 1;  // of the subtree, bounded by kMaxExprHeight
  Value literal;
  std::string name;
  UnaryOp unary_op = UnaryOp::kNot;
  BinaryOp binary_op = BinaryOp::kAdd;
  bool negated = false;
  std::vector<CompareOp> compare_ops;
  std::vector<ExprPtr> children;
  std::vector<Keyword> kwargs;
};

enum class StmtKind : uint8_t {
  kText,        // text
  kOutput,      // {{ expr }}
  kIf,          // branches (condition null for `else`)
  kFor,         // for targets in expr [if filter] body [else else_body]
  kSet,         // set targets = expr; or set targets[0].attr = expr
  kSetBlock,    // set targets[0] %} body {% endset
  kMacro,       // macro definition
  kCallBlock,   // call[(macro.params)] expr %} body {% endcall
  kFilterBlock, // filter filters... %} body {% endfilter
  kBreak,
  kContinue,
  kScope,       // body only ({% generation %}): rendered in place
};

using Body = std::vector<std::unique_ptr<Stmt>>;

struct IfBranch {
  ExprPtr condition;  // null for else
  Body body;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // one per param; null when the param has no default
  Body body;
};

struct Stmt {
  StmtKind kind = StmtKind::kText;
  uint32_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;                    // for-loop `if`
  std::vector<std::string> targets;  // for/set names (several for unpacking)
  std::string attr;                  // set ns.attr
  std::vector<IfBranch> branches;
  Body body;
  Body else_body;
  MacroDef macro;                    // kMacro; kCallBlock: caller's params
  std::vector<ExprPtr> filters;      // kFilterBlock: kFilter nodes with a null operand
};

// A parsed template: its normalized source (for error locations) and its statements.
struct Program {
  std::string source;
  Body body;
};

}  // namespace metro::jinja
