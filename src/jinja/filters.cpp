// The built-in filters (declared in builtins.h).
#include "jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "jinja/args.h"
#include "jinja/ops.h"
#include "jinja/string.h"

namespace metro::jinja {
namespace {

// `a.b.0` attribute paths of map/selectattr/sort(attribute=...).
Value attribute_path(const Value& item, std::string_view path, Budget& budget) {
  Value v = item;
  size_t pos = 0;
  while (true) {
    const size_t dot = path.find('.', pos);
    const std::string_view part = path.substr(pos, dot == std::string_view::npos ? path.npos : dot - pos);
    if (!part.empty() && part.find_first_not_of("0123456789") == std::string_view::npos && part.size() < 18) {
      v = get_item(v, Value::integer(std::stoll(std::string(part))), budget);
    } else {
      v = get_item(v, Value::string(std::string(part)), budget);
    }
    if (dot == std::string_view::npos) return v;
    pos = dot + 1;
  }
}

Value attribute_arg(const Value& item, const Value& attribute, Budget& budget) {
  if (attribute.is_int()) return get_item(item, attribute, budget);
  return attribute_path(item, string_arg(attribute, "attribute"), budget);
}

// Case folding of sort/unique/min/max when case_sensitive is false.
Value fold_case(const Value& v, bool case_sensitive) {
  if (case_sensitive || !v.is_string()) return v;
  return Value::string(ascii_lower(v.str()));
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

// ---- filters ------------------------------------------------------------------------------

Value f_abs(const Value& v, const Args&, Budget&) {
  if (v.is_float()) return Value::number(std::fabs(v.as_double()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) throw_type_error("integer result does not fit in 64 bits");
    return Value::integer(std::llabs(v.as_int()));
  }
  throw_type_error("bad operand type for abs(): '" + std::string(v.type_name()) + "'");
}

// Jinja's attr() reads Python attributes only: a dict's methods, never its keys.
Value f_attr(const Value& v, const Args& args, Budget& budget) {
  Params p("attr", args, {"name"});
  const std::string& name = string_arg(p[0], "attr name");
  if (v.is_dict()) {
    const Value m = get_attribute(v, name, budget);
    return m.is_callable() ? m : Value::undefined("'dict object' has no attribute '" + name + "'");
  }
  return get_attribute(v, name, budget);
}

Value f_capitalize(const Value& v, const Args&, Budget& budget) {
  return make_string(py_capitalize(text_of(v, budget)), budget);
}

Value f_default(const Value& v, const Args& args, Budget&) {
  Params p("default", args, {"default_value", "boolean"});
  if (v.is_undefined() || (p[1].truthy() && !v.truthy())) {
    return p.passed(0) ? p[0] : Value::string("");
  }
  return v;
}

Value f_dictsort(const Value& v, const Args& args, Budget& budget) {
  Params p("dictsort", args, {"case_sensitive", "by", "reverse"});
  if (!v.is_dict()) throw_type_error("dictsort expects a mapping");
  const bool cs = p[0].truthy();
  const bool by_value = p.given(1) && string_arg(p[1], "by") == "value";
  std::vector<Value> items;
  for (const auto& [k, val] : v.dict_data().entries()) {
    items.push_back(Value::list({Value::string(k), val}, true));
  }
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const size_t i = by_value ? 1 : 0;
    return compare_values(fold_case(a.items()[i], cs), fold_case(b.items()[i], cs), budget) < 0;
  });
  if (p[2].truthy()) std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_escape(const Value& v, const Args&, Budget& budget) {
  return make_string(html_escape(text_of(v, budget)), budget);
}

Value f_first(const Value& v, const Args&, Budget& budget) {
  if (v.is_list()) {
    return v.items().empty() ? Value::undefined("No first item, sequence was empty.") : v.items()[0];
  }
  std::vector<Value> items = iterate(v, budget);
  return items.empty() ? Value::undefined("No first item, sequence was empty.") : items[0];
}

Value f_last(const Value& v, const Args&, Budget& budget) {
  if (v.is_list()) {
    return v.items().empty() ? Value::undefined("No last item, sequence was empty.") : v.items().back();
  }
  std::vector<Value> items = iterate(v, budget);
  return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
}

std::optional<double> to_float(const Value& v) {
  if (v.is_number()) return v.as_double();
  if (v.is_string()) return parse_py_float(v.str());
  return std::nullopt;
}

Value f_float(const Value& v, const Args& args, Budget&) {
  Params p("float", args, {"default"});
  if (auto d = to_float(v)) return Value::number(*d);
  return p.given(0) ? p[0] : Value::number(0.0);
}

Value f_indent(const Value& v, const Args& args, Budget& budget) {
  Params p("indent", args, {"width", "first", "blank"});
  std::string indention = "    ";
  if (p.given(0)) {
    indention = p[0].is_string() ? p[0].str()
                                 : std::string(static_cast<size_t>(std::clamp<int64_t>(
                                                   int_arg(p[0], "width"), 0, 1024)),
                                               ' ');
  }
  // Jinja appends "\n" to its argument with +=, which only strings support.
  if (v.is_undefined()) throw Error(ErrorKind::kUndefined, v.undefined_hint());
  std::string s = string_arg(v, "indent() input") + "\n";
  const std::vector<std::string> lines = py_splitlines(s);
  std::string out;
  BoundedWriter w(out, max_bytes(budget));
  if (p[2].truthy()) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) {
        w.append('\n');
        w.append(indention);
      }
      w.append(lines[i]);
    }
  } else if (!lines.empty()) {
    w.append(lines[0]);
    for (size_t i = 1; i < lines.size(); ++i) {
      w.append('\n');
      if (!lines[i].empty()) w.append(indention);
      w.append(lines[i]);
    }
  }
  if (p[1].truthy()) out = indention + out;
  return make_string(std::move(out), budget);
}

