// Structured outputs: the cost of a token mask on SmolLM2's 49k vocabulary and of compiling a
// schema, for JSON mode, a tool-call schema, and a request's tools as the server compiles them
// (two functions, the Hermes format, tool_choice required), and a regular expression
// (metro.regex).
//
//   build/bin/metro_kernel_bench --benchmark_filter=Grammar
//
// GrammarMask walks a real output token by token, computing each step's mask as the engine
// does: `cold` with a new grammar (every stack set is a cache miss, each miss a walk of the
// vocabulary trie), `warm` with the grammar's mask cache filled by an earlier request with
// the same schema. Counters: avg_us and p99_us per token (the goal is 50 us on average and
// 0.5 ms at p99), `forced`, the steps whose mask allows exactly one token (those
// jump-forward computes without a step of their own), and `parts_kib`, the memory of the
// mask parts the grammar cached.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"
#include "server/tool_calls.h"
#include "tokenizer/tokenizer.h"

namespace {

using metro::grammar::CompiledGrammar;
using metro::grammar::Matcher;
using metro::grammar::TokenMask;
using metro::grammar::TokenTrie;

const char* kToolSchema = R"({"type":"object","properties":{
  "name":{"const":"get_weather"},
  "arguments":{"type":"object","properties":{
    "location":{"type":"string"},"unit":{"enum":["celsius","fahrenheit"]},"days":{"type":"integer","minimum":1}},
    "required":["location"]}},
  "required":["name","arguments"]})";
const char* kToolText =
    R"({"name": "get_weather", "arguments": {"location": "San Francisco, CA", "unit": "celsius", "days": 3}})";
const char* kHermesText =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"location\": \"San Francisco, CA\", \"unit\": "
    "\"celsius\", \"days\": 3}}\n</tool_call>";
const char* kRegex = R"([A-Z][a-z]+ [A-Z][a-z]+ <[a-z0-9._-]+@[a-z0-9-]+(\.[a-z]{2,})+>, \+\d{1,3} \d{3} \d{4}( \(\w+\))?)";
const char* kRegexText = "Ada Lovelace <ada.lovelace@analytical-engine.co.uk>, +44 207 1234 (office)";
const char* kObjectText =
    R"({"title": "Trip notes", "stops": [{"city": "Lyon", "nights": 2}, {"city": "Turin", "nights": 3}], )"
    R"("budget": 1250.5, "booked": true, "notes": null})";

std::string model_path() {
  if (const char* env = std::getenv("METRO_MODEL")) return env;
  return "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

struct Vocab {
  std::unique_ptr<metro::tokenizer::Tokenizer> tok;
  std::shared_ptr<const TokenTrie> trie;
};

const Vocab* vocab() {
  static Vocab v;
  static const bool loaded = [] {
    auto f = metro::gguf::File::open(model_path());
    if (!f.ok()) return false;
    auto t = metro::tokenizer::Tokenizer::from_gguf(*f);
    if (!t.ok()) return false;
    v.tok = std::make_unique<metro::tokenizer::Tokenizer>(std::move(*t));
    v.trie = TokenTrie::build(*v.tok);
    return true;
  }();
  return loaded ? &v : nullptr;
}

metro::server::ToolRequest hermes_tools() {
  metro::server::ToolRequest t;
  t.format = metro::server::ToolFormat::kHermes;
  t.mode = metro::server::ToolRequest::Mode::kRequired;
  t.functions.push_back({"get_weather", "", nlohmann::ordered_json::parse(kToolSchema)["properties"]["arguments"]});
  t.functions.push_back({"get_time", "", nlohmann::ordered_json::parse(
                                             R"({"type":"object","properties":{"zone":{"type":"string"}},"required":["zone"]})")});
  return t;
}

metro::grammar::Grammar grammar_of(int which) {
  if (which == 0) return metro::grammar::json_object_grammar();
  if (which == 2) return *metro::server::tool_call_grammar(hermes_tools());
  if (which == 3) return *metro::grammar::regex_grammar(kRegex);
  return *metro::grammar::json_schema_grammar(nlohmann::ordered_json::parse(kToolSchema));
}

const char* text_of(int which) {
  return which == 0 ? kObjectText : which == 1 ? kToolText : which == 2 ? kHermesText : kRegexText;
}
const char* label_of(int which) {
  return which == 0 ? "json_object" : which == 1 ? "tool_schema" : which == 2 ? "hermes_tools" : "regex";
}

// Per-token mask times of one pass over the text's tokens; *forced counts the masks that
// allow one token.
std::vector<double> mask_pass(const std::shared_ptr<const CompiledGrammar>& g, const std::vector<int32_t>& ids,
                              int* forced = nullptr) {
  Matcher m(g);
  TokenMask mask;
  std::vector<double> us;
  for (int32_t id : ids) {
    const auto t0 = std::chrono::steady_clock::now();
    m.fill_mask(mask);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    if (forced != nullptr) {
      int n = 0;
      for (uint64_t w : mask) n += std::popcount(w);
      *forced += n == 1 ? 1 : 0;
    }
    if (!m.accept_token(id)) break;
  }
  return us;
}

void BM_GrammarMask(benchmark::State& state) {
  const Vocab* v = vocab();
  if (v == nullptr) {
    state.SkipWithError("default model missing (run from the repository root, or set METRO_MODEL)");
    return;
  }
  const int which = static_cast<int>(state.range(0));
  const bool warm = state.range(1) != 0;
  const std::vector<int32_t> ids = v->tok->encode(text_of(which), false, false);
  std::vector<double> all;
  std::shared_ptr<const CompiledGrammar> shared = *CompiledGrammar::compile(grammar_of(which), v->trie);
  int forced = 0;
  if (warm) mask_pass(shared, ids, &forced);
  for (auto _ : state) {
    std::shared_ptr<const CompiledGrammar> g = warm ? shared : *CompiledGrammar::compile(grammar_of(which), v->trie);
    const std::vector<double> us = mask_pass(g, ids);
    all.insert(all.end(), us.begin(), us.end());
    state.counters["parts_kib"] = static_cast<double>(g->cache_stats().top_bytes) / 1024.0;
  }
  std::sort(all.begin(), all.end());
  double sum = 0;
  for (double x : all) sum += x;
  state.counters["avg_us"] = all.empty() ? 0.0 : sum / static_cast<double>(all.size());
  state.counters["p99_us"] = all.empty() ? 0.0 : all[std::min(all.size() - 1, all.size() * 99 / 100)];
  state.counters["tokens"] = static_cast<double>(ids.size());
  if (warm) state.counters["forced"] = forced;
  state.SetLabel(std::string(label_of(which)) + (warm ? " warm" : " cold"));
}
BENCHMARK(BM_GrammarMask)->ArgNames({"grammar", "warm"})->Args({0, 0})->Args({0, 1})->Args({1, 0})->Args({1, 1})
    ->Args({2, 0})->Args({2, 1})->Args({3, 0})->Args({3, 1})->Unit(benchmark::kMillisecond);

void BM_GrammarCompile(benchmark::State& state) {
  const Vocab* v = vocab();
  if (v == nullptr) {
    state.SkipWithError("default model missing (run from the repository root, or set METRO_MODEL)");
    return;
  }
  const int which = static_cast<int>(state.range(0));
  for (auto _ : state) {
    auto g = CompiledGrammar::compile(grammar_of(which), v->trie);
    benchmark::DoNotOptimize(g);
  }
  state.SetLabel(label_of(which));
}
BENCHMARK(BM_GrammarCompile)->ArgName("grammar")->DenseRange(0, 3)->Unit(benchmark::kMicrosecond);

}  // namespace
