#include "jinja/ops.h"

#include <cmath>
#include <initializer_list>
#include <limits>

#include "jinja/string.h"

namespace metro::jinja {
namespace {

constexpr std::string_view kDictMethods[] = {"items", "keys", "values", "get"};
constexpr std::string_view kListMethods[] = {"count", "index"};
constexpr std::string_view kStrMethods[] = {
    "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "splitlines",
    "upper", "lower", "title", "capitalize", "replace", "find", "count", "join",
    "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower"};

template <size_t N>
bool one_of(std::string_view name, const std::string_view (&names)[N]) {
  for (std::string_view n : names) {
    if (n == name) return true;
  }
  return false;
}

Value bound_method(const Value& receiver, std::string_view name) {
  auto fn = std::make_shared<Callable>();
  fn->kind = Callable::Kind::kMethod;
  fn->name = std::string(name);
  fn->receiver = receiver;
  return Value::callable(std::move(fn));
}

std::string object_name(const Value& v) {
  if (v.is_none()) return "None";
  return "'" + std::string(v.type_name()) + " object'";
}

Value no_attribute(const Value& obj, std::string_view name) {
  return Value::undefined(object_name(obj) + " has no attribute '" + std::string(name) + "'");
}

[[noreturn]] void raise_undefined(const Value& v) { throw Error(ErrorKind::kUndefined, v.undefined_hint()); }

[[noreturn]] void unsupported(std::string_view op, const Value& a, const Value& b) {
  throw_type_error("unsupported operand type(s) for " + std::string(op) + ": '" +
                   std::string(a.type_name()) + "' and '" + std::string(b.type_name()) + "'");
}

[[noreturn]] void overflow() { throw_type_error("integer result does not fit in 64 bits"); }

// Python's slice.indices(length) for one bound.
int64_t clamp_index(const Value& v, int64_t length, int64_t step, bool is_start) {
  if (v.is_undefined() || v.is_none()) {
    if (step > 0) return is_start ? 0 : length;
    return is_start ? length - 1 : -1;
  }
  int64_t i = v.as_int();
  if (i < 0) {
    i = (i < -length) ? -1 : i + length;
    if (i < 0 && step > 0) i = 0;
    return i;
  }
  if (i >= length) return step > 0 ? length : length - 1;
  return i;
}

int64_t int_floordiv(int64_t a, int64_t b) {
  if (b == 0) throw_type_error("integer division or modulo by zero");
  if (a == INT64_MIN && b == -1) overflow();
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t int_mod(int64_t a, int64_t b) {
  if (b == 0) throw_type_error("integer division or modulo by zero");
  if (b == -1) return 0;
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

double float_mod(double a, double b) {
  if (b == 0) throw_type_error("float modulo");
  double r = std::fmod(a, b);
  if (r != 0) {
    if ((r < 0) != (b < 0)) r += b;
  } else {
    r = std::copysign(0.0, b);
  }
  return r;
}

Value int_pow(int64_t base, int64_t exp) {
  if (exp < 0) {
    if (base == 0) throw_type_error("0.0 cannot be raised to a negative power");
    return Value::number(std::pow(static_cast<double>(base), static_cast<double>(exp)));
  }
  int64_t result = 1;
  int64_t b = base;
  while (exp > 0) {
    if (exp & 1) {
      if (__builtin_mul_overflow(result, b, &result)) overflow();
    }
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(b, b, &b)) overflow();
  }
  return Value::integer(result);
}

Value arithmetic(BinaryOp op, const Value& a, const Value& b) {
  const bool floats = a.is_float() || b.is_float();
  if (!floats) {
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    int64_t r = 0;
    switch (op) {
      case BinaryOp::kAdd:
        if (__builtin_add_overflow(x, y, &r)) overflow();
        return Value::integer(r);
      case BinaryOp::kSub:
        if (__builtin_sub_overflow(x, y, &r)) overflow();
        return Value::integer(r);
      case BinaryOp::kMul:
        if (__builtin_mul_overflow(x, y, &r)) overflow();
        return Value::integer(r);
      case BinaryOp::kDiv:
        if (y == 0) throw_type_error("division by zero");
        return Value::number(static_cast<double>(x) / static_cast<double>(y));
      case BinaryOp::kFloorDiv:
        return Value::integer(int_floordiv(x, y));
      case BinaryOp::kMod:
        return Value::integer(int_mod(x, y));
      case BinaryOp::kPow:
        return int_pow(x, y);
      default:
        break;
    }
  }
  const double x = a.as_double();
  const double y = b.as_double();
  switch (op) {
    case BinaryOp::kAdd: return Value::number(x + y);
    case BinaryOp::kSub: return Value::number(x - y);
    case BinaryOp::kMul: return Value::number(x * y);
    case BinaryOp::kDiv:
      if (y == 0) throw_type_error("float division by zero");
      return Value::number(x / y);
    case BinaryOp::kFloorDiv:
      if (y == 0) throw_type_error("float floor division by zero");
      return Value::number(std::floor(x / y));
    case BinaryOp::kMod:
      return Value::number(float_mod(x, y));
    case BinaryOp::kPow:
      if (x == 0 && y < 0) throw_type_error("0.0 cannot be raised to a negative power");
      return Value::number(std::pow(x, y));
    default:
      break;
  }
  throw_type_error("bad arithmetic operator");
}

Value repeat(const Value& seq, int64_t n, Budget& budget) {
  // Nothing to repeat is nothing, at once: an empty sequence times a huge count would
  // otherwise loop that many times without ever reaching the output or item bounds.
  const bool empty = seq.is_string() ? seq.str().empty() : seq.items().empty();
  if (n <= 0 || empty) return seq.is_string() ? Value::string("") : Value::list({}, seq.is_tuple());
  const auto count = static_cast<uint64_t>(n);
  const size_t max = budget.limits().max_output_bytes;
  if (seq.is_string()) {
    const std::string& s = seq.str();
    if (!s.empty() && count > max / s.size()) budget.charge_bytes(max + 1);
    budget.charge_bytes(s.size() * count);
    std::string out;
    out.reserve(s.size() * count);
    for (uint64_t i = 0; i < count; ++i) out += s;
    return Value::string(std::move(out));
  }
  const auto& items = seq.items();
  if (!items.empty() && count > max / items.size()) budget.check_items(max + 1);
  budget.check_items(items.size() * count);
  budget.tick(items.size() * count);
  std::vector<Value> out;
  out.reserve(items.size() * count);
  for (uint64_t i = 0; i < count; ++i) out.insert(out.end(), items.begin(), items.end());
  return Value::list(std::move(out), seq.is_tuple());
}

std::string_view op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSub: return "-";
    case BinaryOp::kMul: return "*";
    case BinaryOp::kDiv: return "/";
    case BinaryOp::kFloorDiv: return "//";
    case BinaryOp::kMod: return "%";
    case BinaryOp::kPow: return "**";
    case BinaryOp::kConcat: return "~";
    case BinaryOp::kAnd: return "and";
    case BinaryOp::kOr: return "or";
  }
  return "?";
}

Value loop_attribute(const Value& loop, std::string_view name) {
  const LoopData& d = loop.loop_data();
  const auto n = static_cast<int64_t>(d.items->size());
  const int64_t i = d.index0;
  if (name == "index") return Value::integer(i + 1);
  if (name == "index0") return Value::integer(i);
  if (name == "revindex") return Value::integer(n - i);
  if (name == "revindex0") return Value::integer(n - i - 1);
  if (name == "first") return Value::boolean(i == 0);
  if (name == "last") return Value::boolean(i == n - 1);
  if (name == "length") return Value::integer(n);
  if (name == "depth") return Value::integer(1);
  if (name == "depth0") return Value::integer(0);
  if (name == "previtem") {
    return i > 0 ? (*d.items)[static_cast<size_t>(i - 1)] : Value::undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? (*d.items)[static_cast<size_t>(i + 1)] : Value::undefined("there is no next item");
  }
  if (name == "cycle") {
    auto fn = std::make_shared<Callable>();
    fn->kind = Callable::Kind::kLoopCycle;
    fn->name = "cycle";
    fn->receiver = Value::integer(i);
    return Value::callable(std::move(fn));
  }
  return no_attribute(loop, name);
}

}  // namespace

