// Grammars, the matcher and its token masks, and JSON schemas compiled to grammars: what
// each accepts and refuses, masks against a token-by-token check on the real vocabulary,
// and schemas refused by the keyword they use.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/engine_test_util.h"
#include "grammar/grammar_test_util.h"
#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "support/test_util.h"

namespace metro::grammar {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const CompiledGrammar> compiled(Grammar g, std::shared_ptr<const TokenTrie> trie) {
  auto c = CompiledGrammar::compile(std::move(g), std::move(trie));
  EXPECT_TRUE(c.ok()) << c.status().message();
  return *c;
}

using test_support::byte_trie;
using test_support::matches;

std::vector<int32_t> allowed_ids(const TokenMask& m, int32_t n) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n; ++i) {
    if (mask_has(m, i)) out.push_back(i);
  }
  return out;
}

TEST(Grammar, LeftRecursionIsRefusedByRuleName) {
  Builder b;
  const uint32_t a = b.declare("list");
  b.grammar().add_alternative(a, {b.ref(a), b.byte('x')});
  b.grammar().add_alternative(a, {b.byte('y')});
  Grammar g = b.take(a);
  const Status s = g.validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'list'"), std::string::npos) << s.message();
  // Through a rule that matches nothing: just as endless.
  Builder c;
  const uint32_t r = c.declare("r");
  const Element nothing = c.empty();
  c.grammar().add_alternative(r, {nothing, c.ref(r), c.byte('x')});
  c.grammar().add_alternative(r, {c.byte('y')});
  EXPECT_FALSE(c.take(r).validate().ok());
  // Right recursion is how repetition is written: fine.
  Builder d;
  const Element xs = d.star(d.byte('x'));
  const uint32_t root = d.declare("root");
  d.define(root, xs);
  EXPECT_TRUE(d.take(root).validate().ok());
}

TEST(Matcher, ChoicesOnAToyVocabulary) {
  const std::vector<std::string> pieces = {"y", "es", "yes", "n", "o", "no", "may", "be", "x", "<eos>", "maybe!"};
  auto trie = TokenTrie::from_pieces(pieces, {9});
  auto g = compiled(*choice_grammar({"yes", "no", "maybe"}), trie);
  Matcher m(g);
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, 11), (std::vector<int32_t>{0, 2, 3, 5, 6}));
  EXPECT_FALSE(m.accept_token(8));
  EXPECT_FALSE(m.accept_token(9)) << "end of generation before the text is complete";
  ASSERT_TRUE(m.accept_token(0));
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, 11), (std::vector<int32_t>{1}));
  ASSERT_TRUE(m.accept_token(1));
  EXPECT_TRUE(m.is_accepting());
  EXPECT_FALSE(m.can_continue());
  m.fill_mask(mask);
  EXPECT_EQ(allowed_ids(mask, 11), (std::vector<int32_t>{9}));
  EXPECT_TRUE(m.accept_token(9));
  // A copy goes its own way.
  Matcher a(g);
  ASSERT_TRUE(a.accept_token(6));
  Matcher b(a);
  ASSERT_TRUE(b.accept_token(7));
  EXPECT_TRUE(b.is_accepting());
  EXPECT_FALSE(a.is_accepting());
  EXPECT_TRUE(a.allows(7));
  EXPECT_FALSE(a.allows(10)) << "'maybe!' runs past the grammar";
}

struct Case {
  json schema;
  std::vector<std::string> valid, invalid;
};

