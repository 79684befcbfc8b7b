#include "grammar/regex.h"

#include "grammar/charset.h"

#include <string>
#include <vector>

namespace metro::grammar {

namespace {

constexpr size_t kMaxElements = size_t{1} << 20;
constexpr int kMaxDepth = 64;

CharSet class_of(char e) {
  CharSet s;
  switch (e) {
    case 'd':
    case 'D':
      s.ascii = ByteSet::range('0', '9');
      break;
    case 'w':
    case 'W':
      s.ascii = ByteSet::range('0', '9');
      s.ascii.add_range('a', 'z');
      s.ascii.add_range('A', 'Z');
      s.ascii.add('_');
      break;
    default:  // s, S
      for (char c : std::string(" \t\n\r\f\v")) s.ascii.add(static_cast<uint8_t>(c));
      break;
  }
  if (e == 'D' || e == 'W' || e == 'S') s.invert();
  return s;
}

class RegexCompiler final : public PatternScanner {
 public:
  RegexCompiler(Builder& b, std::string_view p, const RegexOptions& o)
      : PatternScanner(p, "regular expression"), b_(b), o_(o) {}

  Expected<Element> compile() {
    bool anchored_start = false, anchored_end = false;
    if (!p_.empty() && p_.front() == '^') {
      anchored_start = true;
      pos_ = 1;
    }
    size_t end = p_.size();
    if (end > pos_ && p_[end - 1] == '$' && !escaped_at(end - 1)) {
      anchored_end = true;
      end -= 1;
    }
    end_ = end;
    METRO_ASSIGN_OR_RETURN(Element body, alternation(0));
    if (pos_ != end_) return bad("unbalanced ')'");
    if (!o_.search) return body;
    std::vector<Element> parts;
    if (!anchored_start) parts.push_back(b_.star(*o_.any_char));
    parts.push_back(body);
    if (!anchored_end) parts.push_back(b_.star(*o_.any_char));
    return b_.seq(parts, "pattern");
  }

 private:
  // Whether p_[i] is escaped by an odd run of backslashes before it.
  bool escaped_at(size_t i) const {
    size_t n = 0;
    while (i > n && p_[i - n - 1] == '\\') ++n;
    return n % 2 == 1;
  }
  Status check_size() const {
    if (b_.grammar().elements().size() > kMaxElements) return invalid_argument("the regular expression is too large");
    return Status();
  }

  Expected<Element> alternation(int depth) {
    if (depth > kMaxDepth) return bad("groups nested too deeply");
    std::vector<Element> options;
    while (true) {
      METRO_ASSIGN_OR_RETURN(Element s, sequence(depth));
      options.push_back(s);
      if (!at_end() && peek() == '|') {
        ++pos_;
        continue;
      }
      break;
    }
    return options.size() == 1 ? options[0] : b_.alt(options, "re.alt");
  }

  Expected<Element> sequence(int depth) {
    std::vector<Element> parts;
    while (!at_end() && peek() != '|' && peek() != ')') {
      METRO_ASSIGN_OR_RETURN(Element a, atom(depth));
      METRO_ASSIGN_OR_RETURN(Element q, quantified(a));
      parts.push_back(q);
      METRO_RETURN_IF_ERROR(check_size());
    }
    if (parts.empty()) return b_.empty();
    return b_.seq(parts, "re.seq");
  }

  Expected<Element> quantified(Element a) {
    METRO_ASSIGN_OR_RETURN(std::optional<Repeat> r, quantifier(/*spaces=*/false));
    if (!r) return a;
    if (!at_end() && peek() == '?') ++pos_;  // lazy: the same texts
    if (!at_end() && (peek() == '+' || peek() == '*' || peek() == '?' || peek() == '{')) {
      if (peek() == '+') return bad("possessive quantifiers are not supported");
      if (peek() != '{') return bad("a quantifier follows a quantifier");
    }
    return b_.repeat(a, r->min, r->max);
  }

