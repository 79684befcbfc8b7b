// Values of the Jinja sandbox: Python's plain data (None, bool, int, float, str, list,
// tuple, dict) plus Jinja's Undefined, namespace() objects and callables.
//
// Lists, tuples and dicts are immutable once built (as in Jinja's ImmutableSandbox), so a
// Value is a cheap handle: copies share the payload. Only namespaces are mutable, and a
// namespace may not hold another namespace, so values can never form a reference cycle.
// Containers record their nesting depth; building one deeper than kMaxValueDepth fails,
// which keeps recursion over values (printing, comparing, destroying) shallow.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/limits.h"

namespace metro::jinja {

struct Frame;     // a variable scope of the interpreter (interpreter.cpp)
struct MacroDef;  // ast.h
struct Stmt;      // ast.h

inline constexpr uint32_t kMaxValueDepth = 128;

enum class ValueKind : uint8_t {
  kUndefined,
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kList,  // also tuples (is_tuple())
  kDict,
  kNamespace,
  kCallable,
  kLoop,  // the `loop` object of a for-loop iteration
};

struct ListData;
class DictData;
struct NamespaceData;
struct Callable;
struct LoopData;

class Value {
 public:
  Value() = default;  // Undefined with no name
  // `hint` is the message used when the undefined value is misused, e.g. "'x' is undefined".
  static Value undefined(std::string hint);
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  // Throws ErrorKind::kLimit when the result would nest deeper than kMaxValueDepth.
  static Value list(std::vector<Value> items, bool tuple = false);
  static Value dict(DictData data);
  static Value ns(std::shared_ptr<NamespaceData> data);
  static Value callable(std::shared_ptr<const Callable> fn);
  static Value loop(std::shared_ptr<const LoopData> loop);

  ValueKind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == ValueKind::kUndefined; }
  bool is_none() const { return kind_ == ValueKind::kNone; }
  bool is_bool() const { return kind_ == ValueKind::kBool; }
  bool is_int() const { return kind_ == ValueKind::kInt; }
  bool is_float() const { return kind_ == ValueKind::kFloat; }
  // Python numbers: bool is an int subclass.
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  bool is_string() const { return kind_ == ValueKind::kString; }
  bool is_list() const { return kind_ == ValueKind::kList; }
  bool is_tuple() const { return is_list() && tuple_; }
  bool is_dict() const { return kind_ == ValueKind::kDict; }
  bool is_namespace() const { return kind_ == ValueKind::kNamespace; }
  bool is_callable() const { return kind_ == ValueKind::kCallable; }
  bool is_loop() const { return kind_ == ValueKind::kLoop; }

  bool as_bool() const { return num_.b; }              // is_bool()
  int64_t as_int() const;                               // is_bool() or is_int()
  double as_double() const;                             // is_number()
  const std::string& str() const;                       // is_string()
  const std::vector<Value>& items() const;              // is_list()
  const DictData& dict_data() const;                    // is_dict()
  NamespaceData& ns_data() const;                       // is_namespace()
  const Callable& callable_data() const;                // is_callable()
  const LoopData& loop_data() const;                    // is_loop()
  const std::string& undefined_hint() const;            // is_undefined()

  // Python truthiness; Undefined is false.
  bool truthy() const;
  // Nesting depth: 0 for scalars, 1 for a flat list or dict.
  uint32_t depth() const;
  // True for a namespace or a container that holds one (directly or nested).
  bool holds_namespace() const;
  // Python's type name as Jinja's messages show it: "str", "int", "list", "dict"...
  std::string_view type_name() const;
  // Identity of the shared payload, for Python's `is` and equality shortcuts.
  const void* identity() const;

 private:
  using Payload = std::variant<std::monostate, std::shared_ptr<const std::string>,
                               std::shared_ptr<const ListData>, std::shared_ptr<const DictData>,
                               std::shared_ptr<NamespaceData>, std::shared_ptr<const Callable>,
                               std::shared_ptr<const LoopData>>;
  ValueKind kind_ = ValueKind::kUndefined;
  bool tuple_ = false;
  union {
    bool b;
    int64_t i;
    double f;
  } num_{};
  Payload ptr_;
};

