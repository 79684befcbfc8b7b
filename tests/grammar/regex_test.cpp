// Regular expressions as grammars: what each accepts and refuses, matched whole (metro.regex)
// and as a JSON schema's unanchored `pattern` inside a JSON string, and the constructs that
// are refused by name. tests/e2e/e2e_structured.py checks generated outputs against Python's
// `re` and `jsonschema`.
#include "grammar/regex.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "grammar/grammar_test_util.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"

namespace metro::grammar {
namespace {

using test_support::byte_trie;
using test_support::matches;

std::shared_ptr<const CompiledGrammar> compiled(Expected<Grammar> g) {
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::compile(std::move(*g), byte_trie());
  EXPECT_TRUE(c.ok());
  return *c;
}

struct Case {
  const char* pattern;
  std::vector<std::string> accept, reject;
};

TEST(Regex, WholeMatches) {
  const Case cases[] = {
      {"abc", {"abc"}, {"ab", "abcd", "xabc", ""}},
      {"a|bc|", {"a", "bc", ""}, {"b", "abc"}},
      {"\\d{3}-\\d{4}", {"555-1234"}, {"55-1234", "555-12345", "abc-defg"}},
      {"[A-Z][a-z]+", {"Paris", "Ab"}, {"paris", "A", "PARIS"}},
      {"[^0-9]*", {"", "abc", "héllo", "日本"}, {"a1"}},
      {"(ab)+c?", {"ab", "ababc"}, {"", "abcc", "aba"}},
      {"(?:yes|no)(, please)?", {"yes", "no, please"}, {"maybe", "yes,please"}},
      {"x{2,}", {"xx", "xxxx"}, {"x", ""}},
      {"x{1,3}", {"x", "xxx"}, {"", "xxxx"}},
      {"a.c", {"abc", "a-c", "aéc"}, {"ac", "a\nc", "abbc"}},
      {"\\w+@\\w+\\.com", {"bob@mail.com"}, {"bob@mail.org", "@mail.com"}},
      {"\\s*\\S", {"  x", "x"}, {"  ", ""}},
      {"[a\\-z]", {"a", "-", "z"}, {"b"}},
      {"[]a]", {"]", "a"}, {"b"}},
      {"\\x41\\u0042", {"AB"}, {"ab"}},
      {"^(?<year>\\d{4})-(?P<month>\\d{2})$", {"2026-12"}, {"2026-1"}},
      {"a{", {"a{"}, {"a"}},
      {"café|naïve", {"café", "naïve"}, {"cafe"}},
      {"[a-c]*?d", {"abcd", "d"}, {"abc"}},
  };
  for (const Case& c : cases) {
    auto g = compiled(regex_grammar(c.pattern));
    ASSERT_NE(g, nullptr) << c.pattern;
    for (const std::string& t : c.accept) EXPECT_TRUE(matches(g, t)) << c.pattern << " should match " << t;
    for (const std::string& t : c.reject) EXPECT_FALSE(matches(g, t)) << c.pattern << " should not match " << t;
  }
}

TEST(Regex, RefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"(a)\\1", "backreferences"}, {"a(?=b)", "lookahead"},    {"(?<=a)b", "lookbehind"},
      {"\\bword", "word boundaries"}, {"(?i)abc", "inline flags"}, {"a++", "possessive"},
      {"[é]", "non-ASCII"},           {"a^b", "'^'"},               {"a$b", "'$'"},
      {"(ab", "does not close"},      {"ab)", "unbalanced"},       {"*a", "nothing to repeat"},
      {"a{3,1}", "m < n"},            {"a{5000}", "4096"},          {"[b-a]", "below its start"},
      {"\\q", "\\q"},                 {"[[:alpha:]]", "POSIX"},     {"ab\\", "backslash"},
      {"(a*)*", "can match nothing"},
  };
  for (const auto& [pattern, word] : cases) {
    auto g = regex_grammar(pattern);
    ASSERT_FALSE(g.ok()) << pattern;
    EXPECT_NE(g.status().message().find(word), std::string::npos) << pattern << ": " << g.status().message();
  }
}

// A schema's pattern: the JSON string's contents contain a match (anchors bind it), with
// quote, backslash and control characters escaped as JSON writes them.
TEST(Regex, SchemaPatternsSearchInsideAJsonString) {
  auto schema = [](const char* pattern) {
    nlohmann::ordered_json s = {{"type", "string"}, {"pattern", pattern}};
    return compiled(json_schema_grammar(s));
  };
  auto g = schema("^[A-Z]{3}-\\d+$");
  EXPECT_TRUE(matches(g, "\"ABC-12\""));
  EXPECT_FALSE(matches(g, "\"xABC-12\""));
  EXPECT_FALSE(matches(g, "\"ABC-\""));
  g = schema("\\d\\d");  // unanchored: anywhere in the string
  EXPECT_TRUE(matches(g, "\"room 42 left\""));
  EXPECT_TRUE(matches(g, "\"12\""));
  EXPECT_FALSE(matches(g, "\"room 4\""));
  g = schema("^say \"hi\"\\\\\\n$");  // the text: say "hi"\ and a newline
  EXPECT_TRUE(matches(g, "\"say \\\"hi\\\"\\\\\\n\""));
  EXPECT_FALSE(matches(g, "\"say \"hi\"\""));
  g = schema("^[^a]$");  // any one character but a, escaped where JSON must
  EXPECT_TRUE(matches(g, "\"\\\"\""));
  EXPECT_TRUE(matches(g, "\"é\""));
  EXPECT_FALSE(matches(g, "\"a\""));
  EXPECT_FALSE(matches(g, "\"\"\""));
  auto bad = json_schema_grammar(nlohmann::ordered_json{{"type", "string"}, {"pattern", "(a)\\1"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/pattern"), std::string::npos) << bad.status().message();
  bad = json_schema_grammar(nlohmann::ordered_json{{"type", "string"}, {"pattern", "a"}, {"maxLength", 3}});
  ASSERT_FALSE(bad.ok());
}

}  // namespace
}  // namespace metro::grammar
