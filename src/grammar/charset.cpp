#include "grammar/charset.h"

#include <utility>
#include <vector>

namespace metro::grammar {

void CharSet::invert() {
  ByteSet inv;
  for (int c = 0; c < 0x80; ++c) {
    if (!ascii.has(static_cast<uint8_t>(c))) inv.add(static_cast<uint8_t>(c));
  }
  ascii = inv;
  multibyte = !multibyte;
}

void CharSet::merge(const CharSet& o) {
  for (size_t i = 0; i < 4; ++i) ascii.bits[i] |= o.ascii.bits[i];
  multibyte = multibyte || o.multibyte;
}

int single_char(const CharSet& s) {
  if (s.multibyte) return -1;
  int only = -1;
  for (int x = 0; x < 0x80; ++x) {
    if (!s.ascii.has(static_cast<uint8_t>(x))) continue;
    if (only >= 0) return -1;
    only = x;
  }
  return only;
}

Element charset_element(Builder& b, const CharSet& s, bool json_string) {
  std::vector<Element> options;
  ByteSet raw = s.ascii;
  if (json_string) {
    static constexpr std::pair<char, const char*> kEscaped[] = {
        {'"', "\\\""}, {'\\', "\\\\"}, {'\n', "\\n"}, {'\t', "\\t"}, {'\r', "\\r"}, {'\f', "\\f"}, {'\b', "\\b"}};
    for (const auto& [c, text] : kEscaped) {
      if (raw.has(static_cast<uint8_t>(c))) options.push_back(b.literal(text));
    }
    raw.bits[0] &= ~((uint64_t{1} << 32) - 1);  // 0x00..0x1f
    raw.bits[0] &= ~(uint64_t{1} << '"');
    raw.bits['\\' >> 6] &= ~(uint64_t{1} << ('\\' & 63));
    raw.bits[1] &= ~(uint64_t{1} << (0x7f - 64));
  }
  if (!raw.empty()) options.insert(options.begin(), b.bytes(raw));
  if (s.multibyte) options.push_back(utf8_multibyte(b));
  // Nothing the output can write: an element no text matches.
  if (options.empty()) return b.bytes(ByteSet{});
  return options.size() == 1 ? options[0] : b.alt(options, "char");
}

Element utf8_multibyte(Builder& b) {
  const Element cont = b.bytes(ByteSet::range(0x80, 0xbf));
  return b.alt({b.seq({b.bytes(ByteSet::range(0xc2, 0xdf)), cont}),
                b.seq({b.byte(0xe0), b.bytes(ByteSet::range(0xa0, 0xbf)), cont}),
                b.seq({b.bytes(ByteSet::range(0xe1, 0xec)), cont, cont}),
                b.seq({b.byte(0xed), b.bytes(ByteSet::range(0x80, 0x9f)), cont}),
                b.seq({b.bytes(ByteSet::range(0xee, 0xef)), cont, cont}),
                b.seq({b.byte(0xf0), b.bytes(ByteSet::range(0x90, 0xbf)), cont, cont}),
                b.seq({b.bytes(ByteSet::range(0xf1, 0xf3)), cont, cont, cont}),
                b.seq({b.byte(0xf4), b.bytes(ByteSet::range(0x80, 0x8f)), cont, cont})},
               "utf8");
}

Status PatternScanner::bad(const std::string& message) const {
  return invalid_argument(what_ + " at offset " + std::to_string(pos_) + ": " + message);
}

Expected<int> PatternScanner::hex_escape(size_t digits) {
  if (pos_ + digits > end_) return bad("\\x and \\u take 2 and 4 hex digits");
  unsigned v = 0;
  for (size_t i = 0; i < digits; ++i) {
    const char h = p_[pos_ + i];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return bad("\\x and \\u take 2 and 4 hex digits");
    v = v * 16 + static_cast<unsigned>(d);
  }
  pos_ += digits;
  if (v >= 0x80) return bad("\\x and \\u escapes beyond ASCII are not supported: write the character");
  return static_cast<int>(v);
}

Expected<std::optional<PatternScanner::Repeat>> PatternScanner::quantifier(bool spaces) {
  if (at_end()) return std::optional<Repeat>();
  const char c = peek();
  if (c == '*' || c == '+' || c == '?') {
    ++pos_;
    return std::optional<Repeat>(Repeat{c == '+' ? 1 : 0, c == '?' ? 1 : -1});
  }
  if (c != '{') return std::optional<Repeat>();
  auto blanks = [&] {
    while (spaces && !at_end() && (peek() == ' ' || peek() == '\t')) ++pos_;
  };
  auto digit = [&] { return !at_end() && peek() >= '0' && peek() <= '9'; };
  auto number = [&]() -> Expected<int> {
    int64_t v = 0;
    while (digit()) {
      v = v * 10 + (peek() - '0');
      if (v > kMaxRepeat) return bad("a repetition bound over " + std::to_string(kMaxRepeat));
      ++pos_;
    }
    return static_cast<int>(v);
  };
  const size_t at = pos_;
  ++pos_;
  blanks();
  if (!digit()) {
    pos_ = at;
    return std::optional<Repeat>();
  }
  Repeat r;
  METRO_ASSIGN_OR_RETURN(r.min, number());
  blanks();
  r.max = r.min;
  if (!at_end() && peek() == ',') {
    ++pos_;
    blanks();
    if (!at_end() && peek() == '}') {
      r.max = -1;
    } else {
      if (!digit()) return bad("a number was expected");
      METRO_ASSIGN_OR_RETURN(r.max, number());
      blanks();
    }
  }
  if (at_end() || peek() != '}') return bad("'{' opens a bound that does not close");
  ++pos_;
  if (r.max >= 0 && r.max < r.min) return bad("a repetition bound {n,m} with m < n");
  return std::optional<Repeat>(r);
}

Expected<CharSet> PatternScanner::literal_escape() {
  ++pos_;  // the backslash
  if (at_end()) return bad("the " + what_ + " may not end with a backslash");
  const char e = peek();
  ++pos_;
  CharSet s;
  switch (e) {
    case 'n':
      s.ascii.add('\n');
      return s;
    case 't':
      s.ascii.add('\t');
      return s;
    case 'r':
      s.ascii.add('\r');
      return s;
    case 'f':
      s.ascii.add('\f');
      return s;
    case 'x':
    case 'u': {
      METRO_ASSIGN_OR_RETURN(int v, hex_escape(e == 'x' ? 2 : 4));
      s.ascii.add(static_cast<uint8_t>(v));
      return s;
    }
    default:
      if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z') || (e >= '0' && e <= '9') ||
          static_cast<uint8_t>(e) >= 0x80) {
        return bad(std::string("the escape \\") + e + " is not supported");
      }
      s.ascii.add(static_cast<uint8_t>(e));
      return s;
  }
}