Value f_int(const Value& v, const Args& args, Budget&) {
  Params p("int", args, {"default", "base"});
  const Value fallback = p.given(0) ? p[0] : Value::integer(0);
  const int64_t base = p.given(1) ? int_arg(p[1], "base") : 10;
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_string()) {
    if (auto i = parse_py_int(v.str(), static_cast<int>(base))) return Value::integer(*i);
  }
  if (auto d = to_float(v)) {
    // int(float(x)) truncates toward zero; values beyond int64 fall back like NaN does.
    if (std::isfinite(*d) && std::fabs(*d) < 9.2e18) return Value::integer(static_cast<int64_t>(*d));
  }
  return fallback;
}

Value f_items(const Value& v, const Args&, Budget& budget) {
  if (v.is_undefined()) return Value::list({});
  if (!v.is_dict()) throw_type_error("Can only get item pairs from a mapping.");
  std::vector<Value> items;
  budget.tick(v.dict_data().size());
  for (const auto& [k, val] : v.dict_data().entries()) {
    items.push_back(Value::list({Value::string(k), val}, true));
  }
  return Value::list(std::move(items));
}

Value f_join(const Value& v, const Args& args, Budget& budget) {
  Params p("join", args, {"d", "attribute"});
  const std::string sep = p.given(0) ? text_of(p[0], budget) : std::string();
  std::string out;
  BoundedWriter w(out, max_bytes(budget));
  bool first = true;
  for (const Value& item : iterate(v, budget)) {
    budget.tick();
    if (!first) w.append(sep);
    first = false;
    append_str(w, p.given(1) ? attribute_arg(item, p[1], budget) : item);
  }
  return make_string(std::move(out), budget);
}

