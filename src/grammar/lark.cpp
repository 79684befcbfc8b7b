#include "grammar/lark.h"

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "grammar/charset.h"
#include "grammar/gbnf.h"
#include "grammar/regex.h"

namespace metro::grammar {

namespace {

constexpr size_t kMaxElements = size_t{1} << 20;
constexpr int kMaxDepth = 64;
constexpr size_t kMaxTextBytes = 256 * 1024;
// The matcher expands rules depth-first: a chain of rules is a chain of calls.
constexpr size_t kMaxRules = 1024;

// Library terminals are rules named with this prefix, which no name in a grammar can carry.
constexpr const char* kCommonPrefix = "common.";

struct CommonTerminal {
  const char* name;
  const char* body;  // Lark text, terminals only, names of this table
};

// Lark's `common` terminals, each written here as the language it matches. ESCAPED_STRING
// and C_COMMENT, which the library writes with lazy regular expressions and a lookbehind,
// are written as the texts those match as one token: a string holds no unescaped quote and
// no newline, a comment ends at its first "*/".
constexpr CommonTerminal kCommon[] = {
    {"DIGIT", R"("0".."9")"},
    {"HEXDIGIT", R"("a".."f" | "A".."F" | DIGIT)"},
    {"INT", R"(DIGIT+)"},
    {"SIGNED_INT", R"(["+" | "-"] INT)"},
    {"DECIMAL", R"(INT "." INT? | "." INT)"},
    {"_EXP", R"(("e" | "E") SIGNED_INT)"},
    {"FLOAT", R"(INT _EXP | DECIMAL _EXP?)"},
    {"SIGNED_FLOAT", R"(["+" | "-"] FLOAT)"},
    {"NUMBER", R"(FLOAT | INT)"},
    {"SIGNED_NUMBER", R"(["+" | "-"] NUMBER)"},
    {"ESCAPED_STRING", R"("\"" (/[^"\\\n]/ | "\\" /./)* "\"")"},
    {"LCASE_LETTER", R"("a".."z")"},
    {"UCASE_LETTER", R"("A".."Z")"},
    {"LETTER", R"(UCASE_LETTER | LCASE_LETTER)"},
    {"WORD", R"(LETTER+)"},
    {"CNAME", R"(("_" | LETTER) ("_" | LETTER | DIGIT)*)"},
    {"WS_INLINE", R"((" " | /\t/)+)"},
    {"WS", R"(/[ \t\f\r\n]/+)"},
    {"CR", R"(/\r/)"},
    {"LF", R"(/\n/)"},
    {"NEWLINE", R"((CR? LF)+)"},
    {"SH_COMMENT", R"(/#[^\n]*/)"},
    {"CPP_COMMENT", R"(/\/\/[^\n]*/)"},
    {"C_COMMENT", R"("/*" (/[^*]/ | "*"+ /[^*\/]/)* "*"+ "/")"},
    {"SQL_COMMENT", R"(/--[^\n]*/)"},
};

const char* common_body(std::string_view name) {
  for (const CommonTerminal& t : kCommon) {
    if (name == t.name) return t.body;
  }
  return nullptr;
}

bool name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool name_char(char c) { return name_start(c) || (c >= '0' && c <= '9'); }
bool digit(char c) { return c >= '0' && c <= '9'; }

bool is_terminal_name(std::string_view n) {
  if (n.substr(0, std::strlen(kCommonPrefix)) == kCommonPrefix) return true;
  const size_t i = n.find_first_not_of('_');
  return i != std::string_view::npos && n[i] >= 'A' && n[i] <= 'Z';
}

std::string kind_of(std::string_view n) { return is_terminal_name(n) ? "terminal" : "rule"; }

// A %ignore met while the parser was not expecting one: the grammar is read again with it.
constexpr const char* kSawIgnore = "%ignore";

class LarkParser final : public PatternScanner {
 public:
  LarkParser(std::string_view text, bool ignoring) : PatternScanner(text, "grammar"), ignoring_(ignoring) {}

  bool saw_ignore() const { return saw_ignore_; }

  Expected<Grammar> parse() {
    if (ignoring_) ignore_rule_ = b_.declare("%ignore");
    skip_space();
    if (at_end()) return bad("the grammar is empty");
    while (!at_end()) {
      if (peek() == '%') {
        METRO_RETURN_IF_ERROR(directive());
      } else {
        METRO_RETURN_IF_ERROR(definition());
      }
      if (too_many_rules_) return invalid_argument("grammar: more than " + std::to_string(kMaxRules) + " rules");
      skip_space();
    }
    // Library terminals the grammar imported, and those they use in turn.
    while (!pending_common_.empty()) {
      const std::string name = pending_common_.back();
      pending_common_.pop_back();
      METRO_RETURN_IF_ERROR(define_common(name));
    }
    for (const auto& [name, rule] : rules_) {
      (void)rule;
      if (!defined_.count(name)) {
        return invalid_argument("grammar: the " + kind_of(name) + " '" + name + "' is used but not defined");
      }
    }
    auto start = rules_.find("start");
    if (start == rules_.end()) return invalid_argument("grammar: no rule named 'start'");
    uint32_t root = start->second;
    if (ignoring_) {
      if (!ignore_defined_) return invalid_argument("grammar: %ignore names nothing");
      // What is ignored may also end the text.
      root = b_.declare("%start");
      b_.define(root, b_.seq({b_.ref(start->second), ignored()}, "seq"));
    }
    Grammar g = b_.take(root);
    METRO_RETURN_IF_ERROR(g.validate());
    return g;
  }

 private:
  // Blanks within a line.
  void skip_blank() {
    while (!at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;
  }

  // Blanks, newlines and comments.
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#' || (c == '/' && pos_ + 1 < end_ && p_[pos_ + 1] == '/')) {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    if (at_end() || !name_start(peek())) return {};
    while (!at_end() && name_char(peek())) ++pos_;
    return std::string(p_.substr(start, pos_ - start));
  }

  // Reads "." PRIORITY after a definition's name, if there.
  Status skip_priority(const std::string& name) {
    if (at_end() || peek() != '.') return Status();
    ++pos_;
    if (!at_end() && peek() == '-') ++pos_;
    if (at_end() || !digit(peek())) return bad("a priority number was expected after '" + name + ".'");
    while (!at_end() && digit(peek())) ++pos_;
    return Status();
  }

  // Whether a definition (`NAME:`, `?name:`, `NAME.2:`) starts at pos_.
  bool at_definition() {
    const size_t save = pos_;
    if (!at_end() && (peek() == '?' || peek() == '!')) ++pos_;
    bool def = !read_name().empty() && skip_priority("").ok();
    skip_blank();
    def = def && !at_end() && peek() == ':';
    pos_ = save;
    return def;
  }

  uint32_t rule_of(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    if (rules_.size() == kMaxRules) too_many_rules_ = true;
    const uint32_t r = b_.declare(name);
    rules_.emplace(name, r);
    if (name.rfind(kCommonPrefix, 0) == 0) pending_common_.push_back(name.substr(std::strlen(kCommonPrefix)));
    return r;
  }

  Status check_size() {
    if (b_.grammar().elements().size() > kMaxElements) return invalid_argument("grammar: larger than 1M elements");
    return Status();
  }

  // What %ignore names, any number of times.
  Element ignored() { return b_.star(b_.ref(ignore_rule_)); }

  // A terminal as a rule uses it: ignored text may stand before it.
  Element as_token(Element e) {
    if (!ignoring_ || in_terminal_) return e;
    return b_.seq({ignored(), e}, "token");
  }

  Status definition() {
    if (peek() == '?' || peek() == '!') ++pos_;
    const std::string name = read_name();
    if (name.empty()) return bad("a rule or terminal name was expected");
    if (!at_end() && peek() == '{') return bad("rule templates ('" + name + "{...}') are not supported");
    METRO_RETURN_IF_ERROR(skip_priority(name));
    skip_blank();
    if (at_end() || peek() != ':') return bad("':' was expected after the name '" + name + "'");
    ++pos_;
    if (!defined_.insert(name).second) return bad("'" + name + "' is defined twice");
    in_terminal_ = is_terminal_name(name);
    current_ = name;
    const uint32_t rule = rule_of(name);
    METRO_ASSIGN_OR_RETURN(std::vector<std::vector<Element>> options, alternative_parts(0));
    // Direct left recursion, as Lark grammars write lists and operators (`sum: sum "+" term
    // | term`), becomes repetition: A := A x | y  is  A := y T, T := x T | (nothing).
    std::vector<std::vector<Element>> base, tails;
    for (std::vector<Element>& o : options) {
      if (!o.empty() && o[0].kind == Element::Kind::kRule && o[0].index == rule) {
        tails.emplace_back(o.begin() + 1, o.end());
      } else {
        base.push_back(std::move(o));
      }
    }
    if (tails.empty()) {
      for (const std::vector<Element>& o : base) b_.grammar().add_alternative(rule, o);
      return Status();
    }
    if (base.empty()) return bad("every alternative of '" + name + "' begins with '" + name + "' itself");
    const uint32_t tail = b_.declare(name + "-tail");
    for (std::vector<Element>& o : tails) {
      o.push_back(b_.ref(tail));
      b_.grammar().add_alternative(tail, o);
    }
    b_.grammar().add_alternative(tail, {});
    for (std::vector<Element>& o : base) {
      o.push_back(b_.ref(tail));
      b_.grammar().add_alternative(rule, o);
    }
    return Status();
  }

  Status directive() {
    ++pos_;  // '%'
    const std::string word = read_name();
    if (word == "ignore") {
      if (!ignoring_) {
        saw_ignore_ = true;
        return invalid_argument(kSawIgnore);
      }
      in_terminal_ = true;
      current_ = "%ignore";
      METRO_ASSIGN_OR_RETURN(Element e, alternatives(0));
      b_.define(ignore_rule_, e);
      ignore_defined_ = true;
      return Status();
    }
    if (word == "import") return import();
    if (word.empty()) return bad("a directive name was expected after '%'");
    return bad("%" + word + " is not supported (only %import of the common library and %ignore)");
  }

  Status import() {
    skip_blank();
    if (!at_end() && peek() == '.') return bad("relative imports are not supported, only the common library");
    const std::string module = read_name();
    if (module != "common") {
      return bad("only the common library can be imported" + (module.empty() ? std::string() : ", not '" + module + "'"));
    }
    if (!at_end() && peek() == '.') {
      ++pos_;
      const std::string name = read_name();
      if (name.empty()) return bad("a terminal name was expected after 'common.'");
      std::string alias = name;
      skip_blank();
      if (p_.substr(pos_, 2) == "->") {
        pos_ += 2;
        skip_blank();
        alias = read_name();
        if (alias.empty()) return bad("a name was expected after '->'");
      }
      return import_one(name, alias);
    }
    skip_blank();
    if (at_end() || peek() != '(') return bad("'%import common' takes '.NAME' or '(NAME, ...)'");
    ++pos_;
    while (true) {
      skip_space();
      const std::string name = read_name();
      if (name.empty()) return bad("a name was expected in the import list");
      METRO_RETURN_IF_ERROR(import_one(name, name));
      skip_space();
      if (!at_end() && peek() == ',') {
        ++pos_;
        continue;
      }
      if (!at_end() && peek() == ')') {
        ++pos_;
        return Status();
      }
      return bad("',' or ')' was expected in the import list");
    }
  }

  Status import_one(const std::string& name, const std::string& alias) {
    if (common_body(name) == nullptr) return bad("the common library has no terminal '" + name + "'");
    if (!is_terminal_name(alias)) return bad("'" + alias + "' names a terminal: write it in capitals");
    if (!defined_.insert(alias).second) return bad("'" + alias + "' is defined twice");
    b_.define(rule_of(alias), b_.ref(rule_of(kCommonPrefix + name)));
    return Status();
  }

  // Parses a library terminal's body in place of the grammar text.
  Status define_common(const std::string& name) {
    const char* body = common_body(name);
    const std::string full = kCommonPrefix + name;
    if (body == nullptr) return invalid_argument("grammar: the common library has no terminal '" + name + "'");
    const std::string_view saved_text = p_;
    const size_t saved_pos = pos_, saved_end = end_;
    p_ = body;
    pos_ = 0;
    end_ = p_.size();
    in_common_ = true;
    in_terminal_ = true;
    current_ = full;
    Expected<Element> e = alternatives(0);
    in_common_ = false;
    p_ = saved_text;
    pos_ = saved_pos;
    end_ = saved_end;
    if (!e.ok()) return e.status();
    defined_.insert(full);
    b_.define(rule_of(full), *e);
    return Status();
  }

  // The alternatives at pos_, each as the parts of its sequence.
  Expected<std::vector<std::vector<Element>>> alternative_parts(int depth) {
    if (depth > kMaxDepth) return bad("groups nested too deeply");
    std::vector<std::vector<Element>> options;
    while (true) {
      METRO_ASSIGN_OR_RETURN(std::vector<Element> s, sequence_parts(depth));
      options.push_back(std::move(s));
      skip_space();
      if (!at_end() && peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return options;
  }

  Expected<Element> alternatives(int depth) {
    METRO_ASSIGN_OR_RETURN(std::vector<std::vector<Element>> options, alternative_parts(depth));
    std::vector<Element> elements;
    for (const std::vector<Element>& o : options) elements.push_back(o.empty() ? b_.empty() : b_.seq(o, "seq"));
    return b_.alt(elements, "alt");
  }

  Expected<std::vector<Element>> sequence_parts(int depth) {
    std::vector<Element> parts;
    while (true) {
      skip_space();
      if (at_end()) break;
      const char c = peek();
      if (c == '|' || c == ')' || c == ']' || c == '%' || at_definition()) break;
      if (p_.substr(pos_, 2) == "->") {
        // An alias names the alternative's tree node: read and dropped.
        pos_ += 2;
        skip_blank();
        if (read_name().empty()) return bad("a name was expected after '->'");
        break;
      }
      METRO_ASSIGN_OR_RETURN(Element item, atom(depth));
      METRO_ASSIGN_OR_RETURN(Element q, quantified(item));
      parts.push_back(q);
      METRO_RETURN_IF_ERROR(check_size());
    }
    return parts;
  }

  Expected<int> number() {
    if (at_end() || !digit(peek())) return bad("a number was expected after '~'");
    int v = 0;
    while (!at_end() && digit(peek())) {
      v = v * 10 + (peek() - '0');
      ++pos_;
      if (v > kMaxRepeat) return bad("a repetition is bounded by " + std::to_string(kMaxRepeat));
    }
    return v;
  }

  Expected<Element> quantified(Element item) {
    skip_blank();
    if (at_end()) return item;
    const char c = peek();
    if (c == '*' || c == '+') {
      ++pos_;
      return c == '*' ? b_.star(item) : b_.plus(item);
    }
    // A '?' before a lower-case letter begins the next rule's definition (`?rule:`).
    if (c == '?' && !(pos_ + 1 < end_ && p_[pos_ + 1] >= 'a' && p_[pos_ + 1] <= 'z')) {
      ++pos_;
      return b_.opt(item);
    }
    if (c != '~') return item;
    ++pos_;
    skip_blank();
    METRO_ASSIGN_OR_RETURN(int lo, number());
    int hi = lo;
    skip_blank();
    if (p_.substr(pos_, 2) == "..") {
      pos_ += 2;
      skip_blank();
      METRO_ASSIGN_OR_RETURN(int h, number());
      hi = h;
      if (hi < lo) return bad("a repetition's bounds are in the wrong order");
    }
    return b_.repeat(item, lo, hi);
  }

  Expected<Element> atom(int depth) {
    const char c = peek();
    if (c == '"') return literal();
    if (c == '/') return regex();
    if (c == '(' || c == '[') {
      ++pos_;
      METRO_ASSIGN_OR_RETURN(Element inner, alternatives(depth + 1));
      skip_space();
      const char close = c == '(' ? ')' : ']';
      if (at_end() || peek() != close) return bad(std::string("'") + c + "' does not close");
      ++pos_;
      return c == '(' ? inner : b_.opt(inner);
    }
    if (name_start(c)) {
      const std::string name = read_name();
      if (!at_end() && peek() == '{') return bad("rule templates ('" + name + "{...}') are not supported");
      if (in_common_) return b_.ref(rule_of(kCommonPrefix + name));
      if (in_terminal_ && !is_terminal_name(name)) {
        return bad("the terminal '" + current_ + "' uses the rule '" + name + "'; terminals use only terminals");
      }
      const Element ref = b_.ref(rule_of(name));
      return is_terminal_name(name) ? as_token(ref) : ref;
    }
    return bad(std::string("unexpected '") + c + "'");
  }

  // The text of the string literal at pos_ ('"').
  Expected<std::string> string_text() {
    ++pos_;
    std::string bytes;
    while (true) {
      if (at_end() || peek() == '\n') return bad("a literal does not close");
      const char c = peek();
      if (c == '"') {
        ++pos_;
        return bytes;
      }
      if (c == '\\') {
        METRO_ASSIGN_OR_RETURN(CharSet e, escape_set());
        bytes += static_cast<char>(single_char(e));
      } else {
        bytes += c;
        ++pos_;
      }
    }
  }

  Expected<Element> literal() {
    METRO_ASSIGN_OR_RETURN(std::string text, string_text());
    const bool fold = !at_end() && peek() == 'i' && !(pos_ + 1 < end_ && name_char(p_[pos_ + 1]));
    if (fold) ++pos_;
    const size_t after = pos_;
    skip_blank();
    if (!fold && p_.substr(pos_, 2) == "..") {
      pos_ += 2;
      skip_blank();
      if (at_end() || peek() != '"') return bad("a range is written \"a\"..\"z\"");
      METRO_ASSIGN_OR_RETURN(std::string hi, string_text());
      if (text.size() != 1 || hi.size() != 1 || static_cast<uint8_t>(text[0]) >= 0x80 ||
          static_cast<uint8_t>(hi[0]) >= 0x80) {
        return bad("a range's ends must be single ASCII characters");
      }
      if (text[0] > hi[0]) return bad("a range's ends are in the wrong order");
      return as_token(b_.bytes(ByteSet::range(static_cast<uint8_t>(text[0]), static_cast<uint8_t>(hi[0]))));
    }
    pos_ = after;
    if (text.empty()) return b_.empty();
    if (!fold) return as_token(b_.literal(text));
    std::vector<Element> parts;
    for (char ch : text) {
      ByteSet s = ByteSet::of(static_cast<uint8_t>(ch));
      if (ch >= 'a' && ch <= 'z') s.add(static_cast<uint8_t>(ch - 'a' + 'A'));
      if (ch >= 'A' && ch <= 'Z') s.add(static_cast<uint8_t>(ch - 'A' + 'a'));
      parts.push_back(b_.bytes(s));
    }
    return as_token(parts.size() == 1 ? parts[0] : b_.seq(parts, "seq"));
  }

  Expected<Element> regex() {
    ++pos_;  // '/'
    const size_t start = pos_;
    while (true) {
      if (at_end() || peek() == '\n') return bad("a regular expression does not close");
      if (peek() == '/') break;
      pos_ += peek() == '\\' && pos_ + 1 < end_ ? 2 : 1;
    }
    const std::string_view pattern = p_.substr(start, pos_ - start);
    ++pos_;
    const size_t flags = pos_;
    while (!at_end() && name_char(peek())) ++pos_;
    if (pos_ != flags) {
      return bad("regular expression flags ('" + std::string(p_.substr(flags, pos_ - flags)) + "') are not supported");
    }
    Expected<Element> e = regex_element(b_, pattern, RegexOptions{});
    if (!e.ok()) return invalid_argument("grammar: in /" + std::string(pattern) + "/: " + e.status().message());
    return as_token(*e);
  }

  Expected<CharSet> escape_set() override { return literal_escape(); }

  Builder b_;
  std::map<std::string, uint32_t> rules_;
  std::set<std::string> defined_;
  std::vector<std::string> pending_common_;
  std::string current_;
  bool ignoring_ = false;
  bool saw_ignore_ = false;
  bool ignore_defined_ = false;
  uint32_t ignore_rule_ = 0;
  bool in_terminal_ = false;
  bool in_common_ = false;
  bool too_many_rules_ = false;
};

}  // namespace

Expected<Grammar> lark_grammar(std::string_view text) {
  if (text.size() > kMaxTextBytes) return invalid_argument("grammar: longer than 256 KiB");
  LarkParser first(text, /*ignoring=*/false);
  Expected<Grammar> g = first.parse();
  if (g.ok() || !first.saw_ignore()) return g;
  LarkParser second(text, /*ignoring=*/true);
  return second.parse();
}

bool looks_like_lark(std::string_view text) {
  size_t i = 0;
  const size_t n = text.size();
  while (i < n) {
    const char c = text[i];
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      ++i;
    } else if (c == '#' || (c == '/' && i + 1 < n && text[i + 1] == '/')) {
      while (i < n && text[i] != '\n') ++i;
    } else {
      break;
    }
  }
  if (i == n) return false;
  if (text[i] == '%' || text[i] == '?' || text[i] == '!') return true;
  while (i < n && (name_char(text[i]) || text[i] == '-')) ++i;
  if (i < n && text[i] == '.') {  // a priority
    ++i;
    if (i < n && text[i] == '-') ++i;
    while (i < n && digit(text[i])) ++i;
  }
  while (i < n && (text[i] == ' ' || text[i] == '\t')) ++i;
  return i < n && text[i] == ':' && text.substr(i, 3) != "::=";
}

Expected<Grammar> text_grammar(std::string_view text) {
  return looks_like_lark(text) ? lark_grammar(text) : gbnf_grammar(text);
}

}  // namespace metro::grammar