  Expected<Element> atom(int depth) {
    const char c = peek();
    switch (c) {
      case '(': {
        ++pos_;
        if (!at_end() && peek() == '?') {
          ++pos_;
          if (!at_end() && peek() == ':') {
            ++pos_;
          } else if (!at_end() && (peek() == '<' || peek() == 'P')) {
            if (peek() == 'P') ++pos_;
            if (at_end() || peek() != '<') return bad("(?P must name a group: (?P<name>...)");
            if (pos_ + 1 < end_ && (p_[pos_ + 1] == '=' || p_[pos_ + 1] == '!')) {
              return bad("lookbehind is not supported");
            }
            const size_t close = p_.find('>', pos_);
            if (close == std::string_view::npos || close >= end_) return bad("a group name does not close");
            pos_ = close + 1;
          } else if (!at_end() && (peek() == '=' || peek() == '!')) {
            return bad("lookahead is not supported");
          } else {
            return bad("inline flags and other (? groups are not supported");
          }
        }
        METRO_ASSIGN_OR_RETURN(Element inner, alternation(depth + 1));
        if (at_end() || peek() != ')') return bad("'(' does not close");
        ++pos_;
        return inner;
      }
      case ')':
        return bad("unbalanced ')'");
      case '*':
      case '+':
      case '?':
        return bad("a quantifier with nothing to repeat");
      case '^':
        return bad("'^' is supported only at the start");
      case '$':
        return bad("'$' is supported only at the end");
      case '.': {
        ++pos_;
        CharSet s;
        s.add_all_ascii();
        s.ascii.bits[0] &= ~(uint64_t{1} << '\n');
        s.multibyte = true;
        return chars(s);
      }
      case '[':
        return char_class_element();
      case '\\':
        return escape();
      default:
        return literal_char();
    }
  }

  // A literal character at pos_ (any UTF-8 sequence).
  Expected<Element> literal_char() {
    const auto b0 = static_cast<uint8_t>(peek());
    if (b0 < 0x80) {
      ++pos_;
      CharSet s;
      s.ascii.add(b0);
      return chars(s);
    }
    const size_t n = b0 >= 0xf0 ? 4 : b0 >= 0xe0 ? 3 : b0 >= 0xc0 ? 2 : 0;
    if (n == 0 || pos_ + n > end_) return bad("the pattern is not valid UTF-8");
    const std::string_view ch = p_.substr(pos_, n);
    pos_ += n;
    return b_.literal(ch);
  }

  // \x: a class (\d ...), an escaped character, or what is refused.
  Expected<CharSet> escape_set() override {
    ++pos_;  // the backslash
    if (at_end()) return bad("a pattern may not end with a backslash");
    const char e = peek();
    ++pos_;
    CharSet s;
    switch (e) {
      case 'd':
      case 'D':
      case 'w':
      case 'W':
      case 's':
      case 'S':
        return class_of(e);
      case 't':
      case 'n':
      case 'r':
      case 'f':
      case 'v':
        s.ascii.add(static_cast<uint8_t>(e == 't' ? '\t' : e == 'n' ? '\n' : e == 'r' ? '\r' : e == 'f' ? '\f' : '\v'));
        return s;
      case 'x':
      case 'u': {
        METRO_ASSIGN_OR_RETURN(int v, hex_escape(e == 'x' ? 2 : 4));
        s.ascii.add(static_cast<uint8_t>(v));
        return s;
      }
      case 'b':
      case 'B':
        return bad("word boundaries (\\b, \\B) are not supported");
      default:
        if ((e >= '0' && e <= '9')) return bad("backreferences are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) {
          return bad(std::string("the escape \\") + e + " is not supported");
        }
        if (static_cast<uint8_t>(e) >= 0x80) return bad("escaped non-ASCII characters are not supported");
        s.ascii.add(static_cast<uint8_t>(e));
        return s;
    }
  }

  Expected<Element> escape() {
    METRO_ASSIGN_OR_RETURN(CharSet s, escape_set());
    return chars(s);
  }

  Expected<Element> char_class_element() {
    METRO_ASSIGN_OR_RETURN(CharSet set, char_class());
    return chars(set);
  }

  // One character of the set, as the output writes it.
  Element chars(const CharSet& s) { return charset_element(b_, s, o_.json_string); }

  Builder& b_;
  const RegexOptions& o_;
};

}  // namespace

Expected<Element> regex_element(Builder& b, std::string_view pattern, const RegexOptions& opts) {
  if (opts.search && !opts.any_char) return invalid_argument("regex_element: search needs any_char");
  if (pattern.size() > 16 * 1024) return invalid_argument("the regular expression is longer than 16 KiB");
  RegexCompiler c(b, pattern, opts);
  return c.compile();
}

Expected<Grammar> regex_grammar(std::string_view pattern) {
  Builder b;
  METRO_ASSIGN_OR_RETURN(Element e, regex_element(b, pattern, RegexOptions{}));
  const Element root = b.seq({e, b.empty()}, "root");
  Grammar g = b.take(root.index);
  // The only way a pattern's grammar recurses without consuming a byte.
  if (!g.validate().ok()) {
    return invalid_argument("a repeated part of the regular expression can match nothing (as in (a*)*): not supported");
  }
  return g;
}

}  // namespace metro::grammar