Value f_length(const Value& v, const Args&, Budget&) {
  switch (v.kind()) {
    case ValueKind::kUndefined: return Value::integer(0);
    case ValueKind::kString: return Value::integer(static_cast<int64_t>(code_point_count(v.str())));
    case ValueKind::kList: return Value::integer(static_cast<int64_t>(v.items().size()));
    case ValueKind::kDict: return Value::integer(static_cast<int64_t>(v.dict_data().size()));
    default:
      throw_type_error("object of type '" + std::string(v.type_name()) + "' has no len()");
  }
}

Value f_list(const Value& v, const Args&, Budget& budget) { return Value::list(iterate(v, budget)); }

Value f_lower(const Value& v, const Args&, Budget& budget) {
  return make_string(ascii_lower(text_of(v, budget)), budget);
}

Value f_upper(const Value& v, const Args&, Budget& budget) {
  return make_string(ascii_upper(text_of(v, budget)), budget);
}

Value f_map(const Value& v, const Args& args, Budget& budget) {
  std::vector<Value> out;
  // Jinja's map/select family does `if seq: for item in seq`: a falsy operand is empty.
  const std::vector<Value> items = v.truthy() ? iterate(v, budget) : std::vector<Value>();
  const auto* attribute = [&]() -> const Value* {
    for (const auto& [k, val] : args.keywords) {
      if (k == "attribute") return &val;
    }
    return nullptr;
  }();
  if (attribute) {
    Value fallback;
    bool has_default = false;
    for (const auto& [k, val] : args.keywords) {
      if (k == "default") fallback = val, has_default = true;
      else if (k != "attribute") throw_type_error("map() got an unexpected keyword argument '" + k + "'");
    }
    for (const Value& item : items) {
      budget.tick();
      Value r = attribute_arg(item, *attribute, budget);
      out.push_back(r.is_undefined() && has_default ? fallback : r);
    }
    return Value::list(std::move(out));
  }
  if (args.positional.empty()) throw_type_error("map() needs a filter name or attribute=");
  const std::string& name = string_arg(args.positional[0], "map filter name");
  if (!is_filter_name(name)) throw_type_error("no filter named '" + name + "'");
  Args rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const Value& item : items) {
    budget.tick();
    out.push_back(apply_filter(name, item, rest, budget));
  }
  return Value::list(std::move(out));
}

Value min_max(const Value& v, const Args& args, Budget& budget, bool want_max) {
  Params p(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool cs = p[0].truthy();
  const std::vector<Value> items = iterate(v, budget);
  if (items.empty()) return Value::undefined(std::string("No aggregated item, sequence was empty."));
  const Value* best = &items[0];
  Value best_key;
  auto key = [&](const Value& item) {
    return fold_case(p.given(1) ? attribute_arg(item, p[1], budget) : item, cs);
  };
  best_key = key(*best);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    const int c = compare_values(k, best_key, budget);
    if (want_max ? c > 0 : c < 0) {
      best = &items[i];
      best_key = std::move(k);
    }
  }
  return *best;
}

Value f_max(const Value& v, const Args& args, Budget& budget) { return min_max(v, args, budget, true); }
Value f_min(const Value& v, const Args& args, Budget& budget) { return min_max(v, args, budget, false); }

