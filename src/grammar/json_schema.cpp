#include "grammar/json_schema.h"

#include "grammar/charset.h"
#include "grammar/regex.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

namespace metro::grammar {

namespace {

using json = nlohmann::ordered_json;

// The pieces every JSON grammar shares, made once per builder.
class JsonParts {
 public:
  explicit JsonParts(Builder& b) : b_(b) {}

  Element ws() {
    if (!ws_) {
      ByteSet indent;
      indent.add(' ');
      indent.add('\t');
      ws_ = b_.alt({b_.empty(), b_.byte(' '), b_.seq({b_.byte('\n'), b_.repeat(b_.bytes(indent), 0, 16)})}, "ws");
    }
    return *ws_;
  }

  // One character of a JSON string's contents: printable ASCII but quote and backslash,
  // well-formed UTF-8 beyond ASCII, or an escape.
  Element string_char() {
    if (string_char_) return *string_char_;
    ByteSet plain = ByteSet::range(0x20, 0x7e);
    plain.bits[0] &= ~(uint64_t{1} << '"');
    plain.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
    const Element utf8 = utf8_multibyte(b_);
    ByteSet esc;
    for (char c : std::string("\"\\/bfnrt")) esc.add(static_cast<uint8_t>(c));
    const Element escape =
        b_.seq({b_.byte('\\'), b_.alt({b_.bytes(esc), b_.seq({b_.byte('u'), hex(), hex(), hex(), hex()})})}, "escape");
    string_char_ = b_.alt({b_.bytes(plain), utf8, escape}, "char");
    return *string_char_;
  }

  Element string(int min_len = 0, int max_len = -1) {
    if (min_len == 0 && max_len < 0) {
      if (!string_) string_ = b_.seq({b_.byte('"'), b_.star(string_char()), b_.byte('"')}, "string");
      return *string_;
    }
    return b_.seq({b_.byte('"'), b_.repeat(string_char(), min_len, max_len), b_.byte('"')}, "string");
  }

  Element hex() {
    if (!hex_) {
      ByteSet h = ByteSet::range('0', '9');
      h.add_range('a', 'f');
      h.add_range('A', 'F');
      hex_ = b_.bytes(h);
    }
    return *hex_;
  }
  Element digit() { return b_.bytes(ByteSet::range('0', '9')); }
  Element digits(int min, int max) { return b_.repeat(digit(), min, max); }

  // min_value: nullopt, 0 (no sign) or 1 (no sign, no zero).
  Element integer(std::optional<int> min_value = std::nullopt) {
    const Element positive = b_.seq({b_.bytes(ByteSet::range('1', '9')), digits(0, 15)}, "positive");
    if (min_value == 1) return positive;
    const Element natural = b_.alt({b_.byte('0'), positive}, "natural");
    if (min_value == 0) return natural;
    if (!integer_) integer_ = b_.seq({b_.opt(b_.byte('-')), natural}, "integer");
    return *integer_;
  }

  Element number() {
    if (number_) return *number_;
    ByteSet e;
    e.add('e');
    e.add('E');
    ByteSet sign;
    sign.add('+');
    sign.add('-');
    const Element frac = b_.opt(b_.seq({b_.byte('.'), digits(1, 16)}));
    const Element exp = b_.opt(b_.seq({b_.bytes(e), b_.opt(b_.bytes(sign)), digits(1, 3)}));
    number_ = b_.seq({integer(), frac, exp}, "number");
    return *number_;
  }

  Element boolean() { return b_.alt({b_.literal("true"), b_.literal("false")}, "boolean"); }
  Element null() { return b_.literal("null"); }

  // Any JSON value (recursive).
  Element value() {
    if (value_) return *value_;
    const uint32_t v = b_.declare("value");
    value_ = b_.ref(v);
    const Element member = b_.seq({string(), ws(), b_.byte(':'), ws(), *value_}, "member");
    const Element obj = object_of(member);
    const Element arr = array_of(*value_, 0, -1);
    b_.define(v, b_.alt({obj, arr, string(), number(), boolean(), null()}, "any"));
    return *value_;
  }

