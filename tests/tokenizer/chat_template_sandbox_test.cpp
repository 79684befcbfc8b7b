// The sandbox around chat templates (docs/reliability.md item 6): each bound fails with a clear
// error, quickly, instead of hanging, exhausting memory or crashing; no host object or file
// is reachable; syntax errors name a line and column; Undefined behaves as Jinja's.
#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "tokenizer/chat_template.h"

namespace metro::tokenizer {
namespace {

using nlohmann::ordered_json;

ordered_json one_user(const std::string& content = "hi") {
  return ordered_json::array({{{"role", "user"}, {"content", content}}});
}

// Default limits without the wall-clock bound, so that which bound fires does not depend on
// the machine's load (the time limit has its own test).
ChatTemplateLimits deterministic() {
  ChatTemplateLimits l;
  l.max_render_ms = 0;
  return l;
}

// Renders `source`; returns the Status (ok or not) and the text.
struct Outcome {
  Status status;
  std::string text;
  double seconds = 0;
};

Outcome run(const std::string& source, const ChatTemplateLimits& limits = deterministic(),
            const ordered_json& messages = one_user()) {
  Outcome o;
  const auto start = std::chrono::steady_clock::now();
  auto t = ChatTemplate::parse(source, limits);
  if (!t.ok()) {
    o.status = t.status();
  } else {
    auto out = t->render(messages, {});
    if (out.ok()) {
      o.text = *out;
    } else {
      o.status = out.status();
    }
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return o;
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// ---- bounds --------------------------------------------------------------------------------

TEST(ChatTemplateSandbox, NestedLoopsHitTheStepLimit) {
  const Outcome o = run("{% for a in range(100000) %}{% for b in range(100000) %}{{ '' }}{% endfor %}{% endfor %}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "step limit")) << o.status.message();
  EXPECT_LT(o.seconds, 5.0);  // parse probes once and renders once, each bounded
}

// Found by chat_template_fuzz: an empty string or list times a huge count looped that many
// times (36 s for 9 ** 9) without reaching any bound.
TEST(ChatTemplateSandbox, RepeatingNothingAHugeNumberOfTimesIsImmediate) {
  for (const char* src : {"t {{- '' * 9 ** 9 }}#", "{{ ([] * 9 ** 9) | length }}", "{{ 9 ** 9 * '' }}x"}) {
    const Outcome o = run(src);
    EXPECT_TRUE(o.status.ok()) << src << ": " << o.status.message();
    EXPECT_LT(o.seconds, 1.0) << src;
  }
  EXPECT_EQ(run("t {{- '' * 9 ** 9 }}#").text, "t#");
  EXPECT_EQ(run("{{ ([] * 9 ** 9) | length }}").text, "0");
}

TEST(ChatTemplateSandbox, StepLimitIsConfigurable) {
  const std::string src = "{% for i in range(1000) %}{{ i }}{% endfor %}";
  ChatTemplateLimits small = deterministic();
  small.max_steps = 500;
  EXPECT_EQ(run(src, small).status.code(), ErrorCode::kResourceExhausted);
  ChatTemplateLimits enough = deterministic();
  enough.max_steps = 20000;
  const Outcome o = run(src, enough);
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  EXPECT_EQ(o.text.size(), 2890u);  // 10*1 + 90*2 + 900*3 digits
}

TEST(ChatTemplateSandbox, StringMultiplicationCannotAllocateHugeStrings) {
  const Outcome o = run("{{ 'x' * 1000000000000 }}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "output limit")) << o.status.message();
  EXPECT_FALSE(run("{{ [1, 2] * 1000000000000 }}").status.ok());
  EXPECT_FALSE(run("{{ 9223372036854775807 * 'ab' }}").status.ok());
}

TEST(ChatTemplateSandbox, OutputLimitStopsLongRenders) {
  const Outcome o = run("{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);

  ChatTemplateLimits limits = deterministic();
  limits.max_output_bytes = 100;
  EXPECT_TRUE(run("{{ 'z' * 100 }}", limits).status.ok());
  const Outcome over = run("{{ 'z' * 60 }}{{ 'z' * 60 }}", limits);
  ASSERT_FALSE(over.status.ok());
  EXPECT_TRUE(contains(over.status.message(), "100 bytes")) << over.status.message();
  // The limit also covers text captured by block set and macros, and message content.
  EXPECT_FALSE(run("{% set s %}{{ 'q' * 90 }}{{ 'q' * 90 }}{% endset %}", limits).status.ok());
  EXPECT_FALSE(run("{{ messages[0].content }}", limits, one_user(std::string(200, 'c'))).status.ok());
}

// A smaller step budget than the default keeps these tests fast (also under sanitizers).
ChatTemplateLimits quick() {
  ChatTemplateLimits l = deterministic();
  l.max_steps = 100'000;
  l.max_output_bytes = 1 << 20;
  return l;
}

TEST(ChatTemplateSandbox, DoublingStringsAndListsIsBounded) {
  Outcome o = run("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  o = run("{% set ns = namespace(s='x') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}{% endfor %}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  o = run("{% set ns = namespace(l=[1]) %}{% for i in range(100) %}{% set ns.l = ns.l + ns.l %}{% endfor %}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  o = run("{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s|replace('a', 'aa') %}{% endfor %}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  EXPECT_LT(o.seconds, 5.0);
}

TEST(ChatTemplateSandbox, DeeplyNestedValuesAreRefused) {
  const Outcome o = run("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "nested deeper")) << o.status.message();
  // Deep JSON input is refused the same way instead of overflowing the stack.
  // (Parsed in place: copying a nlohmann value this deep would itself recurse.)
  const ordered_json m = ordered_json::parse(R"([{"role": "user", "content": "hi", "extra": )" +
                                             std::string(10000, '[') + std::string(10000, ']') + "}]");
  auto t = ChatTemplate::parse("{{ messages }}");
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->render(m, {}).status().code(), ErrorCode::kResourceExhausted);
}

TEST(ChatTemplateSandbox, SharedStructureCannotBlowUpComparisonsOrPrinting) {
  // 2^100 leaves reachable through shared lists: comparing or printing must stop early.
  const std::string build =
      "{% set ns = namespace(a=[], b=[]) %}{% for i in range(100) %}"
      "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
  Outcome o = run(build + "{{ ns.a == ns.b }}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  EXPECT_LT(o.seconds, 5.0);
  o = run(build + "{{ ns.a }}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  o = run(build + "{{ ns.a|tojson }}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  o = run(build + "{{ ns.b in [ns.a] }}", quick());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
}

TEST(ChatTemplateSandbox, RecursiveMacrosHitTheRecursionLimit) {
  Outcome o = run("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "recursion")) << o.status.message();
  // Mutual recursion through caller() as well.
  o = run("{% macro a() %}{% call a() %}x{% endcall %}{{ caller() }}{% endmacro %}{% call a() %}y{% endcall %}");
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted) << o.status.message();
  // A bounded recursion within the limit works, and the limit is configurable.
  const std::string countdown =
      "{% macro c(n) %}{{ n }}{% if n > 0 %}{{ c(n - 1) }}{% endif %}{% endmacro %}{{ c(20) }}";
  o = run(countdown);
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  EXPECT_EQ(o.text, "20191817161514131211109876543210");
  ChatTemplateLimits shallow = deterministic();
  shallow.max_recursion_depth = 30;
  EXPECT_EQ(run(countdown, shallow).status.code(), ErrorCode::kResourceExhausted);
}

TEST(ChatTemplateSandbox, HugeSourceIsRefusedBeforeParsing) {
  ChatTemplateLimits limits = deterministic();
  limits.max_source_bytes = 1000;
  Outcome o = run(std::string(1001, 'a'), limits);
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "1001 bytes")) << o.status.message();
  EXPECT_TRUE(run(std::string(1000, 'a'), limits).status.ok());
  // The default limit (1 MiB) refuses a 2 MiB template.
  EXPECT_EQ(run(std::string(2 << 20, 'a')).status.code(), ErrorCode::kResourceExhausted);
}

TEST(ChatTemplateSandbox, DeepSyntaxNestingIsASyntaxErrorNotAStackOverflow) {
  const int n = 100000;
  const std::vector<std::string> sources = {
      "{{ " + std::string(n, '(') + "1" + std::string(n, ')') + " }}",
      "{{ " + std::string(n, '[') + std::string(n, ']') + " }}",
      "{{ " + std::string(n, '-') + "1 }}",
      [&] { std::string s = "{{ "; for (int i = 0; i < n; ++i) s += "not "; return s + "x }}"; }(),
      [&] { std::string s = "{{ 1"; for (int i = 0; i < n; ++i) s += " + 1"; return s + " }}"; }(),
      [&] { std::string s = "{{ x"; for (int i = 0; i < n; ++i) s += "|trim"; return s + " }}"; }(),
      [&] { std::string s = "{{ x"; for (int i = 0; i < n; ++i) s += ".a"; return s + " }}"; }(),
      [&] { std::string s = "{{ 1"; for (int i = 0; i < n / 2; ++i) s += " if x else 1"; return s + " }}"; }(),
      [&] { std::string s; for (int i = 0; i < n / 10; ++i) s += "{% if x %}"; return s; }(),
      [&] { std::string s; for (int i = 0; i < n / 10; ++i) s += "{% for x in y %}"; return s; }(),
  };
  for (const std::string& src : sources) {
    const Outcome o = run(src);
    ASSERT_FALSE(o.status.ok()) << src.substr(0, 40);
    EXPECT_EQ(o.status.code(), ErrorCode::kInvalidArgument) << src.substr(0, 40) << " -> " << o.status.message();
    EXPECT_TRUE(contains(o.status.message(), "nested") || contains(o.status.message(), "not closed"))
        << o.status.message();
  }
  // Moderate nesting is fine.
  EXPECT_TRUE(run("{{ " + std::string(30, '(') + "1" + std::string(30, ')') + " }}").status.ok());
}

TEST(ChatTemplateSandbox, TimeLimitStopsSlowRenders) {
  ChatTemplateLimits limits = deterministic();
  limits.max_steps = UINT64_MAX;
  limits.max_render_ms = 50;
  const Outcome o = run("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}", limits);
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kResourceExhausted);
  EXPECT_TRUE(contains(o.status.message(), "time limit")) << o.status.message();
  EXPECT_LT(o.seconds, 2.0);  // two renders (probe + real) of ~50 ms each
}

TEST(ChatTemplateSandbox, RangesAreCapped) {
  const Outcome o = run("{{ range(100001)|length }}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_TRUE(contains(o.status.message(), "range too big")) << o.status.message();
  EXPECT_EQ(run("{{ range(100000)|length }}").text, "100000");
  EXPECT_EQ(run("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904)|list }}").text,
            "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]");
}

TEST(ChatTemplateSandbox, NamespacesCannotFormCycles) {
  for (const char* src : {"{% set ns = namespace() %}{% set ns.me = ns %}",
                          "{% set ns = namespace() %}{% set ns.l = [1, [ns]] %}",
                          "{% set ns = namespace() %}{% set ns.d = {'k': ns} %}",
                          "{% set ns = namespace(inner=namespace()) %}"}) {
    const Outcome o = run(src);
    ASSERT_FALSE(o.status.ok()) << src;
    EXPECT_TRUE(contains(o.status.message(), "namespace")) << o.status.message();
  }
}

TEST(ChatTemplateSandbox, NoHostObjectsOrFiles) {
  // Python's escape hatches resolve to nothing: only plain data is reachable.
  for (const char* src : {"{{ ''.__class__ }}", "{{ messages.__class__ }}", "{{ messages.append }}",
                          "{{ range.__globals__ }}", "{{ namespace.__init__ }}", "{{ self }}",
                          "{{ config }}", "{{ request }}", "{{ lipsum }}", "{{ cycler }}", "{{ joiner }}",
                          "{{ messages[0].__dict__ }}", "{{ loop }}", "{{ raise_exception.__name__ }}"}) {
    const Outcome o = run(src);
    ASSERT_TRUE(o.status.ok()) << src << ": " << o.status.message();
    EXPECT_EQ(o.text, "") << src;
  }
  // Going one step further fails on Undefined instead of reaching anything.
  for (const char* src : {"{{ ''.__class__.__mro__ }}", "{{ self.__init__.__globals__ }}",
                          "{{ messages.pop() }}", "{{ messages[0].update({'a': 1}) }}"}) {
    EXPECT_FALSE(run(src).status.ok()) << src;
  }
  for (const char* src : {"{% include 'x.jinja' %}", "{% import 'x' as y %}", "{% from 'x' import y %}",
                          "{% extends 'base.html' %}", "{% block b %}{% endblock %}"}) {
    const Outcome o = run(src);
    ASSERT_FALSE(o.status.ok()) << src;
    EXPECT_TRUE(contains(o.status.message(), "not supported")) << o.status.message();
  }
}

TEST(ChatTemplateSandbox, InputsAreNeverModified) {
  auto t = ChatTemplate::parse("{% set m = messages[0] %}{% set messages = [] %}{{ m.content }}{{ messages|length }}");
  ASSERT_TRUE(t.ok());
  const ordered_json input = one_user("keep");
  for (int i = 0; i < 2; ++i) {
    auto out = t->render(input, {});
    ASSERT_TRUE(out.ok());
    EXPECT_EQ(*out, "keep0");
  }
  EXPECT_EQ(input, one_user("keep"));
}

// ---- syntax errors -------------------------------------------------------------------------

TEST(ChatTemplateSyntax, ErrorsNameLineAndColumn) {
  struct Case {
    std::string source;
    std::string location;
    std::string words;
  };
  const std::vector<Case> cases = {
      {"line1\n{{ 1 + }}", "line 2, column 8", "expected an expression"},
      {"a\nb\n   {% if x %}\nno end", "line 3, column 4", "'if' block is not closed"},
      {"{% for x in y %}\n{% endif %}", "line 2, column 4",
       "unexpected 'endif' (expected 'endfor' or 'else' to close the 'for' block at line 1, column 1)"},
      {"ok\n{% frobnicate %}", "line 2, column 4", "unknown tag 'frobnicate'"},
      {"{{ x | nosuch }}", "line 1, column 8", "no filter named 'nosuch'"},
      {"\n\n{{ x is nosuch }}", "line 3, column 9", "no test named 'nosuch'"},
      {"{{ 'unterminated }}", "line 1, column 4", "unterminated string"},
      {"{# never closed", "line 1, column 1", "comment"},
      {"x\r\ny\r\n{{ $ }}", "line 3, column 4", "unexpected character '$'"},
      {"{{ (1 }}", "line 1, column 7", "unexpected '}', expected ')'"},
      {"{{ [1, 2 }}", "line 1, column 10", "expected ']'"},
      {"{% break %}", "line 1, column 4", "outside of a for loop"},
      {"{{ x", "line 1, column 1", "unexpected end of template"},
      {"{% if x %}{% else %}{% else %}{% endif %}", "line 1, column 24", "unexpected 'else' (expected 'endif'"},
      {"{% endfor %}", "line 1, column 4", "unexpected 'endfor'"},
      {"{{ f(a=1, 2) }}", "line 1, column 11", "positional argument after a keyword"},
      {"{% raw %}never closed", "line 1, column 1", "raw"},
  };
  for (const Case& c : cases) {
    const Outcome o = run(c.source);
    ASSERT_FALSE(o.status.ok()) << c.source;
    EXPECT_EQ(o.status.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(o.status.message(), "syntax error")) << o.status.message();
    EXPECT_TRUE(contains(o.status.message(), c.location)) << c.source << " -> " << o.status.message();
    EXPECT_TRUE(contains(o.status.message(), c.words)) << c.source << " -> " << o.status.message();
  }
}

TEST(ChatTemplateSyntax, InvalidUtf8IsRefused) {
  const Outcome o = run(std::string("{{ 'a\xff' }}"));
  ASSERT_FALSE(o.status.ok());
  EXPECT_TRUE(contains(o.status.message(), "UTF-8"));
}

TEST(ChatTemplateSyntax, RuntimeErrorsNameTheirLocation) {
  const Outcome o = run("ok\n{% for m in messages %}\n  {{ m.content + 1 }}\n{% endfor %}");
  ASSERT_FALSE(o.status.ok());
  EXPECT_EQ(o.status.code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(contains(o.status.message(), "line 3")) << o.status.message();
  EXPECT_TRUE(contains(o.status.message(), "can only concatenate str")) << o.status.message();
}

// ---- Undefined -----------------------------------------------------------------------------

TEST(ChatTemplateUndefined, BehavesLikeJinjasDefaultUndefined) {
  struct Case {
    const char* source;
    const char* output;
  };
  const Case ok[] = {
      {"[{{ nope }}]", "[]"},
      {"{% if nope %}y{% else %}n{% endif %}", "n"},
      {"{{ nope|length }}", "0"},
      {"{% for x in nope %}x{% else %}empty{% endfor %}", "empty"},
      {"{{ nope is defined }} {{ nope is undefined }} {{ nope is none }}", "False True False"},
      {"{{ nope ~ 'x' }}", "x"},
      {"{{ nope|default('d') }} {{ nope|default(none) }}", "d None"},
      {"{{ messages[0].missing }}|{{ messages[0]['missing'] }}|{{ messages[5] }}", "||"},
      {"{{ not nope }} {{ nope or 'alt' }} {{ nope and 'x' }}", "True alt "},
      {"{{ nope == nope }} {{ nope == none }}", "True False"},
      {"{{ nope|string|length }} {{ nope|list }} {{ nope|join(',') }}|", "0 [] |"},
  };
  for (const Case& c : ok) {
    const Outcome o = run(c.source);
    ASSERT_TRUE(o.status.ok()) << c.source << ": " << o.status.message();
    EXPECT_EQ(o.text, c.output) << c.source;
  }
  const std::pair<const char*, const char*> bad[] = {
      {"{{ nope.attr }}", "'nope' is undefined"},
      {"{{ nope['k'] }}", "'nope' is undefined"},
      {"{{ nope + 1 }}", "'nope' is undefined"},
      {"{{ nope() }}", "'nope' is undefined"},
      {"{{ messages[0].missing.deeper }}", "has no attribute 'missing'"},
      {"{{ nope|tojson }}", "not JSON serializable"},
  };
  for (const auto& [src, words] : bad) {
    const Outcome o = run(src);
    ASSERT_FALSE(o.status.ok()) << src;
    EXPECT_EQ(o.status.code(), ErrorCode::kInvalidArgument);
    EXPECT_TRUE(contains(o.status.message(), words)) << src << " -> " << o.status.message();
  }
}

}  // namespace
}  // namespace metro::tokenizer