// select/reject/selectattr/rejectattr share this: keep items whose test result == keep.
Value select_items(const Value& v, const Args& args, Budget& budget, bool by_attribute, bool keep) {
  const std::vector<Value> items = v.truthy() ? iterate(v, budget) : std::vector<Value>();
  size_t next_arg = 0;
  const Value* attribute = nullptr;
  if (by_attribute) {
    if (args.positional.empty()) throw_type_error("selectattr/rejectattr need an attribute");
    attribute = &args.positional[next_arg++];
  }
  std::string test;
  if (next_arg < args.positional.size()) {
    test = string_arg(args.positional[next_arg++], "test name");
    if (!is_test_name(test)) throw_type_error("no test named '" + test + "'");
  }
  Args test_args;
  test_args.positional.assign(args.positional.begin() + static_cast<ptrdiff_t>(next_arg), args.positional.end());
  test_args.keywords = args.keywords;
  std::vector<Value> out;
  for (const Value& item : items) {
    budget.tick();
    const Value subject = attribute ? attribute_arg(item, *attribute, budget) : item;
    const bool pass = test.empty() ? subject.truthy() : apply_test(test, subject, test_args, budget);
    if (pass == keep) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(const Value& v, const Args& a, Budget& b) { return select_items(v, a, b, false, true); }
Value f_reject(const Value& v, const Args& a, Budget& b) { return select_items(v, a, b, false, false); }
Value f_selectattr(const Value& v, const Args& a, Budget& b) { return select_items(v, a, b, true, true); }
Value f_rejectattr(const Value& v, const Args& a, Budget& b) { return select_items(v, a, b, true, false); }

Value f_replace(const Value& v, const Args& args, Budget& budget) {
  Params p("replace", args, {"old", "new", "count"});
  const int64_t count = p.given(2) ? int_arg(p[2], "count") : -1;
  std::string out = py_replace(text_of(v, budget), text_of(p[0], budget), text_of(p[1], budget),
                               count, max_bytes(budget));
  return make_string(std::move(out), budget);
}

Value f_reverse(const Value& v, const Args&, Budget& budget) {
  if (v.is_string()) {
    const std::vector<size_t> offs = code_point_offsets(v.str());
    std::string out;
    out.reserve(v.str().size());
    for (size_t k = offs.size() - 1; k > 0; --k) out.append(v.str(), offs[k - 1], offs[k] - offs[k - 1]);
    return make_string(std::move(out), budget);
  }
  std::vector<Value> items = iterate(v, budget);
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

Value f_round(const Value& v, const Args& args, Budget&) {
  Params p("round", args, {"precision", "method"});
  const int64_t precision = p.given(0) ? std::clamp<int64_t>(int_arg(p[0], "precision"), 0, 15) : 0;
  const std::string method = p.given(1) ? string_arg(p[1], "method") : "common";
  if (!v.is_number()) throw_type_error("round() expects a number");
  const double x = v.as_double();
  const double scale = std::pow(10.0, static_cast<double>(precision));
  if (method == "ceil") return Value::number(std::ceil(x * scale) / scale);
  if (method == "floor") return Value::number(std::floor(x * scale) / scale);
  if (method != "common") throw_type_error("method must be common, ceil or floor");
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (!std::isfinite(x)) return Value::number(x);
  // printf rounds the exact binary value half-to-even, as Python's round() does.
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(precision), x);
  return Value::number(std::strtod(buf, nullptr));
}

Value f_safe(const Value& v, const Args&, Budget& budget) { return make_string(text_of(v, budget), budget); }

Value f_sort(const Value& v, const Args& args, Budget& budget) {
  Params p("sort", args, {"reverse", "case_sensitive", "attribute"});
  std::vector<Value> items = iterate(v, budget);
  const bool cs = p[1].truthy();
  auto key = [&](const Value& item) {
    return fold_case(p.given(2) ? attribute_arg(item, p[2], budget) : item, cs);
  };
  const bool reverse = p[0].truthy();
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    const int c = compare_values(key(a), key(b), budget);
    return reverse ? c > 0 : c < 0;
  });
  return Value::list(std::move(items));
}

Value f_string(const Value& v, const Args&, Budget& budget) { return make_string(text_of(v, budget), budget); }

Value f_sum(const Value& v, const Args& args, Budget& budget) {
  Params p("sum", args, {"attribute", "start"});
  Value total = p.given(1) ? p[1] : Value::integer(0);
  for (const Value& item : iterate(v, budget)) {
    total = binary_op(BinaryOp::kAdd, total, p.given(0) ? attribute_arg(item, p[0], budget) : item, budget);
  }
  return total;
}