  Element any_object() {
    const Element member = b_.seq({string(), ws(), b_.byte(':'), ws(), value()}, "member");
    return object_of(member);
  }

  // '{' ws '}' | '{' ws m (ws ',' ws m)* ws '}'
  Element object_of(Element member) {
    const Element more = b_.star(b_.seq({ws(), b_.byte(','), ws(), member}));
    return b_.alt({b_.seq({b_.byte('{'), ws(), b_.byte('}')}),
                   b_.seq({b_.byte('{'), ws(), member, more, ws(), b_.byte('}')})},
                  "object");
  }

  Element array_of(Element item, int min_items, int max_items) {
    std::vector<Element> forms;
    if (min_items == 0) forms.push_back(b_.seq({b_.byte('['), ws(), b_.byte(']')}));
    if (max_items != 0) {
      const Element sep_item = b_.seq({ws(), b_.byte(','), ws(), item});
      const int lo = std::max(0, min_items - 1);
      const int hi = max_items < 0 ? -1 : max_items - 1;
      forms.push_back(b_.seq({b_.byte('['), ws(), item, b_.repeat(sep_item, lo, hi), ws(), b_.byte(']')}));
    }
    return b_.alt(forms, "array");
  }

 private:
  Builder& b_;
  std::optional<Element> ws_, string_char_, string_, hex_, integer_, number_, value_;
};

// Bounds that keep a compiled grammar small.
constexpr int kMaxRepeat = 4096;
constexpr size_t kMaxElements = size_t{1} << 20;
constexpr size_t kMaxProperties = 256;

class SchemaCompiler {
 public:
  SchemaCompiler(Builder& b, const json& root) : b_(b), parts_(b), root_(root) {}

