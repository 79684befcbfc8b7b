#include "jinja/interpreter.h"

#include <ctime>
#include <exception>

#include "base/check.h"
#include "jinja/builtins.h"
#include "jinja/ops.h"
#include "jinja/string.h"

namespace metro::jinja {

// One variable scope. Frames are shared so that a macro can refer weakly to the scope it
// was defined in (Callable::closure) without keeping it alive.
struct Frame {
  std::shared_ptr<Frame> parent;
  std::vector<std::pair<std::string, Value>> vars;

  const Value* find(std::string_view name) const {
    for (const auto& [k, v] : vars) {
      if (k == name) return &v;
    }
    return nullptr;
  }
  void set(std::string_view name, Value value) {
    for (auto& [k, v] : vars) {
      if (k == name) {
        v = std::move(value);
        return;
      }
    }
    vars.emplace_back(std::string(name), std::move(value));
  }
};

namespace {

using FramePtr = std::shared_ptr<Frame>;

enum class Flow : uint8_t { kNormal, kBreak, kContinue };

constexpr size_t kMaxStrftimeFormat = 1024;

class Interpreter {
 public:
  Interpreter(const Program& program, const Value& context, const RenderOptions& options)
      : program_(program), context_(context), options_(options), budget_(options.limits) {}

  std::string run() {
    root_ = std::make_shared<Frame>();
    std::string out;
    BoundedWriter w(out, options_.limits.max_output_bytes);
    try {
      exec_body(program_.body, root_, w);
    } catch (const Error& e) {
      if (e.offset() != kNoOffset) throw;
      throw Error(e.kind(), e.what(), offset_);
    }
    return out;
  }

 private:
  // Counts nesting against max_recursion_depth and records the innermost location for
  // error messages (kept, not restored, while an exception unwinds).
  class Enter {
   public:
    Enter(Interpreter& in, uint32_t offset)
        : in_(in), saved_offset_(in.offset_), exceptions_(std::uncaught_exceptions()) {
      if (++in_.depth_ > in_.options_.limits.max_recursion_depth) {
        throw Error(ErrorKind::kLimit,
                    "template recursion deeper than " +
                        std::to_string(in_.options_.limits.max_recursion_depth) + " levels",
                    offset);
      }
      in_.offset_ = offset;
      in_.budget_.tick();
    }
    ~Enter() {
      --in_.depth_;
      if (std::uncaught_exceptions() == exceptions_) in_.offset_ = saved_offset_;
    }
    Enter(const Enter&) = delete;
    Enter& operator=(const Enter&) = delete;

   private:
    Interpreter& in_;
    uint32_t saved_offset_;
    int exceptions_;
  };

  // ---- statements -------------------------------------------------------------------------

