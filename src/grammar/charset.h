// What the text-pattern compilers (regular expressions, GBNF grammars) share: sets of
// characters, the element that writes one, and a scanner over pattern text that reads
// character classes and hex escapes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::grammar {

// A set of characters: ASCII ones by byte, and optionally every character of two or more
// UTF-8 bytes (what a negated class or '.' also matches).
struct CharSet {
  ByteSet ascii;
  bool multibyte = false;
  void add_all_ascii() { ascii.add_range(0, 0x7f); }
  // Every character not in the set (multi-byte ones included when they were not).
  void invert();
  void merge(const CharSet& o);
};

// The one character of a set that holds exactly one, else -1.
int single_char(const CharSet& s);

// One character of the set as the output writes it. `json_string`: the text sits inside a
// JSON string, so `"`, `\` and control characters are written escaped (\", \\, \n, \t, \r,
// \f, \b) and other control characters not at all.
Element charset_element(Builder& b, const CharSet& s, bool json_string);

// One well-formed UTF-8 character of two to four bytes.
Element utf8_multibyte(Builder& b);

// Reads pattern text: positions, errors that say where, classes and hex escapes.
class PatternScanner {
 public:
  virtual ~PatternScanner() = default;

 protected:
  // `what` names the text in errors ("regular expression", "grammar").
  PatternScanner(std::string_view text, std::string what) : p_(text), end_(text.size()), what_(std::move(what)) {}

  Status bad(const std::string& message) const;
  bool at_end() const { return pos_ >= end_; }
  char peek() const { return p_[pos_]; }
  // `digits` hex digits at pos_ (after \x or \u): an ASCII character.
  Expected<int> hex_escape(size_t digits);
  // The class at pos_ ('['): ranges, escapes (through escape_set()), a leading '^'
  // negating it, a ']' first taken literally.
  Expected<CharSet> char_class();
  // The escape at pos_ (a backslash): what it stands for.
  virtual Expected<CharSet> escape_set() = 0;
  // The escape at pos_ as grammar literals write it (GBNF, Lark): \n \t \r \f, \xHH and
  // \uHHHH of ASCII characters, any escaped punctuation; letters and digits otherwise are
  // refused by name.
  Expected<CharSet> literal_escape();

  struct Repeat {
    int min = 1, max = 1;  // max < 0: unbounded
  };
  // The quantifier at pos_ (* + ? {m} {m,} {m,n}, bounds at most kMaxRepeat), or nullopt
  // when there is none, a '{' not followed by a digit included (left unread). `spaces`:
  // blanks may stand inside the braces.
  Expected<std::optional<Repeat>> quantifier(bool spaces);
  static constexpr int kMaxRepeat = 4096;

  std::string_view p_;
  size_t pos_ = 0;
  size_t end_;
  std::string what_;
};

}  // namespace metro::grammar
