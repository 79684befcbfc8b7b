// Jinja's built-in filters (filters.cpp), tests and globals, and the methods of str
// and dict that the sandbox allows (builtins.cpp), implemented over jinja::Value.
//
// Filters: abs, attr, capitalize, count, d/default, dictsort, e/escape, first, float,
// indent, int, items, join, last, length, list, lower, map, max, min, reject, rejectattr,
// replace, reverse, round, safe, select, selectattr, sort, string, sum, title, tojson
// (Hugging Face's variant: json.dumps with indent/separators/sort_keys/ensure_ascii, no
// HTML escaping, keys in insertion order), trim, unique, upper.
// Tests: boolean, callable, defined, divisibleby, eq/equalto/==, escaped, even, false,
// float, ge/>=, gt/>, in, integer, iterable, le/<=, lower, lt/<, mapping, ne/!=, none,
// number, odd, sameas, sequence, string, true, undefined, upper.
// Methods: str.{startswith, endswith, strip, lstrip, rstrip, split, rsplit, splitlines,
// upper, lower, title, capitalize, replace, find, count, join, isdigit, isalpha, isalnum,
// isspace, isupper, islower}; dict.{items, keys, values, get}; list.{count, index}.
// Globals: range (at most 100000 items, like Jinja's sandbox), namespace, dict; the
// interpreter adds raise_exception and strftime_now.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jinja/args.h"
#include "jinja/limits.h"
#include "jinja/value.h"

namespace metro::jinja {

bool is_filter_name(std::string_view name);
bool is_test_name(std::string_view name);

// Filters and tests. Unknown names are rejected by the parser, so here they are bugs.
Value apply_filter(std::string_view name, const Value& operand, const Args& args, Budget& budget);
bool apply_test(std::string_view name, const Value& operand, const Args& args, Budget& budget);

// Calls a bound str/dict method, loop.cycle, or one of range/namespace/dict.
Value call_builtin(const Callable& fn, const Args& args, Budget& budget);
// The builtin globals by name; Undefined when `name` is none of them.
Value builtin_global(std::string_view name);

}  // namespace metro::jinja
