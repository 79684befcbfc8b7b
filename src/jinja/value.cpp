#include "jinja/value.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "base/check.h"
#include "jinja/string.h"

namespace metro::jinja {

// ---- Value --------------------------------------------------------------------------------

Value Value::undefined(std::string hint) {
  Value v;
  v.ptr_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = ValueKind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = ValueKind::kBool;
  v.num_.i = 0;
  v.num_.b = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = ValueKind::kInt;
  v.num_.i = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = ValueKind::kFloat;
  v.num_.f = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = ValueKind::kString;
  v.ptr_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::list(std::vector<Value> items, bool tuple) {
  auto data = std::make_shared<ListData>();
  for (const Value& item : items) {
    data->depth = std::max(data->depth, item.depth() + 1);
    data->holds_namespace = data->holds_namespace || item.holds_namespace();
  }
  if (data->depth > kMaxValueDepth) {
    throw Error(ErrorKind::kLimit, "value nested deeper than " + std::to_string(kMaxValueDepth) +
                                       " levels");
  }
  data->items = std::move(items);
  Value v;
  v.kind_ = ValueKind::kList;
  v.tuple_ = tuple;
  v.ptr_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}

Value Value::dict(DictData data) {
  if (data.depth() > kMaxValueDepth) {
    throw Error(ErrorKind::kLimit, "value nested deeper than " + std::to_string(kMaxValueDepth) +
                                       " levels");
  }
  Value v;
  v.kind_ = ValueKind::kDict;
  v.ptr_ = std::make_shared<const DictData>(std::move(data));
  return v;
}

Value Value::ns(std::shared_ptr<NamespaceData> data) {
  METRO_CHECK(data != nullptr);
  Value v;
  v.kind_ = ValueKind::kNamespace;
  v.ptr_ = std::move(data);
  return v;
}

Value Value::callable(std::shared_ptr<const Callable> fn) {
  METRO_CHECK(fn != nullptr);
  Value v;
  v.kind_ = ValueKind::kCallable;
  v.ptr_ = std::move(fn);
  return v;
}

Value Value::loop(std::shared_ptr<const LoopData> loop) {
  METRO_CHECK(loop != nullptr && loop->items != nullptr);
  Value v;
  v.kind_ = ValueKind::kLoop;
  v.ptr_ = std::move(loop);
  return v;
}

int64_t Value::as_int() const {
  METRO_DCHECK(is_bool() || is_int());
  return is_bool() ? (num_.b ? 1 : 0) : num_.i;
}

double Value::as_double() const {
  METRO_DCHECK(is_number());
  if (is_float()) return num_.f;
  return static_cast<double>(as_int());
}

const std::string& Value::str() const {
  METRO_CHECK(is_string());
  return *std::get<std::shared_ptr<const std::string>>(ptr_);
}

const std::vector<Value>& Value::items() const {
  METRO_CHECK(is_list());
  return std::get<std::shared_ptr<const ListData>>(ptr_)->items;
}

const DictData& Value::dict_data() const {
  METRO_CHECK(is_dict());
  return *std::get<std::shared_ptr<const DictData>>(ptr_);
}

NamespaceData& Value::ns_data() const {
  METRO_CHECK(is_namespace());
  return *std::get<std::shared_ptr<NamespaceData>>(ptr_);
}

const Callable& Value::callable_data() const {
  METRO_CHECK(is_callable());
  return *std::get<std::shared_ptr<const Callable>>(ptr_);
}

const LoopData& Value::loop_data() const {
  METRO_CHECK(is_loop());
  return *std::get<std::shared_ptr<const LoopData>>(ptr_);
}

const std::string& Value::undefined_hint() const {
  static const std::string kGeneric = "value is undefined";
  if (!is_undefined()) return kGeneric;
  const auto* p = std::get_if<std::shared_ptr<const std::string>>(&ptr_);
  return (p && *p && !(*p)->empty()) ? **p : kGeneric;
}

bool Value::truthy() const {
  switch (kind_) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return false;
    case ValueKind::kBool:
      return num_.b;
    case ValueKind::kInt:
      return num_.i != 0;
    case ValueKind::kFloat:
      return num_.f != 0;
    case ValueKind::kString:
      return !str().empty();
    case ValueKind::kList:
      return !items().empty();
    case ValueKind::kDict:
      return dict_data().size() != 0;
    case ValueKind::kNamespace:
    case ValueKind::kCallable:
    case ValueKind::kLoop:
      return true;
  }
  return false;
}

uint32_t Value::depth() const {
  if (is_list()) return std::get<std::shared_ptr<const ListData>>(ptr_)->depth;
  if (is_dict()) return dict_data().depth();
  if (is_namespace()) return ns_data().attrs.depth();
  return 0;
}

bool Value::holds_namespace() const {
  if (is_namespace()) return true;
  if (is_list()) return std::get<std::shared_ptr<const ListData>>(ptr_)->holds_namespace;
  if (is_dict()) return dict_data().holds_namespace();
  return false;
}

std::string_view Value::type_name() const {
  switch (kind_) {
    case ValueKind::kUndefined: return "Undefined";
    case ValueKind::kNone: return "NoneType";
    case ValueKind::kBool: return "bool";
    case ValueKind::kInt: return "int";
    case ValueKind::kFloat: return "float";
    case ValueKind::kString: return "str";
    case ValueKind::kList: return tuple_ ? "tuple" : "list";
    case ValueKind::kDict: return "dict";
    case ValueKind::kNamespace: return "Namespace";
    case ValueKind::kCallable: return "function";
    case ValueKind::kLoop: return "LoopContext";
  }
  return "object";
}

const void* Value::identity() const {
  return std::visit(
      [](const auto& p) -> const void* {
        if constexpr (std::is_same_v<std::decay_t<decltype(p)>, std::monostate>) {
          return nullptr;
        } else {
          return p.get();
        }
      },
      ptr_);
}

// ---- DictData -----------------------------------------------------------------------------

void DictData::set(std::string key, Value value) {
  depth_ = std::max(depth_, value.depth() + 1);
  holds_namespace_ = holds_namespace_ || value.holds_namespace();
  for (size_t i = 0; i < entries_.size() && index_.empty(); ++i) {
    if (entries_[i].first == key) {
      entries_[i].second = std::move(value);
      return;
    }
  }
  if (!index_.empty()) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      entries_[it->second].second = std::move(value);
      return;
    }
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (entries_.size() > kIndexThreshold) {
    if (index_.empty()) {
      for (size_t i = 0; i < entries_.size(); ++i) index_.emplace(entries_[i].first, i);
    } else {
      index_.emplace(entries_.back().first, entries_.size() - 1);
    }
  }
}

