#include "jinja/builtins.h"

#include <algorithm>

#include "jinja/args.h"
#include "jinja/ops.h"
#include "jinja/string.h"

namespace metro::jinja {
namespace {

// ---- tests --------------------------------------------------------------------------------

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even",
    "false", "float", "ge", ">=", "gt", ">", "in", "integer", "iterable", "le", "<=",
    "lower", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas",
    "sequence", "string", "true", "undefined", "upper"};

const Value& one_arg(std::string_view test, const Args& args) {
  if (args.positional.size() != 1 || !args.keywords.empty()) {
    throw_type_error("test '" + std::string(test) + "' takes exactly one argument");
  }
  return args.positional[0];
}

bool same_object(const Value& a, const Value& b) {
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kBool:
      return a.as_bool() == b.as_bool();
    case ValueKind::kInt:
      return a.as_int() == b.as_int();
    case ValueKind::kFloat:
      return a.as_double() == b.as_double();
    default:
      return a.identity() == b.identity();
  }
}

// ---- methods ------------------------------------------------------------------------------

bool affix_matches(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    const std::string& t = string_arg(a, prefix ? "startswith arg" : "endswith arg");
    if (t.size() > s.size()) return false;
    return prefix ? s.compare(0, t.size(), t) == 0 : s.compare(s.size() - t.size(), t.size(), t) == 0;
  };
  if (affix.is_tuple()) {
    for (const Value& a : affix.items()) {
      if (one(a)) return true;
    }
    return false;
  }
  return one(affix);
}

template <class Pred>
bool all_chars(const std::string& s, Pred pred) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!pred(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

Value string_method(const std::string& name, const std::string& s, const Args& args, Budget& budget) {
  budget.tick(1 + s.size() / kBytesPerStep);
  if (name == "startswith" || name == "endswith") {
    Params p(name, args, {"prefix"});
    return Value::boolean(affix_matches(s, p[0], name == "startswith"));
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    Params p(name, args, {"chars"});
    const StripSide side = name == "strip" ? StripSide::kBoth : name == "lstrip" ? StripSide::kLeft : StripSide::kRight;
    return Value::string(py_strip(s, optional_string(p, 0, "chars"), side));
  }
  if (name == "split" || name == "rsplit") {
    Params p(name, args, {"sep", "maxsplit"});
    const int64_t maxsplit = p.given(1) ? int_arg(p[1], "maxsplit") : -1;
    std::vector<Value> out;
    for (std::string& part : py_split(s, optional_string(p, 0, "sep"), maxsplit, name == "rsplit")) {
      out.push_back(Value::string(std::move(part)));
    }
    budget.tick(out.size());
    return Value::list(std::move(out));
  }
  if (name == "splitlines") {
    Params p(name, args, {});
    std::vector<Value> out;
    for (std::string& line : py_splitlines(s)) out.push_back(Value::string(std::move(line)));
    budget.tick(out.size());
    return Value::list(std::move(out));
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    Params p(name, args, {});
    if (name == "upper") return Value::string(ascii_upper(s));
    if (name == "lower") return Value::string(ascii_lower(s));
    if (name == "title") return Value::string(py_title(s));
    return Value::string(py_capitalize(s));
  }
  if (name == "replace") {
    Params p(name, args, {"old", "new", "count"});
    const int64_t count = p.given(2) ? int_arg(p[2], "count") : -1;
    std::string out = py_replace(s, string_arg(p[0], "old"), string_arg(p[1], "new"), count, max_bytes(budget));
    return make_string(std::move(out), budget);
  }
  if (name == "find" || name == "count") {
    Params p(name, args, {"sub"});
    const std::string& sub = string_arg(p[0], "sub");
    return Value::integer(name == "find" ? py_find(s, sub) : py_count(s, sub));
  }
  if (name == "join") {
    Params p(name, args, {"iterable"});
    std::string out;
    BoundedWriter w(out, max_bytes(budget));
    bool first = true;
    for (const Value& item : iterate(p[0], budget)) {
      budget.tick();
      if (!first) w.append(s);
      first = false;
      w.append(string_arg(item, "join item"));
    }
    return make_string(std::move(out), budget);
  }
  Params p(name, args, {});
  auto digit = [](unsigned char c) { return c >= '0' && c <= '9'; };
  auto alpha = [](unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); };
  if (name == "isdigit") return Value::boolean(all_chars(s, digit));
  if (name == "isalpha") return Value::boolean(all_chars(s, alpha));
  if (name == "isalnum") return Value::boolean(all_chars(s, [&](unsigned char c) { return digit(c) || alpha(c); }));
  if (name == "isspace") return Value::boolean(!s.empty() && py_strip(s, std::nullopt, StripSide::kBoth).empty());
  if (name == "isupper") return Value::boolean(has_cased(s, true));
  if (name == "islower") return Value::boolean(has_cased(s, false));
  throw_type_error("'str' object has no method '" + name + "'");
}