Expected<CharSet> PatternScanner::char_class() {
  ++pos_;  // '['
  bool negate = false;
  if (!at_end() && peek() == '^') {
    negate = true;
    ++pos_;
  }
  CharSet s;
  // One character of a range (an escape or a literal), or -1 after merging a class escape.
  auto one = [&](bool range_end) -> Expected<int> {
    if (peek() == '\\') {
      METRO_ASSIGN_OR_RETURN(CharSet e, escape_set());
      const int c = single_char(e);
      if (c >= 0) return c;
      if (range_end) return bad("a range must end with one character");
      s.merge(e);
      return -1;
    }
    const char c = peek();
    if (static_cast<uint8_t>(c) >= 0x80) return bad("non-ASCII characters inside a class are not supported");
    if (!range_end && c == '[' && pos_ + 1 < end_ && p_[pos_ + 1] == ':') {
      return bad("POSIX classes ([:alpha:]) are not supported");
    }
    ++pos_;
    return static_cast<int>(static_cast<uint8_t>(c));
  };
  bool first = true;
  while (true) {
    if (at_end()) return bad("'[' does not close");
    if (peek() == ']' && !first) {
      ++pos_;
      break;
    }
    first = false;
    METRO_ASSIGN_OR_RETURN(int lo, one(false));
    if (lo < 0) continue;
    if (pos_ + 1 < end_ && peek() == '-' && p_[pos_ + 1] != ']') {
      ++pos_;
      METRO_ASSIGN_OR_RETURN(int hi, one(true));
      if (hi < lo) return bad("a range whose end is below its start");
      s.ascii.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    } else {
      s.ascii.add(static_cast<uint8_t>(lo));
    }
  }
  if (negate) s.invert();
  return s;
}

}  // namespace metro::grammar