Value f_title(const Value& v, const Args&, Budget& budget) {
  return make_string(jinja_title(text_of(v, budget)), budget);
}

Value f_tojson(const Value& v, const Args& args, Budget& budget) {
  // Hugging Face's signature: tojson(x, ensure_ascii=False, indent=None, separators=None,
  // sort_keys=False) -> json.dumps(...).
  Params p("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonStyle style;
  style.ensure_ascii = p[0].truthy();
  if (p.given(1)) {
    if (p[1].is_string()) {
      style.indent = p[1].str();
    } else {
      style.indent = std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(p[1], "indent"), 0, 1024)), ' ');
    }
    style.item_separator = ",";
  }
  if (p.given(2)) {
    const Value& seps = p[2];
    if (!seps.is_list() || seps.items().size() != 2 || !seps.items()[0].is_string() ||
        !seps.items()[1].is_string()) {
      throw_type_error("tojson separators must be a pair of strings");
    }
    style.item_separator = seps.items()[0].str();
    style.key_separator = seps.items()[1].str();
  }
  style.sort_keys = p[3].truthy();
  std::string out;
  BoundedWriter w(out, max_bytes(budget));
  append_json(w, v, style);
  return make_string(std::move(out), budget);
}

Value f_trim(const Value& v, const Args& args, Budget& budget) {
  Params p("trim", args, {"chars"});
  return make_string(py_strip(text_of(v, budget), optional_string(p, 0, "chars"), StripSide::kBoth), budget);
}

Value f_unique(const Value& v, const Args& args, Budget& budget) {
  Params p("unique", args, {"case_sensitive", "attribute"});
  const bool cs = p[0].truthy();
  std::vector<Value> out;
  std::vector<Value> seen;
  for (const Value& item : iterate(v, budget)) {
    Value key = fold_case(p.given(1) ? attribute_arg(item, p[1], budget) : item, cs);
    bool dup = false;
    for (const Value& s : seen) {
      if (values_equal(s, key, budget)) {
        dup = true;
        break;
      }
    }
    if (!dup) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

using FilterFn = Value (*)(const Value&, const Args&, Budget&);
struct FilterEntry {
  std::string_view name;
  FilterFn fn;
};

constexpr FilterEntry kFilters[] = {
    {"abs", f_abs},           {"attr", f_attr},         {"capitalize", f_capitalize},
    {"count", f_length},      {"d", f_default},         {"default", f_default},
    {"dictsort", f_dictsort}, {"e", f_escape},          {"escape", f_escape},
    {"first", f_first},       {"float", f_float},       {"indent", f_indent},
    {"int", f_int},           {"items", f_items},       {"join", f_join},
    {"last", f_last},         {"length", f_length},     {"list", f_list},
    {"lower", f_lower},       {"map", f_map},           {"max", f_max},
    {"min", f_min},           {"reject", f_reject},     {"rejectattr", f_rejectattr},
    {"replace", f_replace},   {"reverse", f_reverse},   {"round", f_round},
    {"safe", f_safe},         {"select", f_select},     {"selectattr", f_selectattr},
    {"sort", f_sort},         {"string", f_string},     {"sum", f_sum},
    {"title", f_title},       {"tojson", f_tojson},     {"trim", f_trim},
    {"unique", f_unique},     {"upper", f_upper},
};

FilterFn find_filter(std::string_view name) {
  for (const FilterEntry& e : kFilters) {
    if (e.name == name) return e.fn;
  }
  return nullptr;
}

}  // namespace

bool is_filter_name(std::string_view name) { return find_filter(name) != nullptr; }

Value apply_filter(std::string_view name, const Value& operand, const Args& args, Budget& budget) {
  budget.tick();
  const FilterFn fn = find_filter(name);
  if (fn == nullptr) throw_type_error("no filter named '" + std::string(name) + "'");
  return fn(operand, args, budget);
}

}  // namespace metro::jinja