Value get_attribute(const Value& obj, std::string_view name, Budget& budget) {
  budget.tick();
  switch (obj.kind()) {
    case ValueKind::kUndefined:
      raise_undefined(obj);
    case ValueKind::kDict:
      if (one_of(name, kDictMethods)) return bound_method(obj, name);
      if (const Value* v = obj.dict_data().find(name)) return *v;
      return no_attribute(obj, name);
    case ValueKind::kString:
      if (one_of(name, kStrMethods)) return bound_method(obj, name);
      return no_attribute(obj, name);
    case ValueKind::kList:
      if (one_of(name, kListMethods)) return bound_method(obj, name);
      return no_attribute(obj, name);
    case ValueKind::kNamespace:
      if (const Value* v = obj.ns_data().attrs.find(name)) return *v;
      return no_attribute(obj, name);
    case ValueKind::kLoop:
      return loop_attribute(obj, name);
    default:
      return no_attribute(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key, Budget& budget) {
  budget.tick();
  if (obj.is_undefined()) raise_undefined(obj);
  if (obj.is_dict()) {
    if (key.is_string()) {
      if (const Value* v = obj.dict_data().find(key.str())) return *v;
      if (one_of(key.str(), kDictMethods)) return bound_method(obj, key.str());
      return no_attribute(obj, key.str());
    }
    return Value::undefined(object_name(obj) + " has no element " + to_str(key, 256));
  }
  if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<int64_t>(obj.items().size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(object_name(obj) + " has no element " + std::to_string(key.as_int()));
      return obj.items()[static_cast<size_t>(i)];
    }
    const std::string& s = obj.str();
    if (is_ascii(s)) {
      const auto n = static_cast<int64_t>(s.size());
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined(object_name(obj) + " has no element " + std::to_string(key.as_int()));
      return Value::string(std::string(1, s[static_cast<size_t>(i)]));
    }
    const std::vector<size_t> offs = code_point_offsets(s);
    const auto n = static_cast<int64_t>(offs.size()) - 1;
    budget.tick(offs.size() / kBytesPerStep);
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined(object_name(obj) + " has no element " + std::to_string(key.as_int()));
    const auto k = static_cast<size_t>(i);
    return Value::string(s.substr(offs[k], offs[k + 1] - offs[k]));
  }
  if (key.is_string()) return get_attribute(obj, key.str(), budget);
  return Value::undefined(object_name(obj) + " has no element " + to_str(key, 256));
}

Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step,
                Budget& budget) {
  if (obj.is_undefined()) raise_undefined(obj);
  // Jinja slices with Python's own subscript (not its getitem fallback), so a bad slice is a
  // TypeError at run time.
  if (obj.is_dict()) throw_type_error("unhashable type: 'slice'");
  if (!obj.is_list() && !obj.is_string()) {
    throw_type_error("'" + std::string(obj.type_name()) + "' object is not subscriptable");
  }
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_undefined() && !v->is_none() && !v->is_int() && !v->is_bool()) {
      throw_type_error("slice indices must be integers or None or have an __index__ method");
    }
  }
  int64_t st = 1;
  if (!step.is_undefined() && !step.is_none()) {
    st = step.as_int();
    if (st == 0) throw_type_error("slice step cannot be zero");
  }
  std::vector<size_t> offs;
  int64_t length = 0;
  const bool ascii = obj.is_string() && is_ascii(obj.str());
  if (obj.is_list()) {
    length = static_cast<int64_t>(obj.items().size());
  } else if (ascii) {
    length = static_cast<int64_t>(obj.str().size());
  } else {
    offs = code_point_offsets(obj.str());
    length = static_cast<int64_t>(offs.size()) - 1;
  }
  const int64_t from = clamp_index(start, length, st, true);
  const int64_t to = clamp_index(stop, length, st, false);
  int64_t count = 0;
  if (st > 0 && to > from) count = (to - from + st - 1) / st;
  if (st < 0 && from > to) count = (from - to - st - 1) / -st;
  budget.tick(1 + static_cast<uint64_t>(count) / 8);
  if (obj.is_list()) {
    std::vector<Value> out;
    out.reserve(static_cast<size_t>(count));
    for (int64_t k = 0; k < count; ++k) out.push_back(obj.items()[static_cast<size_t>(from + k * st)]);
    return Value::list(std::move(out), obj.is_tuple());
  }
  const std::string& s = obj.str();
  std::string out;
  if (ascii && st == 1) {
    out = s.substr(static_cast<size_t>(from), static_cast<size_t>(count));
  } else {
    for (int64_t k = 0; k < count; ++k) {
      const auto i = static_cast<size_t>(from + k * st);
      if (ascii) {
        out += s[i];
      } else {
        out.append(s, offs[i], offs[i + 1] - offs[i]);
      }
    }
  }
  budget.charge_bytes(out.size());
  return Value::string(std::move(out));
}