  Flow exec_body(const Body& body, const FramePtr& frame, BoundedWriter& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, frame, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

  Flow exec(const Stmt& s, const FramePtr& frame, BoundedWriter& out) {
    Enter enter(*this, s.offset);
    switch (s.kind) {
      case StmtKind::kText:
        budget_.tick(s.text.size() / kBytesPerStep);
        out.append(s.text);
        return Flow::kNormal;
      case StmtKind::kOutput: {
        const Value v = eval(*s.expr, *frame);
        const size_t before = out.out().size();
        append_str(out, v);
        budget_.tick((out.out().size() - before) / kBytesPerStep);
        return Flow::kNormal;
      }
      case StmtKind::kIf:
        for (const IfBranch& b : s.branches) {
          if (!b.condition || eval(*b.condition, *frame).truthy()) {
            return exec_body(b.body, frame, out);
          }
        }
        return Flow::kNormal;
      case StmtKind::kFor:
        exec_for(s, frame, out);
        return Flow::kNormal;
      case StmtKind::kSet:
        exec_set(s, frame);
        return Flow::kNormal;
      case StmtKind::kSetBlock:
        frame->set(s.targets[0], Value::string(capture(s.body, frame)));
        return Flow::kNormal;
      case StmtKind::kMacro: {
        auto fn = std::make_shared<Callable>();
        fn->kind = Callable::Kind::kMacro;
        fn->name = s.macro.name;
        fn->macro = &s.macro;
        fn->closure = frame;
        frame->set(s.macro.name, Value::callable(std::move(fn)));
        return Flow::kNormal;
      }
      case StmtKind::kCallBlock:
        exec_call_block(s, frame, out);
        return Flow::kNormal;
      case StmtKind::kFilterBlock: {
        Value v = Value::string(capture(s.body, frame));
        for (const ExprPtr& f : s.filters) {
          Args args = eval_args(*f, *frame);
          offset_ = f->offset;
          v = apply_filter(f->name, v, args, budget_);
        }
        append_str(out, v);
        return Flow::kNormal;
      }
      case StmtKind::kBreak:
        return Flow::kBreak;
      case StmtKind::kContinue:
        return Flow::kContinue;
      case StmtKind::kScope:
        return exec_body(s.body, frame, out);
    }
    return Flow::kNormal;
  }

  std::string capture(const Body& body, const FramePtr& frame) {
    std::string text;
    BoundedWriter w(text, options_.limits.max_output_bytes);
    exec_body(body, frame, w);
    return text;
  }

  void bind_targets(const std::vector<std::string>& targets, const Value& value, Frame& frame) {
    if (targets.size() == 1) {
      frame.set(targets[0], value);
      return;
    }
    std::vector<Value> parts = iterate(value, budget_);
    if (parts.size() != targets.size()) {
      throw_type_error(std::string(parts.size() > targets.size() ? "too many" : "not enough") +
                       " values to unpack (expected " + std::to_string(targets.size()) +
                       ", got " + std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], parts[i]);
  }

  void exec_for(const Stmt& s, const FramePtr& frame, BoundedWriter& out) {
    std::vector<Value> items = iterate(eval(*s.expr, *frame), budget_);
    if (s.filter) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        budget_.tick();
        auto scope = std::make_shared<Frame>();
        scope->parent = frame;
        bind_targets(s.targets, item, *scope);
        if (eval(*s.filter, *scope).truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      exec_body(s.else_body, frame, out);
      return;
    }
    const auto shared = std::make_shared<const std::vector<Value>>(std::move(items));
    const auto n = static_cast<int64_t>(shared->size());
    for (int64_t i = 0; i < n; ++i) {
      budget_.tick();
      auto scope = std::make_shared<Frame>();
      scope->parent = frame;
      bind_targets(s.targets, (*shared)[static_cast<size_t>(i)], *scope);
      auto loop = std::make_shared<LoopData>();
      loop->items = shared;
      loop->index0 = i;
      scope->set("loop", Value::loop(std::move(loop)));
      if (exec_body(s.body, scope, out) == Flow::kBreak) break;
    }
  }

  void exec_set(const Stmt& s, const FramePtr& frame) {
    Value value = eval(*s.expr, *frame);
    if (s.attr.empty()) {
      bind_targets(s.targets, value, *frame);
      return;
    }
    const Value target = lookup(s.targets[0], *frame);
    if (!target.is_namespace()) throw_type_error("cannot assign attribute on non-namespace object");
    if (value.holds_namespace()) throw_type_error("a namespace cannot hold another namespace");
    target.ns_data().attrs.set(s.attr, std::move(value));
  }

  void exec_call_block(const Stmt& s, const FramePtr& frame, BoundedWriter& out) {
    const Expr& call = *s.expr;
    const Value callee = eval(*call.children[0], *frame);
    if (!callee.is_callable() || callee.callable_data().kind != Callable::Kind::kMacro) {
      throw_type_error("{% call %} needs a macro");
    }
    Args args = eval_args(call, *frame);
    auto caller = std::make_shared<Callable>();
    caller->kind = Callable::Kind::kCaller;
    caller->name = "caller";
    caller->call_block = &s;
    caller->closure = frame;
    offset_ = s.offset;
    out.append(call_macro(callee.callable_data(), args, Value::callable(std::move(caller))));
  }

  // ---- calls ------------------------------------------------------------------------------

  // Binds arguments to a macro's parameters in a new scope under `closure`.
  FramePtr bind_params(const MacroDef& m, const Args& args, const std::weak_ptr<Frame>& closure) {
    auto scope = std::make_shared<Frame>();
    scope->parent = closure.lock();
    if (!scope->parent) scope->parent = root_;
    if (args.positional.size() > m.params.size()) {
      throw_type_error("macro '" + m.name + "' takes not more than " +
                       std::to_string(m.params.size()) + " argument(s)");
    }
    std::vector<bool> bound(m.params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      scope->set(m.params[i], args.positional[i]);
      bound[i] = true;
    }
    for (const auto& [name, value] : args.keywords) {
      size_t i = 0;
      while (i < m.params.size() && m.params[i] != name) ++i;
      if (i == m.params.size()) {
        throw_type_error("macro '" + m.name + "' takes no keyword argument '" + name + "'");
      }
      scope->set(name, value);
      bound[i] = true;
    }
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (bound[i]) continue;
      if (m.defaults[i]) {
        scope->set(m.params[i], eval(*m.defaults[i], *scope));
      } else {
        scope->set(m.params[i], Value::undefined("parameter '" + m.params[i] + "' was not provided"));
      }
    }
    return scope;
  }