  Expected<Element> compile(const json& s, const std::string& path, int depth = 0) {
    if (depth > 64) return bad(path, "nesting deeper than 64 levels");
    if (b_.grammar().elements().size() > kMaxElements) {
      return bad(path, "the schema compiles to too large a grammar (lengths and item counts add up)");
    }
    if (s.is_boolean()) {
      if (s.get<bool>()) return parts_.value();
      return bad(path, "the schema `false` allows no value");
    }
    if (!s.is_object()) return bad(path, "a schema must be an object or a boolean");
    static const std::set<std::string> kAnnotations = {"title", "description", "default", "examples", "$schema",
                                                       "$id", "$comment", "deprecated", "readOnly", "writeOnly",
                                                       "$defs", "definitions"};
    static const std::set<std::string> kKnown = {
        "type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
        "anyOf", "oneOf", "allOf", "$ref", "minLength", "maxLength", "format", "pattern", "minimum"};
    for (const auto& [k, v] : s.items()) {
      (void)v;
      if (!kAnnotations.count(k) && !kKnown.count(k)) {
        return bad(path, "the keyword '" + k + "' is not supported");
      }
    }
    if (s.contains("$ref")) {
      for (const auto& [k, v] : s.items()) {
        (void)v;
        if (k != "$ref" && !kAnnotations.count(k)) return bad(path, "'$ref' beside '" + k + "' is not supported");
      }
      return reference(s["$ref"], path, depth);
    }
    if (s.contains("const") || s.contains("enum")) {
      // The listed values, those of the listed type(s) when `type` is given too.
      const char* key = s.contains("const") ? "const" : "enum";
      for (const auto& [k, v] : s.items()) {
        (void)v;
        if (k != key && k != "type" && !kAnnotations.count(k)) {
          return bad(path, std::string("'") + k + "' beside '" + key + "' is not supported");
        }
      }
      json values = json::array();
      if (s.contains("const")) {
        values.push_back(s["const"]);
      } else {
        values = s["enum"];
        if (!values.is_array() || values.empty()) return bad(path + "/enum", "must be a non-empty array");
      }
      std::vector<Element> opts;
      for (const json& v : values) {
        if (s.contains("type") && !of_type(v, s["type"])) continue;
        opts.push_back(literal_value(v));
      }
      if (opts.empty()) return bad(path, std::string("no value of '") + key + "' has the listed type");
      return b_.alt(opts, "enum");
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      const json& list = s[key];
      if (!list.is_array() || list.empty()) return bad(path + "/" + key, "must be a non-empty array");
      if (s.contains("type") || s.contains("properties") || s.contains("items")) {
        return bad(path, std::string("'") + key + "' beside other constraints is not supported");
      }
      std::vector<Element> opts;
      for (size_t i = 0; i < list.size(); ++i) {
        METRO_ASSIGN_OR_RETURN(Element e, compile(list[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
        opts.push_back(e);
      }
      return b_.alt(opts, key);
    }
    if (s.contains("allOf")) {
      const json& list = s["allOf"];
      if (!list.is_array() || list.size() != 1 || s.size() > 1 + count_annotations(s)) {
        return bad(path + "/allOf", "only an allOf of exactly one schema, alone, is supported");
      }
      return compile(list[0], path + "/allOf/0", depth + 1);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const json& x : t) {
          if (!x.is_string()) return bad(path + "/type", "must be a string or an array of strings");
          types.push_back(x.get<std::string>());
        }
      } else {
        return bad(path + "/type", "must be a string or an array of strings");
      }
    } else if (s.contains("properties") || s.contains("additionalProperties") || s.contains("required")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("format") || s.contains("pattern")) {
      types.push_back("string");
    } else {
      return parts_.value();
    }
    // Keywords apply to the types they name; with a list of types, each keyword must apply
    // to one of them (a keyword of no listed type would constrain nothing: a mistake).
    std::set<std::string> allowed;
    for (const std::string& t : types) {
      auto it = kTypeKeywords.find(t);
      if (it == kTypeKeywords.end()) return bad(path + "/type", "unknown type '" + t + "'");
      allowed.insert(it->second.begin(), it->second.end());
    }
    METRO_RETURN_IF_ERROR(only(s, path, types.size() == 1 ? types[0] : std::string("any of the listed types"), allowed));
    std::vector<Element> opts;
    for (const std::string& t : types) {
      METRO_ASSIGN_OR_RETURN(Element e, typed(t, s, path, depth));
      opts.push_back(e);
    }
    return b_.alt(opts, "types");
  }

 private:
  inline static const std::map<std::string, std::set<std::string>> kTypeKeywords = {
      {"string", {"minLength", "maxLength", "format", "pattern"}},
      {"integer", {"minimum"}},
      {"number", {}},
      {"boolean", {}},
      {"null", {}},
      {"array", {"items", "minItems", "maxItems"}},
      {"object", {"properties", "required", "additionalProperties"}}};

  static bool of_type(const json& v, const json& type) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
      if (t == "number") return v.is_number();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "array") return v.is_array();
      if (t == "object") return v.is_object();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const json& t : type) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  static size_t count_annotations(const json& s) {
    size_t n = 0;
    for (const char* k : {"title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
                          "readOnly", "writeOnly", "$defs", "definitions"}) {
      n += s.contains(k) ? 1 : 0;
    }
    return n;
  }

  Status bad(const std::string& path, const std::string& what) {
    return invalid_argument("JSON schema at '" + (path.empty() ? std::string("#") : path) + "': " + what);
  }