std::vector<Value> iterate(const Value& v, Budget& budget) {
  std::vector<Value> out;
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return out;
    case ValueKind::kList:
      budget.tick(v.items().size() / 8);
      return v.items();
    case ValueKind::kDict:
      budget.tick(v.dict_data().size());
      for (const auto& [k, val] : v.dict_data().entries()) out.push_back(Value::string(k));
      return out;
    case ValueKind::kString: {
      const std::string& s = v.str();
      budget.tick(s.size());
      for (size_t i = 0; i < s.size();) {
        size_t len = 1;
        decode_utf8(s, i, &len);
        out.push_back(Value::string(s.substr(i, len)));
        i += len;
      }
      return out;
    }
    default:
      throw_type_error("'" + std::string(v.type_name()) + "' object is not iterable");
  }
}

Value binary_op(BinaryOp op, const Value& a, const Value& b, Budget& budget) {
  budget.tick();
  if (op == BinaryOp::kConcat) {
    const size_t max = budget.limits().max_output_bytes;
    std::string s = to_str(a, max);
    BoundedWriter w(s, max);
    append_str(w, b);
    budget.charge_bytes(s.size());
    return Value::string(std::move(s));
  }
  if (a.is_undefined()) raise_undefined(a);
  if (b.is_undefined()) raise_undefined(b);
  if (a.is_number() && b.is_number()) return arithmetic(op, a, b);
  if (op == BinaryOp::kAdd) {
    if (a.is_string() && b.is_string()) {
      budget.charge_bytes(a.str().size() + b.str().size());
      return Value::string(a.str() + b.str());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      const size_t n = a.items().size() + b.items().size();
      budget.check_items(n);
      budget.tick(n);
      std::vector<Value> items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string() && !b.is_string()) {
      throw_type_error("can only concatenate str (not \"" + std::string(b.type_name()) + "\") to str");
    }
  }
  if (op == BinaryOp::kMul) {
    if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int(), budget);
    if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int(), budget);
  }
  unsupported(op_symbol(op), a, b);
}

bool contains(const Value& container, const Value& item, Budget& budget) {
  budget.tick();
  switch (container.kind()) {
    case ValueKind::kUndefined:
      return false;
    case ValueKind::kString:
      if (!item.is_string()) {
        throw_type_error("'in <string>' requires string as left operand, not " +
                         std::string(item.type_name()));
      }
      budget.tick(container.str().size() / kBytesPerStep);
      return container.str().find(item.str()) != std::string::npos;
    case ValueKind::kList:
      for (const Value& v : container.items()) {
        if (values_equal(v, item, budget)) return true;
      }
      return false;
    case ValueKind::kDict:
      if ((item.is_list() && !item.is_tuple()) || item.is_dict() || item.is_namespace()) {
        throw_type_error("unhashable type: '" + std::string(item.type_name()) + "'");
      }
      return item.is_string() && container.dict_data().find(item.str()) != nullptr;
    default:
      throw_type_error("argument of type '" + std::string(container.type_name()) +
                       "' is not iterable");
  }
}

}  // namespace metro::jinja