TEST(JsonSchema, AcceptsWhatTheSchemaAllowsAndRefusesTheRest) {
  const std::vector<Case> cases = {
      {json::parse(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer","minimum":0}},
                       "required":["name"]})"),
       {R"({"name":"Al"})", R"({"name": "Al", "age": 3})", R"({"name":"Al","age":0})",
        "{\n  \"name\": \"\\u00e9t\\u00e9 \xc3\xa9\",\n  \"age\": 42\n}"},
       {R"({"age":3})", R"({"name":"Al","age":-1})", R"({"name":1})", R"({"name":"Al",})", R"({"name":"Al")",
        R"({"name":"a"b"})", "{\"name\":\"\xff\"}", R"({"name":"Al","age":01})", R"({"name":"Al","extra":1})"}},
      {json::parse(R"({"enum":["red","green",3,null]})"), {R"("red")", "3", "null"}, {R"("blue")", "4", R"(red)"}},
      {json::parse(R"({"const":{"a":[1,true]}})"), {R"({"a":[1,true]})"}, {R"({"a":[1,false]})"}},
      {json::parse(R"({"anyOf":[{"type":"number"},{"type":"array","items":{"type":"boolean"},"minItems":1,"maxItems":2}]})"),
       {"1.5e3", "-0.25", "[true]", "[true, false]"}, {"[]", "[true,true,true]", "[1]", "1."}},
      {json::parse(R"({"$defs":{"node":{"type":"object","properties":{"v":{"type":"integer"},
                       "kids":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["v","kids"]}},
                       "$ref":"#/$defs/node"})"),
       {R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3,"kids":[]}]}]})"},
       {R"({"v":1})", R"({"v":1,"kids":[{"v":2}]})"}},
      {json::parse(R"({"type":"string","minLength":2,"maxLength":3})"), {R"("ab")", R"("abc")", R"("\n\t")"},
       {R"("a")", R"("abcd")"}},
      {json::parse(R"({"type":"string","format":"date"})"), {R"("2026-12-04")"}, {R"("2026-13-04")", R"("26-12-04")"}},
      {json::parse(R"({"type":"string","format":"uuid"})"), {R"("123e4567-e89b-12d3-a456-426614174000")"},
       {R"("123e4567e89b12d3a456426614174000")"}},
      {json::parse(R"({"type":["integer","null"]})"), {"0", "-17", "null"}, {"1.5", "\"1\""}},
      {json::parse(R"({"type":"object","additionalProperties":{"type":"integer","minimum":1}})"),
       {"{}", R"({"a":1,"b":22})"}, {R"({"a":0})", R"({"a":"x"})"}},
      {json::parse(R"({"type":"object","properties":{"a":{"type":"boolean"},"b":{"type":"null"}}})"),
       {"{}", R"({"a":true})", R"({"b":null})", R"({"a":false,"b":null})", "{ }"}, {R"({,"b":null})", R"({"a":true,})"}},
      {json::parse("true"), {R"({"x":[1,{"y":null}]})", "\"s\"", "-3"}, {"{x:1}", "[1,]"}},
      // Keywords apply to the types they name; enum values of another type are left out.
      {json::parse(R"({"type":["string","null"],"maxLength":3})"), {R"("ab")", "null"}, {R"("abcd")", "1"}},
      {json::parse(R"({"type":"string","enum":["a",1,"b"]})"), {R"("a")", R"("b")"}, {"1"}},
  };
  auto trie = byte_trie();
  for (const Case& c : cases) {
    auto g = json_schema_grammar(c.schema);
    ASSERT_TRUE(g.ok()) << c.schema.dump() << ": " << g.status().message();
    auto cg = compiled(std::move(*g), trie);
    for (const std::string& v : c.valid) EXPECT_TRUE(matches(cg, v)) << c.schema.dump() << " should accept " << v;
    for (const std::string& v : c.invalid) EXPECT_FALSE(matches(cg, v)) << c.schema.dump() << " should refuse " << v;
  }
  auto any = compiled(json_object_grammar(), trie);
  EXPECT_TRUE(matches(any, R"({"a": [1, 2.5, "x", {"b": null}], "c": false})"));
  EXPECT_FALSE(matches(any, "[1]")) << "JSON mode asks for an object";
  EXPECT_FALSE(matches(any, R"({"a": tru})"));
}