  std::string call_macro(const Callable& fn, const Args& args, const Value& caller) {
    const MacroDef& m = *fn.macro;
    FramePtr scope = bind_params(m, args, fn.closure);
    if (!caller.is_undefined()) scope->set("caller", caller);
    return capture(m.body, scope);
  }

  Value call(const Value& callee, const Args& args, const Expr& site) {
    if (callee.is_undefined()) throw Error(ErrorKind::kUndefined, callee.undefined_hint());
    if (!callee.is_callable()) {
      throw_type_error("'" + std::string(callee.type_name()) + "' object is not callable");
    }
    const Callable& fn = callee.callable_data();
    offset_ = site.offset;
    switch (fn.kind) {
      case Callable::Kind::kMacro:
        return Value::string(call_macro(fn, args, Value()));
      case Callable::Kind::kCaller: {
        const Stmt& block = *fn.call_block;
        FramePtr scope = bind_params(block.macro, args, fn.closure);
        return Value::string(capture(block.body, scope));
      }
      case Callable::Kind::kGlobal:
        if (fn.name == "raise_exception") {
          const std::string message = args.positional.empty() ? std::string()
                                                              : to_str(args.positional[0], 4096);
          throw Error(ErrorKind::kRaised, message, site.offset);
        }
        if (fn.name == "strftime_now") return strftime_now(args);
        return call_builtin(fn, args, budget_);
      default:
        return call_builtin(fn, args, budget_);
    }
  }

  Value strftime_now(const Args& args) {
    if (args.positional.size() != 1 || !args.positional[0].is_string()) {
      throw_type_error("strftime_now(format) takes one string argument");
    }
    const std::string& format = args.positional[0].str();
    if (format.size() > kMaxStrftimeFormat) throw_type_error("strftime_now format is too long");
    const auto now = options_.now ? options_.now() : std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    if (options_.local_time) {
      localtime_r(&t, &tm);
    } else {
      gmtime_r(&t, &tm);
    }
    // strftime reports 0 both for "buffer too small" and for an empty result; a buffer
    // 64x the format's size always suffices for the longest conversions.
    std::string buf(64 * (format.size() + 1), '\0');
    const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &tm);
    buf.resize(n);
    return Value::string(std::move(buf));
  }

  Args eval_args(const Expr& e, Frame& frame) {
    Args args;
    for (size_t i = 1; i < e.children.size(); ++i) args.positional.push_back(eval(*e.children[i], frame));
    for (const Keyword& kw : e.kwargs) args.keywords.emplace_back(kw.name, eval(*kw.value, frame));
    return args;
  }

  // ---- expressions ------------------------------------------------------------------------

  Value lookup(std::string_view name, const Frame& frame) {
    for (const Frame* f = &frame; f != nullptr; f = f->parent.get()) {
      if (const Value* v = f->find(name)) return *v;
    }
    if (const Value* v = context_.dict_data().find(name)) return *v;
    return builtin_global(name);
  }