const Value* DictData::find(std::string_view key) const {
  if (index_.empty()) {
    for (const auto& [k, v] : entries_) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

// ---- Comparison ---------------------------------------------------------------------------

bool values_equal(const Value& a, const Value& b, Budget& budget) {
  budget.tick();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case ValueKind::kUndefined:
    case ValueKind::kNone:
      return true;
    case ValueKind::kString:
      return a.str() == b.str();
    case ValueKind::kList: {
      if (a.is_tuple() != b.is_tuple()) return false;
      if (a.identity() == b.identity()) return true;
      const auto& x = a.items();
      const auto& y = b.items();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i) {
        if (!values_equal(x[i], y[i], budget)) return false;
      }
      return true;
    }
    case ValueKind::kDict: {
      if (a.identity() == b.identity()) return true;
      const DictData& x = a.dict_data();
      const DictData& y = b.dict_data();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.find(k);
        if (other == nullptr || !values_equal(v, *other, budget)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

int compare_values(const Value& a, const Value& b, Budget& budget) {
  budget.tick();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double();
      const double y = b.as_double();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.as_int();
    const int64_t y = b.as_int();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i], budget)) return compare_values(x[i], y[i], budget);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  throw_type_error("'<' not supported between instances of '" + std::string(a.type_name()) +
                   "' and '" + std::string(b.type_name()) + "'");
}

// ---- Printing -----------------------------------------------------------------------------

void BoundedWriter::append(std::string_view s) {
  if (out_.size() + s.size() > max_bytes_) {
    throw Error(ErrorKind::kLimit, "rendered text exceeds the output limit of " +
                                       std::to_string(max_bytes_) + " bytes");
  }
  out_.append(s);
}

namespace {

void append_int(BoundedWriter& out, int64_t i) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(i));
  out.append(std::string_view(buf, static_cast<size_t>(n)));
}

void append_sequence_repr(BoundedWriter& out, const Value& v) {
  const auto& items = v.items();
  out.append(v.is_tuple() ? '(' : '[');
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out.append(", ");
    append_repr(out, items[i]);
  }
  if (v.is_tuple() && items.size() == 1) out.append(',');
  out.append(v.is_tuple() ? ')' : ']');
}

void append_dict_repr(BoundedWriter& out, const DictData& d) {
  out.append('{');
  bool first = true;
  for (const auto& [k, val] : d.entries()) {
    if (!first) out.append(", ");
    first = false;
    std::string key;
    append_py_repr_string(key, k);
    out.append(key);
    out.append(": ");
    append_repr(out, val);
  }
  out.append('}');
}

}  // namespace

void append_str(BoundedWriter& out, const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      return;
    case ValueKind::kString:
      out.append(v.str());
      return;
    default:
      append_repr(out, v);
  }
}

std::string to_str(const Value& v, size_t max_bytes) {
  if (v.is_string()) return v.str();
  std::string s;
  BoundedWriter w(s, max_bytes);
  append_str(w, v);
  return s;
}