struct ListData {
  std::vector<Value> items;
  uint32_t depth = 1;
  bool holds_namespace = false;
};

// An insertion-ordered dict with string keys (JSON objects and dict literals).
class DictData {
 public:
  // Inserts, or replaces the value of an existing key in place (Python dict semantics).
  void set(std::string key, Value value);
  const Value* find(std::string_view key) const;
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  uint32_t depth() const { return depth_; }
  bool holds_namespace() const { return holds_namespace_; }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Small dicts (messages, tool calls) are scanned; larger ones get a hash index.
  static constexpr size_t kIndexThreshold = 16;
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t, Hash, std::equal_to<>> index_;
  uint32_t depth_ = 1;
  bool holds_namespace_ = false;
};

// One iteration of a for-loop; its attributes (index, first, last, length, ...) are
// computed on access rather than stored, since a loop may run many thousand iterations.
struct LoopData {
  std::shared_ptr<const std::vector<Value>> items;
  int64_t index0 = 0;
};

// The mutable object made by namespace(); `{% set ns.x = ... %}` writes its attributes.
struct NamespaceData {
  DictData attrs;
};

struct Callable {
  enum class Kind : uint8_t {
    kGlobal,     // range, namespace, dict, raise_exception, strftime_now
    kMethod,     // a str/dict method bound to `receiver`
    kMacro,      // {% macro %}: `macro` is its definition, `closure` its defining scope
    kCaller,     // caller() inside a macro invoked by {% call %}: `call_block` is the body
    kLoopCycle,  // loop.cycle(...): `receiver` holds loop.index0
  };
  Kind kind = Kind::kGlobal;
  std::string name;
  Value receiver;
  const MacroDef* macro = nullptr;
  const Stmt* call_block = nullptr;
  // Weak so that a macro stored in its own scope does not keep the scope alive; a macro
  // that outlives its scope falls back to the template's top-level variables.
  std::weak_ptr<Frame> closure;
};

// Python's `==` (1 == 1.0 == True; lists and dicts compare deeply). Ticks the budget per
// element visited.
bool values_equal(const Value& a, const Value& b, Budget& budget);
// Python's ordering for <, <=, >, >=: numbers, strings (by code point), lists/tuples
// (lexicographic). Returns <0, 0, >0; throws a type error for other pairs.
int compare_values(const Value& a, const Value& b, Budget& budget);

// Appends text, failing with ErrorKind::kLimit once `max_bytes` would be exceeded.
class BoundedWriter {
 public:
  BoundedWriter(std::string& out, size_t max_bytes) : out_(out), max_bytes_(max_bytes) {}
  void append(std::string_view s);
  void append(char c) { append(std::string_view(&c, 1)); }
  std::string& out() { return out_; }

 private:
  std::string& out_;
  size_t max_bytes_;
};

// Python's str(value) as `{{ }}` prints it (None -> "None", True -> "True", lists with
// reprs of their items); Undefined prints nothing.
void append_str(BoundedWriter& out, const Value& v);
std::string to_str(const Value& v, size_t max_bytes);
// Python's repr(value).
void append_repr(BoundedWriter& out, const Value& v);

// json.dumps options, as HF's tojson filter exposes them.
struct JsonStyle {
  std::optional<std::string> indent;  // unset: one line
  std::string item_separator = ", ";  // json.dumps' default without indent
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
// json.dumps(value, ...). Throws a type error for values JSON cannot hold (Undefined,
// namespaces, callables), as Python's json module does.
void append_json(BoundedWriter& out, const Value& v, const JsonStyle& style);

// Converts JSON input (messages, tools, extra context) to values, keeping object key order
// as the JSON type stores it. Throws ErrorKind::kLimit when nested deeper than
// kMaxValueDepth.
Value from_json(const nlohmann::json& j);
Value from_json(const nlohmann::ordered_json& j);

}  // namespace metro::jinja