Value dict_method(const std::string& name, const DictData& d, const Args& args, Budget& budget) {
  budget.tick(1 + d.size());
  if (name == "get") {
    Params p("get", args, {"key", "default"});
    if (p[0].is_string()) {
      if (const Value* v = d.find(p[0].str())) return *v;
    }
    return p.given(1) ? p[1] : Value::none();
  }
  Params p(name, args, {});
  std::vector<Value> out;
  for (const auto& [k, v] : d.entries()) {
    if (name == "items") {
      out.push_back(Value::list({Value::string(k), v}, true));
    } else if (name == "keys") {
      out.push_back(Value::string(k));
    } else {
      out.push_back(v);
    }
  }
  return Value::list(std::move(out));
}

// The non-mutating list methods (the immutable sandbox refuses append, pop, ...).
Value list_method(const std::string& name, const Value& list, const Args& args, Budget& budget) {
  Params p(name, args, {"value"});
  const auto& items = list.items();
  int64_t count = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!values_equal(items[i], p[0], budget)) continue;
    if (name == "index") return Value::integer(static_cast<int64_t>(i));
    ++count;
  }
  if (name == "index") throw_type_error("value is not in list");
  return Value::integer(count);
}

Value range_of(const Args& args, Budget& budget) {
  if (!args.keywords.empty()) throw_type_error("range() takes no keyword arguments");
  const auto& a = args.positional;
  if (a.empty() || a.size() > 3) throw_type_error("range expected 1 to 3 arguments");
  int64_t start = 0, stop = 0, step = 1;
  if (a.size() == 1) {
    stop = int_arg(a[0], "range() argument");
  } else {
    start = int_arg(a[0], "range() argument");
    stop = int_arg(a[1], "range() argument");
    if (a.size() == 3) step = int_arg(a[2], "range() argument");
  }
  if (step == 0) throw_type_error("range() arg 3 must not be zero");
  // Count in unsigned arithmetic: the span of extreme bounds does not fit in int64.
  uint64_t n = 0;
  if (step > 0 ? stop > start : start > stop) {
    const uint64_t span = step > 0 ? static_cast<uint64_t>(stop) - static_cast<uint64_t>(start)
                                   : static_cast<uint64_t>(start) - static_cast<uint64_t>(stop);
    const uint64_t mag = step > 0 ? static_cast<uint64_t>(step) : static_cast<uint64_t>(-(step + 1)) + 1;
    n = (span - 1) / mag + 1;
  }
  constexpr int64_t kMaxRange = 100000;  // Jinja's sandbox refuses larger ranges too
  if (n > static_cast<uint64_t>(kMaxRange)) {
    throw Error(ErrorKind::kLimit, "range too big: the sandbox refuses ranges of more than " +
                                       std::to_string(kMaxRange) + " items");
  }
  budget.tick(n / 8);
  std::vector<Value> out;
  out.reserve(static_cast<size_t>(n));
  // In unsigned arithmetic: k * step alone may overflow although start + k * step fits.
  for (uint64_t k = 0; k < n; ++k) {
    out.push_back(Value::integer(static_cast<int64_t>(static_cast<uint64_t>(start) + k * static_cast<uint64_t>(step))));
  }
  return Value::list(std::move(out));
}