TEST(JsonSchema, WhatCannotBeGuaranteedIsRefusedByKeywordAndPath) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"type":"string","pattern":"(a)\\1"})", "backreferences"},
      {R"({"type":"integer","minimum":5})", "minimum"},
      {R"({"type":"object","properties":{"a":{"type":"number","maximum":3}}})", "/properties/a"},
      {R"({"type":"object","patternProperties":{"^x":{}}})", "'patternProperties'"},
      {R"({"allOf":[{"type":"string"},{"maxLength":3}]})", "allOf"},
      {R"({"type":"string","format":"email"})", "'email'"},
      {R"({"$ref":"https://example.com/s.json"})", "$ref"},
      {R"({"type":"string","minItems":2})", "'minItems' does not apply"},
      {R"({"type":"strin"})", "unknown type"},
      {R"(false)", "allows no value"},
      {R"({"enum":["abc"],"minLength":3})", "beside 'enum'"},
      {R"({"type":"integer","enum":["a"]})", "listed type"},
  };
  json wide = json{{"type", "object"}, {"properties", json::object()}};
  for (int i = 0; i < 2000; ++i) wide["properties"]["p" + std::to_string(i)] = json{{"type", "integer"}};
  auto w = json_schema_grammar(wide);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("more than 256 properties"), std::string::npos) << w.status().message();
  for (const auto& [text, want] : cases) {
    auto g = json_schema_grammar(json::parse(text));
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(want), std::string::npos) << text << ": " << g.status().message();
  }
}

// Alternatives that lead to the same sub-rule share its expansion: thirty levels of two-way
// choices between the same reference are thirty expansions, not 2^30 (this would not end).
TEST(Matcher, SharedSubRulesAreExpandedOnce) {
  json defs = json::object();
  for (int i = 0; i < 30; ++i) {
    const std::string next = "#/$defs/d" + std::to_string(i + 1);
    defs["d" + std::to_string(i)] = json{{"anyOf", json::array({json{{"$ref", next}}, json{{"$ref", next}}})}};
  }
  defs["d30"] = json{{"type", "integer"}};
  const json schema{{"$defs", defs}, {"$ref", "#/$defs/d0"}};
  auto g = json_schema_grammar(schema);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto cg = compiled(std::move(*g), byte_trie());
  EXPECT_TRUE(matches(cg, "12345"));
  EXPECT_FALSE(matches(cg, "\"x\""));
  Matcher m(cg);
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_TRUE(mask_has(mask, '7') && mask_has(mask, '-') && !mask_has(mask, '"'));
}

// Repetition returns to the same stacks: past the first elements of each shape, matching
// more of a long array makes no new stack node.
TEST(Matcher, LongRepetitionMakesNoNewStackNodes) {
  auto g = compiled(*json_schema_grammar(json::parse(R"({"type":"array","items":{"type":"integer"}})")), byte_trie());
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes("[1"));
  for (int i = 0; i < 1100; ++i) ASSERT_TRUE(m.accept_bytes("," + std::to_string(i)));
  const size_t nodes = m.n_nodes();
  for (int i = 1100; i < 5000; ++i) ASSERT_TRUE(m.accept_bytes("," + std::to_string(i)));
  EXPECT_EQ(m.n_nodes(), nodes);
  TokenMask mask;
  m.fill_mask(mask);
  EXPECT_TRUE(mask_has(mask, ',') && mask_has(mask, ']') && mask_has(mask, '5') && !mask_has(mask, 'a'));
  ASSERT_TRUE(m.accept_bytes("]"));
  EXPECT_TRUE(m.is_accepting());
}

