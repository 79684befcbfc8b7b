#include "grammar/grammar.h"

namespace metro::grammar {

void ByteSet::add_range(uint8_t lo, uint8_t hi) {
  for (unsigned b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
}

void ByteSet::invert() {
  for (uint64_t& w : bits) w = ~w;
}

ByteSet ByteSet::of(uint8_t b) {
  ByteSet s;
  s.add(b);
  return s;
}

ByteSet ByteSet::range(uint8_t lo, uint8_t hi) {
  ByteSet s;
  s.add_range(lo, hi);
  return s;
}

uint32_t Grammar::add_rule(std::string name) {
  names_.push_back(std::move(name));
  alts_.emplace_back();
  return static_cast<uint32_t>(alts_.size() - 1);
}

void Grammar::add_alternative(uint32_t rule, const std::vector<Element>& seq) {
  alts_[rule].push_back(static_cast<uint32_t>(elements_.size()));
  for (const Element& e : seq) elements_.push_back(e);
  elements_.push_back(Element{Element::Kind::kEnd, 0});
}

uint32_t Grammar::intern(const ByteSet& s) {
  auto [it, fresh] = set_index_.emplace(s, static_cast<uint32_t>(sets_.size()));
  if (fresh) sets_.push_back(s);
  return it->second;
}

std::vector<bool> Grammar::nullable() const {
  std::vector<bool> n(alts_.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < alts_.size(); ++r) {
      if (n[r]) continue;
      for (uint32_t start : alts_[r]) {
        bool all = true;
        for (uint32_t p = start; elements_[p].kind != Element::Kind::kEnd; ++p) {
          const Element& e = elements_[p];
          if (e.kind == Element::Kind::kBytes || !n[e.index]) {
            all = false;
            break;
          }
        }
        if (all) {
          n[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return n;
}

Status Grammar::validate() const {
  if (alts_.empty()) return invalid_argument("grammar: no rules");
  if (root_ >= alts_.size()) return invalid_argument("grammar: the root is not a rule");
  for (size_t r = 0; r < alts_.size(); ++r) {
    if (alts_[r].empty()) return invalid_argument("grammar: rule '" + names_[r] + "' has no alternative");
    for (uint32_t start : alts_[r]) {
      for (uint32_t p = start; elements_[p].kind != Element::Kind::kEnd; ++p) {
        const Element& e = elements_[p];
        if (e.kind == Element::Kind::kRule && e.index >= alts_.size()) {
          return invalid_argument("grammar: rule '" + names_[r] + "' refers to an unknown rule");
        }
        if (e.kind == Element::Kind::kBytes && (e.index >= sets_.size() || sets_[e.index].empty())) {
          return invalid_argument("grammar: rule '" + names_[r] + "' has an empty byte set");
        }
      }
    }
  }
  // Left recursion: r -> s when s can come first in r (after elements that match nothing).
  const std::vector<bool> null = nullable();
  std::vector<std::vector<uint32_t>> first(alts_.size());
  for (size_t r = 0; r < alts_.size(); ++r) {
    for (uint32_t start : alts_[r]) {
      for (uint32_t p = start; elements_[p].kind == Element::Kind::kRule; ++p) {
        first[r].push_back(elements_[p].index);
        if (!null[elements_[p].index]) break;
      }
    }
  }
  // Depth-first over the "comes first" edges, with an explicit stack: a grammar from a
  // request (GBNF text) may chain thousands of rules.
  std::vector<uint8_t> color(alts_.size(), 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;  // rule, next edge to follow
  for (uint32_t start = 0; start < alts_.size(); ++start) {
    if (color[start] != 0) continue;
    color[start] = 1;
    path.emplace_back(start, 0);
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == first[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t s = first[r][next++];
      if (color[s] == 1) {
        return invalid_argument("grammar: rule '" + names_[s] +
                                "' is left-recursive (it can reach itself without matching a byte)");
      }
      if (color[s] == 0) {
        color[s] = 1;
        path.emplace_back(s, 0);
      }
    }
  }
  return Status();
}

namespace {
std::string set_text(const ByteSet& s) {
  std::string out = "[";
  auto put = [&](unsigned b) {
    if (b >= 0x20 && b < 0x7f && b != ']' && b != '\\' && b != '-') {
      out += static_cast<char>(b);
    } else {
      static const char* kHex = "0123456789ABCDEF";
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
    }
  };
  for (unsigned b = 0; b < 256;) {
    if (!s.has(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    unsigned e = b;
    while (e + 1 < 256 && s.has(static_cast<uint8_t>(e + 1))) ++e;
    put(b);
    if (e > b) {
      out += '-';
      put(e);
    }
    b = e + 1;
  }
  return out + "]";
}
}  // namespace

std::string Grammar::to_string() const {
  std::string out;
  for (size_t r = 0; r < alts_.size(); ++r) {
    out += names_[r] + "#" + std::to_string(r) + " ::=";
    for (size_t a = 0; a < alts_[r].size(); ++a) {
      if (a > 0) out += " |";
      bool any = false;
      for (uint32_t p = alts_[r][a]; elements_[p].kind != Element::Kind::kEnd; ++p) {
        const Element& e = elements_[p];
        out += ' ';
        out += e.kind == Element::Kind::kBytes ? set_text(sets_[e.index])
                                               : names_[e.index] + "#" + std::to_string(e.index);
        any = true;
      }
      if (!any) out += " \"\"";
    }
    out += '\n';
  }
  return out;
}

Grammar Builder::take(uint32_t root) {
  g_.set_root(root);
  stars_.clear();
  return std::move(g_);
}

Element Builder::embed(const Grammar& g, const std::string& prefix) {
  std::vector<uint32_t> rule_of(g.n_rules());
  for (uint32_t r = 0; r < g.n_rules(); ++r) rule_of[r] = g_.add_rule(prefix + g.rule_name(r));
  std::vector<Element> seq;
  for (uint32_t r = 0; r < g.n_rules(); ++r) {
    for (uint32_t start : g.alternatives(r)) {
      seq.clear();
      for (uint32_t i = start; g.elements()[i].kind != Element::Kind::kEnd; ++i) {
        const Element e = g.elements()[i];
        seq.push_back(e.kind == Element::Kind::kBytes ? bytes(g.byte_set(e.index)) : ref(rule_of[e.index]));
      }
      g_.add_alternative(rule_of[r], seq);
    }
  }
  return ref(rule_of[g.root()]);
}

Element Builder::literal(std::string_view s) {
  if (s.size() == 1) return byte(static_cast<uint8_t>(s[0]));
  std::vector<Element> parts;
  for (char c : s) parts.push_back(byte(static_cast<uint8_t>(c)));
  return seq(parts, "lit");
}

Element Builder::seq(const std::vector<Element>& parts, std::string name) {
  if (parts.size() == 1) return parts[0];
  const uint32_t r = g_.add_rule(std::move(name));
  g_.add_alternative(r, parts);
  return ref(r);
}

Element Builder::alt(const std::vector<Element>& options, std::string name) {
  if (options.size() == 1) return options[0];
  const uint32_t r = g_.add_rule(std::move(name));
  for (const Element& o : options) g_.add_alternative(r, {o});
  return ref(r);
}

Element Builder::empty() {
  const uint32_t r = g_.add_rule("empty");
  g_.add_alternative(r, {});
  return ref(r);
}

Element Builder::opt(Element e) {
  const uint32_t r = g_.add_rule("opt");
  g_.add_alternative(r, {e});
  g_.add_alternative(r, {});
  return ref(r);
}

Element Builder::star(Element e) {
  const auto key = std::make_pair(static_cast<uint32_t>(e.kind), e.index);
  if (auto it = stars_.find(key); it != stars_.end()) return it->second;
  const uint32_t r = g_.add_rule("star");
  g_.add_alternative(r, {e, ref(r)});
  g_.add_alternative(r, {});
  stars_[key] = ref(r);
  return ref(r);
}

Element Builder::plus(Element e) { return seq({e, star(e)}, "plus"); }

Element Builder::repeat(Element e, int min, int max) {
  std::vector<Element> parts(static_cast<size_t>(min), e);
  if (max < 0) {
    parts.push_back(star(e));
  } else if (max > min) {
    // opt(e opt(e ...)): at most max - min more.
    Element tail = opt(e);
    for (int i = min + 1; i < max; ++i) tail = opt(seq({e, tail}));
    parts.push_back(tail);
  }
  if (parts.empty()) return empty();
  return seq(parts, "repeat");
}

}  // namespace metro::grammar