void put_namespace_attr(DictData& attrs, std::string key, Value value) {
  if (value.holds_namespace()) {
    throw_type_error("a namespace cannot hold another namespace");
  }
  attrs.set(std::move(key), std::move(value));
}

}  // namespace

bool is_test_name(std::string_view name) {
  for (std::string_view t : kTests) {
    if (t == name) return true;
  }
  return false;
}

bool apply_test(std::string_view name, const Value& v, const Args& args, Budget& budget) {
  budget.tick();
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  // Jinja's Undefined has __iter__, __len__ and __getitem__, so these are true for it.
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") return has_cased(to_str(v, max_bytes(budget)), name == "upper");
  if (name == "odd" || name == "even") {
    if (!v.is_number()) throw_type_error("test '" + std::string(name) + "' expects a number");
    const Value r = binary_op(BinaryOp::kMod, v, Value::integer(2), budget);
    const bool odd = r.is_float() ? r.as_double() == 1.0 : r.as_int() == 1;
    return name == "odd" ? odd : !odd;
  }
  if (name == "divisibleby") {
    const Value r = binary_op(BinaryOp::kMod, v, one_arg(name, args), budget);
    return !r.truthy();
  }
  if (name == "sameas") return same_object(v, one_arg(name, args));
  if (name == "in") return contains(one_arg(name, args), v, budget);
  const Value& other = one_arg(name, args);
  if (name == "eq" || name == "equalto" || name == "==") return values_equal(v, other, budget);
  if (name == "ne" || name == "!=") return !values_equal(v, other, budget);
  if (name == "lt" || name == "<") return compare_values(v, other, budget) < 0;
  if (name == "le" || name == "<=") return compare_values(v, other, budget) <= 0;
  if (name == "gt" || name == ">") return compare_values(v, other, budget) > 0;
  if (name == "ge" || name == ">=") return compare_values(v, other, budget) >= 0;
  throw_type_error("no test named '" + std::string(name) + "'");
}

Value call_builtin(const Callable& fn, const Args& args, Budget& budget) {
  budget.tick();
  switch (fn.kind) {
    case Callable::Kind::kMethod:
      if (fn.receiver.is_string()) return string_method(fn.name, fn.receiver.str(), args, budget);
      if (fn.receiver.is_dict()) return dict_method(fn.name, fn.receiver.dict_data(), args, budget);
      if (fn.receiver.is_list()) return list_method(fn.name, fn.receiver, args, budget);
      throw_type_error("'" + fn.name + "' is not callable here");
    case Callable::Kind::kLoopCycle: {
      if (args.positional.empty()) throw_type_error("no items for cycling given");
      const auto i = static_cast<size_t>(fn.receiver.as_int()) % args.positional.size();
      return args.positional[i];
    }
    case Callable::Kind::kGlobal:
      if (fn.name == "range") return range_of(args, budget);
      if (fn.name == "namespace" || fn.name == "dict") {
        DictData attrs;
        if (args.positional.size() > 1) throw_type_error(fn.name + "() takes at most one positional argument");
        if (!args.positional.empty()) {
          if (!args.positional[0].is_dict()) throw_type_error(fn.name + "() positional argument must be a dict");
          for (const auto& [k, v] : args.positional[0].dict_data().entries()) attrs.set(k, v);
        }
        for (const auto& [k, v] : args.keywords) attrs.set(k, v);
        if (fn.name == "dict") return Value::dict(std::move(attrs));
        auto ns = std::make_shared<NamespaceData>();
        for (const auto& [k, v] : attrs.entries()) put_namespace_attr(ns->attrs, k, v);
        return Value::ns(std::move(ns));
      }
      break;
    default:
      break;
  }
  throw_type_error("'" + fn.name + "' is not callable here");
}

Value builtin_global(std::string_view name) {
  if (name != "range" && name != "namespace" && name != "dict" && name != "raise_exception" &&
      name != "strftime_now") {
    return Value::undefined("'" + std::string(name) + "' is undefined");
  }
  auto fn = std::make_shared<Callable>();
  fn->kind = Callable::Kind::kGlobal;
  fn->name = std::string(name);
  return Value::callable(std::move(fn));
}

}  // namespace metro::jinja