  // Keywords of other types are refused: they would constrain nothing here, which hides a
  // mistake in the schema.
  Status only(const json& s, const std::string& path, const std::string& type, std::set<std::string> allowed) {
    static const std::set<std::string> kGeneral = {"type", "title", "description", "default", "examples", "$schema",
                                                   "$id", "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                                   "definitions"};
    for (const auto& [k, v] : s.items()) {
      (void)v;
      if (!kGeneral.count(k) && !allowed.count(k)) {
        return bad(path, "'" + k + "' does not apply to type '" + type + "'");
      }
    }
    return Status();
  }

  Expected<int> bound(const json& s, const char* key, const std::string& path, int fallback) {
    if (!s.contains(key)) return fallback;
    const json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > kMaxRepeat) {
      return bad(path + "/" + key, "must be an integer in [0, " + std::to_string(kMaxRepeat) + "]");
    }
    return static_cast<int>(v.get<int64_t>());
  }

  Expected<Element> typed(const std::string& t, const json& s, const std::string& path, int depth) {
    if (t == "string") {
      METRO_ASSIGN_OR_RETURN(int lo, bound(s, "minLength", path, 0));
      METRO_ASSIGN_OR_RETURN(int hi, bound(s, "maxLength", path, -1));
      if (hi >= 0 && hi < lo) return bad(path, "maxLength is below minLength");
      if (s.contains("pattern")) {
        if (s.contains("minLength") || s.contains("maxLength") || s.contains("format")) {
          return bad(path, "'pattern' beside a length bound or a format is not supported");
        }
        const json& p = s["pattern"];
        if (!p.is_string()) return bad(path + "/pattern", "must be a string");
        RegexOptions ro;
        ro.json_string = true;
        ro.search = true;  // JSON Schema patterns are not anchored
        ro.any_char = parts_.string_char();
        auto e = regex_element(b_, p.get<std::string>(), ro);
        if (!e.ok()) return bad(path + "/pattern", e.status().message());
        return b_.seq({b_.byte('"'), *e, b_.byte('"')}, "pattern");
      }
      if (s.contains("format")) {
        if (s.contains("minLength") || s.contains("maxLength")) {
          return bad(path, "'format' beside a length bound is not supported");
        }
        return format(s["format"], path);
      }
      return parts_.string(lo, hi);
    }
    if (t == "integer") {
      if (s.contains("minimum")) {
        const json& m = s["minimum"];
        if (!m.is_number() || (m.get<double>() != 0.0 && m.get<double>() != 1.0)) {
          return bad(path + "/minimum", "only a minimum of 0 or 1 is supported");
        }
        return parts_.integer(static_cast<int>(m.get<double>()));
      }
      return parts_.integer();
    }
    if (t == "number") {
      return parts_.number();
    }
    if (t == "boolean") {
      return parts_.boolean();
    }
    if (t == "null") {
      return parts_.null();
    }
    if (t == "array") {
      METRO_ASSIGN_OR_RETURN(int lo, bound(s, "minItems", path, 0));
      METRO_ASSIGN_OR_RETURN(int hi, bound(s, "maxItems", path, -1));
      if (hi >= 0 && hi < lo) return bad(path, "maxItems is below minItems");
      Element item = parts_.value();
      if (s.contains("items")) {
        METRO_ASSIGN_OR_RETURN(item, compile(s["items"], path + "/items", depth + 1));
      }
      return parts_.array_of(item, lo, hi);
    }
    if (t == "object") {
      return object(s, path, depth);
    }
    return bad(path + "/type", "unknown type '" + t + "'");
  }