// On SmolLM2's 49k-token vocabulary: the mask at each step of `text` equals checking every
// token one by one (accept_token on a copy, which never uses the mask walk or its shortcut
// over self-looping subtrees), and always holds the text's own next token.
void expect_masks_equal_token_checks(std::shared_ptr<const CompiledGrammar> g, const std::string& text) {
  const auto& tok = *metro::testing::default_model().tokenizer;
  const std::vector<int32_t> ids = tok.encode(text, false, false);
  Matcher m(std::move(g));
  TokenMask mask;
  const size_t stride = metro::testing::sanitized() ? 6 : 2;
  for (size_t i = 0; i < ids.size(); ++i) {
    m.fill_mask(mask);
    EXPECT_TRUE(mask_has(mask, ids[i])) << "step " << i << " token '" << tok.token_to_piece(ids[i]) << "'";
    if (i % stride == 0) {
      int differ = 0;
      for (int32_t t = 0; t < tok.n_vocab(); ++t) {
        if (mask_has(mask, t) != m.allows(t) && ++differ <= 3) {
          ADD_FAILURE() << "step " << i << " token " << t << " '" << tok.token_to_piece(t) << "': mask "
                        << mask_has(mask, t);
        }
      }
      EXPECT_EQ(differ, 0) << "step " << i;
    }
    ASSERT_TRUE(m.accept_token(ids[i])) << i;
  }
  EXPECT_TRUE(m.is_accepting());
}

TEST(Matcher, MaskEqualsATokenByTokenCheckOnTheRealVocabulary) {
  REQUIRE_MODEL();
  const auto& tok = *metro::testing::default_model().tokenizer;
  auto trie = TokenTrie::build(tok);
  const json schema = json::parse(R"({"type":"object","properties":{"city":{"type":"string"},
      "days":{"type":"integer","minimum":1},"tags":{"type":"array","items":{"enum":["rain","sun"]},"maxItems":3}},
      "required":["city","days"]})");
  auto g = compiled(*json_schema_grammar(schema), trie);
  expect_masks_equal_token_checks(g, R"({"city": "Zürich", "days": 12, "tags": ["rain", "sun"]})");
  Matcher m(g);
  ASSERT_TRUE(m.accept_bytes(R"({"city": "Zürich", "days": 12, "tags": ["rain", "sun"]})"));
  EXPECT_FALSE(m.can_continue());
  TokenMask mask;
  m.fill_mask(mask);
  for (int32_t t = 0; t < tok.n_vocab(); ++t) EXPECT_EQ(mask_has(mask, t), tok.is_eog(t)) << t;
  EXPECT_GT(g->cache_stats().entries, 0u);
}

// The same over states whose masks take the subtree shortcut in different ways: JSON mode's
// long strings (every byte but a quote, a backslash and control bytes loops), numbers and
// nesting, and a GBNF repetition of a small class (lower-case letters and spaces loop,
// nothing else).
TEST(Matcher, MasksOverSelfLoopingStatesEqualTokenByTokenChecks) {
  REQUIRE_MODEL();
  auto trie = TokenTrie::build(*metro::testing::default_model().tokenizer);
  auto json_mode = compiled(json_object_grammar(), trie);
  expect_masks_equal_token_checks(
      json_mode,
      R"({"note": "a long sentence with spaces, commas, digits 12345 and an escape \" here", "n": [1.5e3, -2, 300000],)"
      R"( "nested": {"k": "v\u00e9w"}})");
  // The same grammar again, its cached parts now met at other depths of nesting.
  expect_masks_equal_token_checks(
      json_mode, R"({"a": [[{"b": [1, {"c": "x y"}]}], {"d": {"e": {"f": [true, null, "z", {"g": []}]}}}], "h": 0})");
  EXPECT_GT(json_mode->cache_stats().tops, 0u);
  auto gb = gbnf_grammar(R"(root ::= [a-z ]+ "." [0-9]*)");
  ASSERT_TRUE(gb.ok()) << gb.status().message();
  expect_masks_equal_token_checks(compiled(std::move(*gb), trie),
                                  "the quick brown fox jumps over the lazy dog and then some more words.2026");
}

