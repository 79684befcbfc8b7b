// Operators and element access on jinja::Value with Python semantics, as the sandbox
// allows them: no attribute of a host object is reachable, only dict keys, the str/dict
// methods listed in builtins.h, and namespace attributes.
#pragma once

#include <string_view>
#include <vector>

#include "jinja/ast.h"
#include "jinja/limits.h"
#include "jinja/value.h"

namespace metro::jinja {

// Sandboxed attribute access `obj.name`: dict methods, then dict keys; str methods;
// namespace attributes. Anything else is Undefined. Undefined operands raise.
Value get_attribute(const Value& obj, std::string_view name, Budget& budget);
// `obj[key]`: dict keys (then dict methods), list/tuple/str indices (negative allowed).
Value get_item(const Value& obj, const Value& key, Budget& budget);
// `obj[start:stop:step]` on lists, tuples and strings; unset bounds are Undefined/None.
Value get_slice(const Value& obj, const Value& start, const Value& stop, const Value& step,
                Budget& budget);

// Iterates as Python would for `for` and filters: list items, dict keys, str characters;
// Undefined iterates as empty. Other values are a type error.
std::vector<Value> iterate(const Value& v, Budget& budget);

// The binary operators of Jinja expressions with Python semantics (int overflow is an
// error, / is true division, // and % floor). `+` concatenates strings and lists; `*`
// repeats them (bounded by the output limit); `~` joins str() of both sides.
Value binary_op(BinaryOp op, const Value& a, const Value& b, Budget& budget);
// `a in b`: substring, list membership, dict key; Undefined b is empty.
bool contains(const Value& container, const Value& item, Budget& budget);

}  // namespace metro::jinja