  Expected<Element> object(const json& s, const std::string& path, int depth) {
    std::vector<std::string> names;
    std::map<std::string, const json*> props;
    if (s.contains("properties")) {
      const json& p = s["properties"];
      if (!p.is_object()) return bad(path + "/properties", "must be an object");
      for (const auto& [k, v] : p.items()) {
        names.push_back(k);
        props[k] = &v;
      }
    }
    // Optional properties chain one rule to the next, and matching descends that chain:
    // bounded, so no schema can make it deep.
    if (names.size() > kMaxProperties) {
      return bad(path + "/properties", "more than " + std::to_string(kMaxProperties) + " properties");
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      const json& r = s["required"];
      if (!r.is_array()) return bad(path + "/required", "must be an array of strings");
      for (const json& x : r) {
        if (!x.is_string()) return bad(path + "/required", "must be an array of strings");
        const std::string name = x.get<std::string>();
        required.insert(name);
        if (!props.count(name)) names.push_back(name);  // any value
      }
      if (names.size() > kMaxProperties) {
        return bad(path + "/required", "more than " + std::to_string(kMaxProperties) + " properties");
      }
    }
    const json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra != nullptr && !extra->is_boolean() && !extra->is_object()) {
      return bad(path + "/additionalProperties", "must be a boolean or a schema");
    }
    if (names.empty()) {
      if (extra != nullptr && extra->is_boolean() && !extra->get<bool>()) {
        return b_.seq({b_.byte('{'), parts_.ws(), b_.byte('}')}, "empty_object");
      }
      Element v = parts_.value();
      if (extra != nullptr && extra->is_object()) {
        METRO_ASSIGN_OR_RETURN(v, compile(*extra, path + "/additionalProperties", depth + 1));
      }
      return parts_.object_of(b_.seq({parts_.string(), parts_.ws(), b_.byte(':'), parts_.ws(), v}, "member"));
    }
    // Members in order; a = nothing written yet, b = something written (a comma first).
    const size_t n = names.size();
    std::vector<Element> kv(n);
    for (size_t i = 0; i < n; ++i) {
      Element v = parts_.value();
      if (props.count(names[i])) {
        METRO_ASSIGN_OR_RETURN(v, compile(*props[names[i]], path + "/properties/" + names[i], depth + 1));
      }
      kv[i] = b_.seq({b_.literal(json(names[i]).dump()), parts_.ws(), b_.byte(':'), parts_.ws(), v}, "kv");
    }
    std::vector<Element> a(n + 1), bb(n + 1);
    a[n] = b_.empty();
    bb[n] = a[n];
    for (size_t i = n; i-- > 0;) {
      const Element with_comma = b_.seq({parts_.ws(), b_.byte(','), parts_.ws(), kv[i], bb[i + 1]});
      const Element first = b_.seq({kv[i], bb[i + 1]});
      if (required.count(names[i])) {
        a[i] = first;
        bb[i] = with_comma;
      } else {
        a[i] = b_.alt({first, a[i + 1]});
        bb[i] = b_.alt({with_comma, bb[i + 1]});
      }
    }
    return b_.seq({b_.byte('{'), parts_.ws(), a[0], parts_.ws(), b_.byte('}')}, "object");
  }

  Expected<Element> format(const json& f, const std::string& path) {
    if (!f.is_string()) return bad(path + "/format", "must be a string");
    const std::string name = f.get<std::string>();
    auto d = [&](int n) { return parts_.digits(n, n); };
    const Element date = b_.seq({d(4), b_.byte('-'),
                                 b_.alt({b_.seq({b_.byte('0'), b_.bytes(ByteSet::range('1', '9'))}),
                                         b_.seq({b_.byte('1'), b_.bytes(ByteSet::range('0', '2'))})}),
                                 b_.byte('-'),
                                 b_.alt({b_.seq({b_.byte('0'), b_.bytes(ByteSet::range('1', '9'))}),
                                         b_.seq({b_.bytes(ByteSet::range('1', '2')), parts_.digit()}),
                                         b_.seq({b_.byte('3'), b_.bytes(ByteSet::range('0', '1'))})})},
                                "date");
    const Element hour = b_.alt({b_.seq({b_.bytes(ByteSet::range('0', '1')), parts_.digit()}),
                                 b_.seq({b_.byte('2'), b_.bytes(ByteSet::range('0', '3'))})});
    const Element minute = b_.seq({b_.bytes(ByteSet::range('0', '5')), parts_.digit()});
    ByteSet sign;
    sign.add('+');
    sign.add('-');
    const Element offset =
        b_.alt({b_.byte('Z'), b_.seq({b_.bytes(sign), hour, b_.byte(':'), minute})}, "offset");
    const Element time = b_.seq({hour, b_.byte(':'), minute, b_.byte(':'), minute,
                                 b_.opt(b_.seq({b_.byte('.'), parts_.digits(1, 9)})), offset},
                                "time");
    const Element q = b_.byte('"');
    if (name == "date") return b_.seq({q, date, q});
    if (name == "time") return b_.seq({q, time, q});
    if (name == "date-time") return b_.seq({q, date, b_.byte('T'), time, q});
    if (name == "uuid") {
      const Element h = parts_.hex();
      auto hs = [&](int n) { return b_.repeat(h, n, n); };
      return b_.seq({q, hs(8), b_.byte('-'), hs(4), b_.byte('-'), hs(4), b_.byte('-'), hs(4), b_.byte('-'), hs(12), q});
    }
    return bad(path + "/format", "the format '" + name + "' is not supported (date, time, date-time, uuid are)");
  }