// Random recursive grammars over a small alphabet and a vocabulary of 4,000 random pieces of
// it: at every step of random generations the mask equals the token-by-token check. Masks
// are assembled from parts cut below a few stack positions and cached by the compiled
// grammar; its matchers run one after the other, so later ones reuse parts computed at other
// depths of nesting (rules recurse after a byte), with other rests below the cut. The
// vocabulary's subtrees are large enough that parts are also found below trie nodes, and
// loops of a class (cut below them, they run out after every byte) take the whole walk.
TEST(Matcher, MasksFromSharedPartsEqualTokenChecksOnRandomGrammars) {
  const std::string alpha = "ab[],\" 01";
  std::mt19937 rng(20261207);
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  std::vector<std::string> pieces;
  std::set<std::string> seen;
  for (char c : alpha) {
    pieces.emplace_back(1, c);
    seen.insert(pieces.back());
  }
  while (pieces.size() < 4000) {
    std::string p;
    for (size_t len = 2 + pick(6); p.size() < len;) p += alpha[pick(alpha.size())];
    if (seen.insert(p).second) pieces.push_back(p);
  }
  pieces.emplace_back("<eos>");
  const auto eos = static_cast<int32_t>(pieces.size() - 1);
  auto trie = TokenTrie::from_pieces(pieces, {eos});
  auto literal = [&](Builder& b) {
    std::string l;
    for (size_t len = 1 + pick(2); l.size() < len;) l += alpha[pick(alpha.size())];
    return b.literal(l);
  };
  auto klass = [&](Builder& b) {
    ByteSet set;
    while (set.empty()) {
      for (char c : alpha) {
        if (pick(3) == 0) set.add(static_cast<uint8_t>(c));
      }
    }
    return b.bytes(set);
  };
  size_t steps = 0, split = 0;
  for (int gi = 0; gi < 16; ++gi) {
    Builder b;
    std::vector<uint32_t> rules;
    for (int r = 0; r < 5; ++r) rules.push_back(b.declare("r" + std::to_string(r)));
    for (size_t r = 0; r < rules.size(); ++r) {
      const size_t n_alts = 1 + pick(3);
      for (size_t a = 0; a < n_alts; ++a) {
        // Each alternative begins with a byte, so recursion is never left recursion; the
        // first has no references, so every rule can end.
        std::vector<Element> seq{pick(2) == 0 ? literal(b) : klass(b)};
        for (size_t len = pick(4); len > 0; --len) {
          switch (pick(a == 0 ? 3 : 5)) {
            case 0: seq.push_back(literal(b)); break;
            case 1: seq.push_back(b.star(klass(b))); break;
            case 2: seq.push_back(b.opt(literal(b))); break;
            default: seq.push_back(b.ref(rules[pick(rules.size())])); break;
          }
        }
        // The others nest: a reference, then maybe a closing byte.
        if (a > 0) {
          seq.push_back(b.ref(rules[pick(rules.size())]));
          if (pick(2) == 0) seq.push_back(literal(b));
        }
        b.define(rules[r], b.seq(seq));
      }
    }
    auto g = compiled(b.take(rules[0]), trie);
    for (int run = 0; run < 4; ++run) {
      Matcher m(g);
      TokenMask mask;
      // Ambiguous grammars double their parses at each level; a run stops well before the
      // matcher's bound on stacks (where accept_token refuses what the mask allows).
      for (int step = 0; step < 48 && m.n_stacks() <= 64; ++step) {
        m.fill_mask(mask);
        std::vector<int32_t> next;
        for (int32_t t = 0; t < trie->n_vocab(); ++t) {
          ASSERT_EQ(mask_has(mask, t), m.allows(t)) << "grammar " << gi << " run " << run << " step " << step
                                                    << " token '" << pieces[static_cast<size_t>(t)] << "'\n"
                                                    << g->grammar().to_string();
          if (mask_has(mask, t) && t != eos) next.push_back(t);
        }
        ++steps;
        if (next.empty() || (m.is_accepting() && pick(12) == 0)) break;
        ASSERT_TRUE(m.accept_token(next[pick(next.size())]));
      }
    }
    split += g->cache_stats().tops > 0 ? 1 : 0;
  }
  EXPECT_GT(steps, 800u);
  EXPECT_EQ(split, 16u) << "every grammar's masks were assembled from parts";
}

}  // namespace
}  // namespace metro::grammar