  Value eval(const Expr& e, Frame& frame) {
    Enter enter(*this, e.offset);
    switch (e.kind) {
      case ExprKind::kLiteral:
        return e.literal;
      case ExprKind::kName:
        return lookup(e.name, frame);
      case ExprKind::kList:
      case ExprKind::kTuple: {
        std::vector<Value> items;
        items.reserve(e.children.size());
        for (const ExprPtr& c : e.children) items.push_back(eval(*c, frame));
        return Value::list(std::move(items), e.kind == ExprKind::kTuple);
      }
      case ExprKind::kDict: {
        DictData d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          const Value key = eval(*e.children[i], frame);
          if (!key.is_string()) throw_type_error("dict keys must be strings in chat templates");
          d.set(key.str(), eval(*e.children[i + 1], frame));
        }
        return Value::dict(std::move(d));
      }
      case ExprKind::kUnary:
        return eval_unary(e, frame);
      case ExprKind::kBinary: {
        const Value a = eval(*e.children[0], frame);
        if (e.binary_op == BinaryOp::kAnd) return a.truthy() ? eval(*e.children[1], frame) : a;
        if (e.binary_op == BinaryOp::kOr) return a.truthy() ? a : eval(*e.children[1], frame);
        const Value b = eval(*e.children[1], frame);
        offset_ = e.offset;
        return binary_op(e.binary_op, a, b, budget_);
      }
      case ExprKind::kCompare:
        return Value::boolean(eval_compare(e, frame));
      case ExprKind::kCondition:
        if (eval(*e.children[1], frame).truthy()) return eval(*e.children[0], frame);
        if (e.children[2]) return eval(*e.children[2], frame);
        return Value::undefined("the inline if-expression evaluated to false and has no else");
      case ExprKind::kGetAttr: {
        const Value obj = eval(*e.children[0], frame);
        offset_ = e.offset;
        return get_attribute(obj, e.name, budget_);
      }
      case ExprKind::kGetItem: {
        const Value obj = eval(*e.children[0], frame);
        const Value key = eval(*e.children[1], frame);
        offset_ = e.offset;
        return get_item(obj, key, budget_);
      }
      case ExprKind::kSlice: {
        const Value obj = eval(*e.children[0], frame);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.children[static_cast<size_t>(i + 1)]) parts[i] = eval(*e.children[static_cast<size_t>(i + 1)], frame);
        }
        offset_ = e.offset;
        return get_slice(obj, parts[0], parts[1], parts[2], budget_);
      }
      case ExprKind::kCall: {
        const Value callee = eval(*e.children[0], frame);
        const Args args = eval_args(e, frame);
        return call(callee, args, e);
      }
      case ExprKind::kFilter: {
        const Value operand = eval(*e.children[0], frame);
        const Args args = eval_args(e, frame);
        offset_ = e.offset;
        return apply_filter(e.name, operand, args, budget_);
      }
      case ExprKind::kTest: {
        const Value operand = eval(*e.children[0], frame);
        const Args args = eval_args(e, frame);
        offset_ = e.offset;
        return Value::boolean(apply_test(e.name, operand, args, budget_) != e.negated);
      }
    }
    return Value();
  }

  Value eval_unary(const Expr& e, Frame& frame) {
    const Value v = eval(*e.children[0], frame);
    offset_ = e.offset;
    if (e.unary_op == UnaryOp::kNot) return Value::boolean(!v.truthy());
    if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_hint());
    if (!v.is_number()) {
      throw_type_error(std::string("bad operand type for unary ") +
                       (e.unary_op == UnaryOp::kNeg ? "-" : "+") + ": '" + std::string(v.type_name()) + "'");
    }
    if (e.unary_op == UnaryOp::kPos) return v.is_bool() ? Value::integer(v.as_int()) : v;
    if (v.is_float()) return Value::number(-v.as_double());
    if (v.as_int() == INT64_MIN) throw_type_error("integer result does not fit in 64 bits");
    return Value::integer(-v.as_int());
  }

  bool eval_compare(const Expr& e, Frame& frame) {
    Value left = eval(*e.children[0], frame);
    for (size_t i = 0; i < e.compare_ops.size(); ++i) {
      Value right = eval(*e.children[i + 1], frame);
      offset_ = e.offset;
      bool ok = false;
      const CompareOp op = e.compare_ops[i];
      switch (op) {
        case CompareOp::kEq: ok = values_equal(left, right, budget_); break;
        case CompareOp::kNe: ok = !values_equal(left, right, budget_); break;
        case CompareOp::kIn: ok = contains(right, left, budget_); break;
        case CompareOp::kNotIn: ok = !contains(right, left, budget_); break;
        default: {
          if (left.is_undefined()) throw Error(ErrorKind::kUndefined, left.undefined_hint());
          if (right.is_undefined()) throw Error(ErrorKind::kUndefined, right.undefined_hint());
          const int c = compare_values(left, right, budget_);
          ok = op == CompareOp::kLt ? c < 0 : op == CompareOp::kLe ? c <= 0 : op == CompareOp::kGt ? c > 0 : c >= 0;
        }
      }
      if (!ok) return false;
      left = std::move(right);
    }
    return true;
  }

  const Program& program_;
  const Value& context_;
  const RenderOptions& options_;
  Budget budget_;
  FramePtr root_;
  uint32_t depth_ = 0;
  uint32_t offset_ = 0;
};

}  // namespace

std::string render(const Program& program, const Value& context, const RenderOptions& options) {
  METRO_CHECK(context.is_dict());
  return Interpreter(program, context, options).run();
}

}  // namespace metro::jinja