  Element literal_value(const json& v) { return b_.literal(v.dump()); }

  Expected<Element> reference(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return bad(path + "/$ref", "must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return b_.ref(it->second);
    const json* target = nullptr;
    if (r == "#") {
      target = &root_;
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p(prefix);
        if (r.rfind(p, 0) != 0) continue;
        const std::string name = r.substr(p.size());
        if (!root_.is_object()) break;
        auto defs = root_.find(p.substr(2, p.size() - 3));
        if (defs == root_.end() || !defs->is_object()) continue;
        if (auto t = defs->find(name); t != defs->end()) target = &*t;
      }
    }
    if (target == nullptr) return bad(path + "/$ref", "'" + r + "' is not #, #/$defs/NAME or #/definitions/NAME of this schema");
    const uint32_t rule = b_.declare("ref");
    refs_[r] = rule;
    METRO_ASSIGN_OR_RETURN(Element e, compile(*target, r, depth + 1));
    b_.define(rule, e);
    return b_.ref(rule);
  }

  Builder& b_;
  JsonParts parts_;
  const json& root_;
  std::map<std::string, uint32_t> refs_;
};

}  // namespace

namespace {
// A grammar whose root is what `part` builds from the shared JSON pieces.
template <class Part>
Grammar json_grammar(Part part) {
  Builder b;
  JsonParts parts(b);
  const uint32_t root = b.declare("root");
  b.define(root, part(parts));
  return b.take(root);
}
}  // namespace

Grammar json_object_grammar() {
  return json_grammar([](JsonParts& p) { return p.any_object(); });
}

Grammar json_value_grammar() {
  return json_grammar([](JsonParts& p) { return p.value(); });
}

Expected<Grammar> json_schema_grammar(const nlohmann::json& schema) {
  return json_schema_grammar(nlohmann::ordered_json::parse(schema.dump()));
}

Expected<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema) {
  Builder b;
  const uint32_t root = b.declare("root");
  SchemaCompiler c(b, schema);
  METRO_ASSIGN_OR_RETURN(Element e, c.compile(schema, ""));
  b.define(root, e);
  Grammar g = b.take(root);
  if (g.elements().size() > kMaxElements) {
    return invalid_argument("JSON schema: the grammar it compiles to is too large (lengths and item counts add up)");
  }
  METRO_RETURN_IF_ERROR(g.validate());
  return g;
}

Expected<Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("choice: at least one choice is needed");
  Builder b;
  std::vector<Element> opts;
  for (const std::string& c : choices) {
    if (c.empty()) return invalid_argument("choice: a choice is empty");
    opts.push_back(b.literal(c));
  }
  const uint32_t root = b.declare("root");
  b.define(root, b.alt(opts, "choice"));
  return b.take(root);
}

}  // namespace metro::grammar
