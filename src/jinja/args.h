// Argument binding shared by the built-in filters, tests, methods and globals
// (filters.cpp, builtins.cpp). Internal to the Jinja sandbox.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/limits.h"
#include "jinja/value.h"

namespace metro::jinja {

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// Binds positional and keyword arguments to a Python-style parameter list.
class Params {
 public:
  Params(std::string_view fn, const Args& args, std::initializer_list<std::string_view> names)
      : names_(names) {
    values_.resize(names_.size());
    given_.assign(names_.size(), false);
    if (args.positional.size() > names_.size()) {
      throw_type_error(std::string(fn) + "() takes at most " + std::to_string(names_.size()) +
                       " argument(s), got " + std::to_string(args.positional.size()));
    }
    for (size_t i = 0; i < args.positional.size(); ++i) {
      values_[i] = args.positional[i];
      given_[i] = true;
    }
    for (const auto& [name, value] : args.keywords) {
      const size_t i = index_of(name);
      if (i == names_.size()) {
        throw_type_error(std::string(fn) + "() got an unexpected keyword argument '" + name + "'");
      }
      values_[i] = value;
      given_[i] = true;
    }
  }
  // Passed and not None (Python's `if x is not None` on a defaulted parameter).
  bool given(size_t i) const { return given_[i] && !values_[i].is_none(); }
  bool passed(size_t i) const { return given_[i]; }
  const Value& operator[](size_t i) const { return values_[i]; }

 private:
  size_t index_of(std::string_view name) const {
    size_t i = 0;
    for (std::string_view n : names_) {
      if (n == name) return i;
      ++i;
    }
    return names_.size();
  }
  std::vector<std::string_view> names_;
  std::vector<Value> values_;
  std::vector<bool> given_;
};

inline size_t max_bytes(const Budget& b) { return b.limits().max_output_bytes; }

inline std::string text_of(const Value& v, Budget& budget) { return to_str(v, max_bytes(budget)); }

inline Value make_string(std::string s, Budget& budget) {
  budget.charge_bytes(s.size());
  return Value::string(std::move(s));
}

inline int64_t int_arg(const Value& v, std::string_view what) {
  if (!v.is_int() && !v.is_bool()) {
    throw_type_error(std::string(what) + " must be an integer, not " + std::string(v.type_name()));
  }
  return v.as_int();
}

inline const std::string& string_arg(const Value& v, std::string_view what) {
  if (!v.is_string()) {
    throw_type_error(std::string(what) + " must be a string, not " + std::string(v.type_name()));
  }
  return v.str();
}

inline std::optional<std::string> optional_string(const Params& p, size_t i, std::string_view what) {
  if (!p.given(i)) return std::nullopt;
  return string_arg(p[i], what);
}

// Python's str.isupper()/islower() over ASCII letters: some cased letter, all of one case.
inline bool has_cased(std::string_view s, bool upper) {
  bool any = false;
  for (char c : s) {
    if (c >= 'a' && c <= 'z') {
      if (upper) return false;
      any = true;
    } else if (c >= 'A' && c <= 'Z') {
      if (!upper) return false;
      any = true;
    }
  }
  return any;
}

}  // namespace metro::jinja
