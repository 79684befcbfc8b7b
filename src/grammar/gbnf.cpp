#include "grammar/gbnf.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "grammar/charset.h"

namespace metro::grammar {

namespace {

constexpr size_t kMaxElements = size_t{1} << 20;
constexpr int kMaxDepth = 64;
constexpr size_t kMaxTextBytes = 256 * 1024;
// The matcher expands rules depth-first: a chain of rules is a chain of calls.
constexpr size_t kMaxRules = 1024;

bool name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class GbnfParser final : public PatternScanner {
 public:
  explicit GbnfParser(std::string_view text) : PatternScanner(text, "grammar") {}

  Expected<Grammar> parse() {
    skip_space();
    if (at_end()) return bad("the grammar is empty");
    while (!at_end()) {
      const std::string name = read_name();
      if (name.empty()) return bad("a rule name was expected");
      skip_space();
      if (p_.substr(pos_, 3) != "::=") return bad("'::=' was expected after the rule name '" + name + "'");
      pos_ += 3;
      if (!defined_.insert(name).second) return bad("the rule '" + name + "' is defined twice");
      const uint32_t rule = rule_of(name);
      METRO_ASSIGN_OR_RETURN(Element body, alternatives(0));
      if (too_many_rules_) return invalid_argument("grammar: more than " + std::to_string(kMaxRules) + " rules");
      b_.define(rule, body);
      skip_space();
    }
    for (const auto& [name, rule] : rules_) {
      (void)rule;
      if (!defined_.count(name)) return invalid_argument("grammar: the rule '" + name + "' is used but not defined");
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) return invalid_argument("grammar: no rule named 'root'");
    Grammar g = b_.take(root->second);
    METRO_RETURN_IF_ERROR(g.validate());
    return g;
  }

 private:
  void skip_space() {
    while (!at_end()) {
      const char c = peek();
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!at_end() && peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string read_name() {
    const size_t start = pos_;
    while (!at_end() && name_char(peek())) ++pos_;
    return std::string(p_.substr(start, pos_ - start));
  }

  // Whether a rule definition (`NAME ::=`) starts at pos_.
  bool at_definition() {
    const size_t save = pos_;
    const bool named = !read_name().empty();
    skip_space();
    const bool def = named && p_.substr(pos_, 3) == "::=";
    pos_ = save;
    return def;
  }

  uint32_t rule_of(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    if (rules_.size() == kMaxRules) too_many_rules_ = true;
    const uint32_t r = b_.declare(name);
    rules_.emplace(name, r);
    return r;
  }

  Status check_size() {
    if (b_.grammar().elements().size() > kMaxElements) return invalid_argument("grammar: larger than 1M elements");
    return Status();
  }

  Expected<Element> alternatives(int depth) {
    if (depth > kMaxDepth) return bad("groups nested too deeply");
    std::vector<Element> options;
    while (true) {
      METRO_ASSIGN_OR_RETURN(Element s, sequence(depth));
      options.push_back(s);
      skip_space();
      if (!at_end() && peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return options.size() == 1 ? options[0] : b_.alt(options, "alt");
  }

  Expected<Element> sequence(int depth) {
    std::vector<Element> parts;
    while (true) {
      skip_space();
      if (at_end() || peek() == '|' || peek() == ')' || at_definition()) break;
      METRO_ASSIGN_OR_RETURN(Element item, atom(depth));
      METRO_ASSIGN_OR_RETURN(Element q, quantified(item));
      parts.push_back(q);
      METRO_RETURN_IF_ERROR(check_size());
    }
    if (parts.empty()) return b_.empty();
    return b_.seq(parts, "seq");
  }

  Expected<Element> quantified(Element item) {
    METRO_ASSIGN_OR_RETURN(std::optional<Repeat> r, quantifier(/*spaces=*/true));
    return r ? b_.repeat(item, r->min, r->max) : item;
  }

  Expected<Element> atom(int depth) {
    const char c = peek();
    if (c == '"') return literal();
    if (c == '[') {
      METRO_ASSIGN_OR_RETURN(CharSet set, char_class());
      return charset_element(b_, set, /*json_string=*/false);
    }
    if (c == '.') {
      ++pos_;
      CharSet any;
      any.add_all_ascii();
      any.multibyte = true;
      return charset_element(b_, any, false);
    }
    if (c == '(') {
      ++pos_;
      METRO_ASSIGN_OR_RETURN(Element inner, alternatives(depth + 1));
      skip_space();
      if (at_end() || peek() != ')') return bad("'(' does not close");
      ++pos_;
      return inner;
    }
    if (name_char(c)) return b_.ref(rule_of(read_name()));
    return bad(std::string("unexpected '") + c + "'");
  }

  Expected<Element> literal() {
    ++pos_;  // '"'
    std::string bytes;
    while (true) {
      if (at_end() || peek() == '\n') return bad("a literal does not close");
      const char c = peek();
      if (c == '"') {
        ++pos_;
        break;
      }
      if (c == '\\') {
        METRO_ASSIGN_OR_RETURN(CharSet e, escape_set());
        bytes += static_cast<char>(single_char(e));
      } else {
        bytes += c;
        ++pos_;
      }
    }
    return bytes.empty() ? b_.empty() : b_.literal(bytes);
  }

  Expected<CharSet> escape_set() override { return literal_escape(); }

  Builder b_;
  std::map<std::string, uint32_t> rules_;
  std::set<std::string> defined_;
  bool too_many_rules_ = false;
};

}  // namespace

Expected<Grammar> gbnf_grammar(std::string_view text) {
  if (text.size() > kMaxTextBytes) return invalid_argument("grammar: longer than 256 KiB");
  GbnfParser p(text);
  return p.parse();
}

}  // namespace metro::grammar
