// GBNF text as grammars: what each accepts and refuses, the syntax (comments, newlines,
// escapes, classes, quantifiers, groups), and what is refused by name.
#include "grammar/gbnf.h"

#include <gtest/gtest.h>

#include "grammar/grammar_test_util.h"

namespace metro::grammar {
namespace {

using test_support::byte_trie;
using test_support::matches;

std::shared_ptr<const CompiledGrammar> compiled(const std::string& text) {
  auto g = gbnf_grammar(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  auto c = CompiledGrammar::compile(std::move(*g), byte_trie());
  EXPECT_TRUE(c.ok());
  return *c;
}

TEST(Gbnf, ArithmeticWithRecursionAndGroups) {
  auto g = compiled(R"g(
# integer arithmetic
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")"
)g");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"1", "1+2*(3-4)", "((7))", "10/2-3"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* no : {"", "1+", "(1", "1 + 2", "a"}) EXPECT_FALSE(matches(g, no)) << no;
}

TEST(Gbnf, LiteralsClassesAndQuantifiers) {
  auto g = compiled(
      "root ::= greeting \"\\n\" items\n"
      "greeting ::= \"h\\x69\" | \"héllo\"   # an escape and UTF-8\n"
      "items ::= item (\", \" item){0,2}\n"
      "item ::= [^,\\n]{1,5}\n");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"hi\na", "héllo\nab, c, de", "hi\n日本"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* no : {"hi\n", "hi\na, b, c, d", "hi\nabcdef", "hey\na"}) EXPECT_FALSE(matches(g, no)) << no;
  auto any = compiled("root ::= \"<\" .* \">\"\n");
  EXPECT_TRUE(matches(any, "<a\nb>"));
  auto opt = compiled("root ::= \"a\"? \"b\"+\n");
  EXPECT_TRUE(matches(opt, "b"));
  EXPECT_TRUE(matches(opt, "abbb"));
  EXPECT_FALSE(matches(opt, "a"));
}

TEST(Gbnf, RefusedByName) {
  const std::pair<const char*, const char*> cases[] = {
      {"root ::= missing\n", "'missing' is used but not defined"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "defined twice"},
      {"start ::= \"a\"\n", "no rule named 'root'"},
      {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
      {"root ::= \"a\n", "does not close"},
      {"root ::= \"\\q\"\n", "\\q"},
      {"root ::= [é]\n", "non-ASCII"},
      {"root ::= \"a\"{5000}\n", "4096"},
      {"root ::= (\"a\"\n", "does not close"},
      {"root = \"a\"\n", "'::='"},
      {"", "empty"},
  };
  for (const auto& [text, word] : cases) {
    auto g = gbnf_grammar(text);
    ASSERT_FALSE(g.ok()) << text;
    EXPECT_NE(g.status().message().find(word), std::string::npos) << text << ": " << g.status().message();
  }
  // A long chain of rules is refused past its bound, not followed down the stack.
  std::string chain = "root ::= r0\n";
  for (int i = 0; i < 2000; ++i) chain += "r" + std::to_string(i) + " ::= r" + std::to_string(i + 1) + "\n";
  chain += "r2000 ::= \"x\"\n";
  auto g = gbnf_grammar(chain);
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.status().message().find("more than 1024 rules"), std::string::npos) << g.status().message();
}

}  // namespace
}  // namespace metro::grammar
