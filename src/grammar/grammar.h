// Context-free grammars over bytes, the form every constraint on generated text compiles to
// (JSON schemas, JSON mode, a list of choices). A grammar is a set of rules; a rule is a set
// of alternatives; an alternative is a sequence of elements, each a set of bytes or a
// reference to a rule. Repetition is written with right recursion (the Builder does it), so
// that a matcher never loops without consuming a byte; validate() refuses the left
// recursion (direct or through rules that can match nothing) that would.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace metro::grammar {

// A set of bytes.
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1u; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi);
  void invert();
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  static ByteSet of(uint8_t b);
  static ByteSet range(uint8_t lo, uint8_t hi);
  auto operator<=>(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t {
    kBytes,  // one byte of the set `index`
    kRule,   // the rule `index`
    kEnd,    // ends an alternative
  };
  Kind kind = Kind::kEnd;
  uint32_t index = 0;
};

// Rules are stored flat: every alternative is a run of elements in elements() ending with
// kEnd, so a position in the grammar is one index.
class Grammar {
 public:
  uint32_t add_rule(std::string name);
  // Appends an alternative (its elements, without the kEnd) to `rule`.
  void add_alternative(uint32_t rule, const std::vector<Element>& seq);
  uint32_t intern(const ByteSet& s);
  void set_root(uint32_t rule) { root_ = rule; }

  uint32_t root() const { return root_; }
  size_t n_rules() const { return alts_.size(); }
  const std::string& rule_name(uint32_t r) const { return names_[r]; }
  // Start positions of the alternatives of rule r.
  const std::vector<uint32_t>& alternatives(uint32_t r) const { return alts_[r]; }
  const std::vector<Element>& elements() const { return elements_; }
  const ByteSet& byte_set(uint32_t i) const { return sets_[i]; }
  size_t n_byte_sets() const { return sets_.size(); }

  // Every rule has an alternative, every reference names a rule, and no rule can reach
  // itself without consuming a byte (left recursion). Errors name the rule.
  Status validate() const;
  // Whether rule r can match the empty string (valid after validate()).
  std::vector<bool> nullable() const;
  // A readable listing (GBNF-like), for errors and tests.
  std::string to_string() const;

 private:
  std::vector<std::string> names_;
  std::vector<std::vector<uint32_t>> alts_;
  std::vector<Element> elements_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_index_;
  uint32_t root_ = 0;
};

// Composes grammars from pieces; each helper returns an element to use in sequences.
class Builder {
 public:
  Grammar& grammar() { return g_; }
  Grammar take(uint32_t root);

  Element bytes(const ByteSet& s) { return {Element::Kind::kBytes, g_.intern(s)}; }
  Element byte(uint8_t b) { return bytes(ByteSet::of(b)); }
  // The exact bytes of `s` (an empty string matches nothing: the empty sequence).
  Element literal(std::string_view s);
  Element seq(const std::vector<Element>& parts, std::string name = "seq");
  Element alt(const std::vector<Element>& options, std::string name = "alt");
  Element empty();
  Element opt(Element e);
  Element star(Element e);
  Element plus(Element e);
  // Between min and max repetitions (max < 0: unbounded).
  Element repeat(Element e, int min, int max);
  // A rule to define later (recursion): ref(declare(...)) now, define(...) when known.
  uint32_t declare(std::string name) { return g_.add_rule(std::move(name)); }
  void define(uint32_t rule, Element e) { g_.add_alternative(rule, {e}); }
  Element ref(uint32_t rule) { return {Element::Kind::kRule, rule}; }
  // Copies every rule of `g` in (names prefixed with `prefix`) and returns a reference to
  // its root: a compiled piece (a JSON schema's grammar) used inside a larger grammar.
  Element embed(const Grammar& g, const std::string& prefix);

 private:
  Grammar g_;
  std::map<std::pair<uint32_t, uint32_t>, Element> stars_;  // (kind, index) -> rule
};

}  // namespace metro::grammar