void append_repr(BoundedWriter& out, const Value& v) {
  switch (v.kind()) {
    case ValueKind::kUndefined:
      out.append("Undefined");
      return;
    case ValueKind::kNone:
      out.append("None");
      return;
    case ValueKind::kBool:
      out.append(v.as_bool() ? "True" : "False");
      return;
    case ValueKind::kInt:
      append_int(out, v.as_int());
      return;
    case ValueKind::kFloat:
      out.append(py_float_repr(v.as_double()));
      return;
    case ValueKind::kString: {
      std::string s;
      append_py_repr_string(s, v.str());
      out.append(s);
      return;
    }
    case ValueKind::kList:
      append_sequence_repr(out, v);
      return;
    case ValueKind::kDict:
      append_dict_repr(out, v.dict_data());
      return;
    case ValueKind::kNamespace:
      out.append("<Namespace ");
      append_dict_repr(out, v.ns_data().attrs);
      out.append('>');
      return;
    case ValueKind::kCallable:
      out.append("<function " + v.callable_data().name + ">");
      return;
    case ValueKind::kLoop:
      out.append("<LoopContext " + std::to_string(v.loop_data().index0 + 1) + "/" +
                 std::to_string(v.loop_data().items->size()) + ">");
      return;
  }
}

// ---- JSON ---------------------------------------------------------------------------------

namespace {

void append_json_string(BoundedWriter& out, std::string_view s, bool ensure_ascii) {
  std::string buf;
  buf.reserve(s.size() + 2);
  buf += '"';
  char esc[16];
  for (size_t i = 0; i < s.size();) {
    size_t len = 1;
    const uint32_t cp = decode_utf8(s, i, &len);
    switch (cp) {
      case '"': buf += "\\\""; break;
      case '\\': buf += "\\\\"; break;
      case '\n': buf += "\\n"; break;
      case '\r': buf += "\\r"; break;
      case '\t': buf += "\\t"; break;
      case '\b': buf += "\\b"; break;
      case '\f': buf += "\\f"; break;
      default:
        if (cp < 0x20) {
          std::snprintf(esc, sizeof(esc), "\\u%04x", cp);
          buf += esc;
        } else if (ensure_ascii && cp >= 0x80) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(esc, sizeof(esc), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(esc, sizeof(esc), "\\u%04x", cp);
          }
          buf += esc;
        } else {
          buf.append(s.substr(i, len));
        }
    }
    i += len;
  }
  buf += '"';
  out.append(buf);
}

void append_json_float(BoundedWriter& out, double d) {
  if (std::isnan(d)) {
    out.append("NaN");
  } else if (std::isinf(d)) {
    out.append(d > 0 ? "Infinity" : "-Infinity");
  } else {
    out.append(py_float_repr(d));
  }
}

void append_newline_indent(BoundedWriter& out, const JsonStyle& style, uint32_t level) {
  out.append('\n');
  for (uint32_t i = 0; i < level; ++i) out.append(*style.indent);
}

void append_json_at(BoundedWriter& out, const Value& v, const JsonStyle& style, uint32_t level) {
  switch (v.kind()) {
    case ValueKind::kNone:
      out.append("null");
      return;
    case ValueKind::kBool:
      out.append(v.as_bool() ? "true" : "false");
      return;
    case ValueKind::kInt:
      append_int(out, v.as_int());
      return;
    case ValueKind::kFloat:
      append_json_float(out, v.as_double());
      return;
    case ValueKind::kString:
      append_json_string(out, v.str(), style.ensure_ascii);
      return;
    case ValueKind::kList: {
      const auto& items = v.items();
      if (items.empty()) {
        out.append("[]");
        return;
      }
      out.append('[');
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out.append(style.item_separator);
        if (style.indent) append_newline_indent(out, style, level + 1);
        append_json_at(out, items[i], style, level + 1);
      }
      if (style.indent) append_newline_indent(out, style, level);
      out.append(']');
      return;
    }
    case ValueKind::kDict: {
      const auto& entries = v.dict_data().entries();
      if (entries.empty()) {
        out.append("{}");
        return;
      }
      std::vector<const std::pair<std::string, Value>*> order;
      order.reserve(entries.size());
      for (const auto& e : entries) order.push_back(&e);
      if (style.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      }
      out.append('{');
      for (size_t i = 0; i < order.size(); ++i) {
        if (i) out.append(style.item_separator);
        if (style.indent) append_newline_indent(out, style, level + 1);
        append_json_string(out, order[i]->first, style.ensure_ascii);
        out.append(style.key_separator);
        append_json_at(out, order[i]->second, style, level + 1);
      }
      if (style.indent) append_newline_indent(out, style, level);
      out.append('}');
      return;
    }
    default:
      throw_type_error("Object of type " + std::string(v.type_name()) +
                       " is not JSON serializable");
  }
}

template <class Json>
Value from_json_at(const Json& j, uint32_t depth) {
  if (depth > kMaxValueDepth) {
    throw Error(ErrorKind::kLimit, "JSON input nested deeper than " +
                                       std::to_string(kMaxValueDepth) + " levels");
  }
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::number(static_cast<double>(u));
      return Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      DictData d;
      for (auto it = j.begin(); it != j.end(); ++it) d.set(it.key(), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    case nlohmann::json::value_t::binary:
      throw_type_error("binary JSON values are not supported");
  }
  return Value::none();
}

}  // namespace

void append_json(BoundedWriter& out, const Value& v, const JsonStyle& style) {
  append_json_at(out, v, style, 0);
}

Value from_json(const nlohmann::json& j) { return from_json_at(j, 0); }
Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

}  // namespace metro::jinja
