#include "loadgen/dataset.h"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <set>

#include "loadgen/prompt_text.h"
#include "support/test_util.h"

namespace metro::loadgen {
namespace {

int64_t word_count(const std::string& s) {
  if (s.empty()) return 0;
  int64_t n = 1;
  for (char c : s) n += c == ' ';
  return n;
}

LengthDist len(const char* spec, LengthSide side = LengthSide::kInput) {
  auto d = LengthDist::parse(spec, side);
  EXPECT_TRUE(d.ok()) << spec << ": " << d.status().message();
  return *d;
}

TEST(LoadgenLengthDist, ParsesEveryForm) {
  EXPECT_EQ(len("128").fixed, 128);
  EXPECT_EQ(len("fixed:7").fixed, 7);
  LengthDist u = len("uniform:10-20");
  EXPECT_EQ(u.kind, LengthDist::Kind::kUniform);
  EXPECT_EQ(u.lo, 10);
  EXPECT_EQ(u.hi, 20);
  LengthDist lu = len("loguniform:16-2048");
  EXPECT_EQ(lu.kind, LengthDist::Kind::kLogUniform);
  EXPECT_EQ(lu.lo, 16);
  EXPECT_EQ(lu.hi, 2048);
  EXPECT_EQ(lu.to_string(), "loguniform:16-2048");
  LengthDist l = len("lognormal:100,0.5,300");
  EXPECT_EQ(l.kind, LengthDist::Kind::kLognormal);
  EXPECT_DOUBLE_EQ(l.median, 100);
  EXPECT_EQ(l.max, 300);
  LengthDist preset_in = len("lognormal", LengthSide::kInput);
  LengthDist preset_out = len("lognormal", LengthSide::kOutput);
  EXPECT_NEAR(preset_in.mean(), 164.9, 0.1);   // ShareGPT's 161 prompt tokens, roughly
  EXPECT_NEAR(preset_out.mean(), 338.0, 0.1);  // and its 338 output tokens
  EXPECT_EQ(preset_in.max, static_cast<int64_t>(std::ceil(100 * std::exp(3.0))));
  for (const char* bad : {"", "0", "-5", "abc", "fixed:", "uniform:5", "uniform:9-3", "loguniform:5",
                          "loguniform:0-9", "loguniform:9-3",
                          "lognormal:100", "lognormal:100,0", "lognormal:100,1,2,3", "gauss:1,2",
                          "12x", "2000000"}) {
    EXPECT_FALSE(LengthDist::parse(bad, LengthSide::kInput).ok()) << bad;
  }
}

TEST(LoadgenLengthDist, SamplesMatchTheirDistribution) {
  Rng rng(1);
  LengthDist u = len("uniform:10-20");
  std::set<int64_t> seen;
  double sum = 0;
  for (int i = 0; i < 20000; ++i) {
    int64_t v = u.sample(rng);
    ASSERT_GE(v, 10);
    ASSERT_LE(v, 20);
    seen.insert(v);
    sum += static_cast<double>(v);
  }
  EXPECT_EQ(seen.size(), 11u);
  EXPECT_NEAR(sum / 20000, 15.0, 0.1);  // sd 3.16 / sqrt(20000) = 0.022

  // Log-uniform: every doubling as likely as the next, the mean as mean() says.
  LengthDist lu = len("loguniform:16-2047");
  const int n = 70000;
  std::array<int, 7> per_octave{};  // [16, 32), [32, 64), ... [1024, 2048)
  double lsum = 0;
  for (int i = 0; i < n; ++i) {
    int64_t x = lu.sample(rng);
    ASSERT_GE(x, 16);
    ASSERT_LE(x, 2047);
    lsum += static_cast<double>(x);
    ++per_octave[static_cast<size_t>(std::floor(std::log2(static_cast<double>(x)))) - 4];
  }
  for (int c : per_octave) EXPECT_NEAR(c, n / 7, 400) << "octaves should be equally likely";  // sd ~93
  EXPECT_NEAR(lsum / n, lu.mean(), 0.01 * lu.mean());  // mean 421, sd ~500: se 1.9
  EXPECT_EQ(len("loguniform:5-5").sample(rng), 5);

  // Lognormal: the median of samples is MEDIAN, everything is clamped to [1, MAX].
  LengthDist l = len("lognormal:100,1,1000");
  std::vector<int64_t> v;
  for (int i = 0; i < 20001; ++i) v.push_back(l.sample(rng));
  std::sort(v.begin(), v.end());
  EXPECT_NEAR(static_cast<double>(v[10000]), 100.0, 4.0);  // se of the median ~ 1.25% of 100
  EXPECT_GE(v.front(), 1);
  EXPECT_EQ(v.back(), 1000);  // P(x > 1000) = P(z > 2.30) = 1%: some are clamped
}

TEST(LoadgenPromptText, WordsAreDistinctAndCounted) {
  std::set<std::string_view> words(prompt_words().begin(), prompt_words().end());
  EXPECT_EQ(words.size(), prompt_words().size());
  EXPECT_GT(words.size(), 300u);
  Rng rng(3);
  std::string p = random_words(50, rng);
  EXPECT_EQ(word_count(p), 50);
  EXPECT_EQ(p.find("  "), std::string::npos);
  EXPECT_TRUE(random_words(0, rng).empty());
}

DatasetOptions options(const char* kind, size_t n) {
  DatasetOptions o;
  o.dataset = kind;
  o.num_requests = n;
  o.input_len = len("64");
  o.output_len = len("uniform:8-16", LengthSide::kOutput);
  o.seed = 11;
  return o;
}

TEST(LoadgenDataset, SyntheticLengthsSeedAndClasses) {
  DatasetOptions o = options("synthetic", 200);
  auto mix = ClassMix::parse("realtime:0.2,standard:0.3,batch:0.5");
  ASSERT_TRUE(mix.ok());
  o.classes = *mix;
  auto w = build_workload(o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->n_requests(), 200u);
  std::map<std::string, int> per_class;
  std::set<std::string> prompts;
  for (const auto& s : w->sessions) {
    ASSERT_EQ(s.turns.size(), 1u);
    EXPECT_EQ(word_count(s.turns[0].user), 64);
    EXPECT_EQ(s.turns[0].input_words, 64);
    EXPECT_GE(s.turns[0].max_tokens, 8);
    EXPECT_LE(s.turns[0].max_tokens, 16);
    ++per_class[s.class_name];
    prompts.insert(s.turns[0].user);
  }
  EXPECT_EQ(prompts.size(), 200u);  // no accidental prefix-cache hits between requests
  EXPECT_EQ(per_class.size(), 3u);
  // 200 draws at 0.5: 100 +- 5 sd; at 0.2: 40 +- 5.7 sd.
  EXPECT_NEAR(per_class["batch"], 100, 30);
  EXPECT_NEAR(per_class["realtime"], 40, 25);
  auto again = build_workload(o);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->sessions[17].turns[0].user, w->sessions[17].turns[0].user);
  o.seed = 12;
  auto other = build_workload(o);
  EXPECT_NE(other->sessions[17].turns[0].user, w->sessions[17].turns[0].user);
}

TEST(LoadgenDataset, SharedPrefixSharesTheirPrefix) {
  DatasetOptions o = options("shared-prefix", 12);
  o.input_len = len("60");
  o.prefix_len = 48;
  o.num_prefixes = 3;
  auto w = build_workload(o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->sessions.size(), 12u);
  std::map<int, std::string> prefix_of;
  std::set<std::string> users;
  for (size_t i = 0; i < w->sessions.size(); ++i) {
    const Session& s = w->sessions[i];
    EXPECT_EQ(s.prefix_index, static_cast<int>(i % 3));
    EXPECT_EQ(word_count(s.system), 48);
    EXPECT_EQ(word_count(s.turns[0].user), 12);
    EXPECT_EQ(s.turns[0].input_words, 60);
    auto [it, fresh] = prefix_of.emplace(s.prefix_index, s.system);
    EXPECT_EQ(it->second, s.system) << "session " << i;  // same index, same text
    users.insert(s.turns[0].user);
    // The completion prompt starts with the shared text; chat sends it as the system message.
    auto msgs = request_messages(s, 0, {});
    ASSERT_EQ(msgs.size(), 2u);
    EXPECT_EQ(msgs[0].role, "system");
    EXPECT_EQ(msgs[0].content, s.system);
    EXPECT_TRUE(completion_prompt(msgs).starts_with(s.system + "\n\n"));
  }
  EXPECT_EQ(prefix_of.size(), 3u);
  EXPECT_NE(prefix_of[0], prefix_of[1]);
  EXPECT_NE(prefix_of[1], prefix_of[2]);
  EXPECT_EQ(users.size(), 12u);  // each user has its own question

  o.input_len = len("48");
  auto bad = build_workload(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("--prefix-len"), std::string::npos);
}

TEST(LoadgenDataset, MultiTurnGrowsItsHistory) {
  DatasetOptions o = options("multi-turn", 10);
  o.turns = 4;
  auto w = build_workload(o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->n_requests(), 10u);
  ASSERT_EQ(w->sessions.size(), 3u);  // 4 + 4 + 2
  EXPECT_EQ(w->sessions[2].turns.size(), 2u);
  const Session& s = w->sessions[0];
  std::vector<ChatMessage> history;
  size_t prev_messages = 0, prev_chars = 0;
  for (size_t t = 0; t < s.turns.size(); ++t) {
    auto msgs = request_messages(s, t, history);
    EXPECT_EQ(msgs.size(), 2 * t + 1);
    EXPECT_GT(msgs.size(), prev_messages);
    const std::string prompt = completion_prompt(msgs);
    EXPECT_GT(prompt.size(), prev_chars);
    EXPECT_TRUE(prompt.ends_with(s.turns[t].user));
    if (t > 0) {
      EXPECT_EQ(msgs[2 * t - 1].content, "reply " + std::to_string(t - 1));
    }
    prev_messages = msgs.size();
    prev_chars = prompt.size();
    history.push_back({"user", s.turns[t].user});
    history.push_back({"assistant", "reply " + std::to_string(t)});
  }
}

TEST(LoadgenDataset, JsonlRecordsAndErrors) {
  const std::string text =
      "{\"prompt\": \"hello there\", \"max_tokens\": 5, \"class\": \"realtime\"}\n"
      "\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", "
      "\"content\": \"u\"}]}\r\n";
  auto s = parse_jsonl_sessions(text, "t.jsonl", 9);
  ASSERT_TRUE(s.ok()) << s.status().message();
  ASSERT_EQ(s->size(), 2u);
  EXPECT_EQ((*s)[0].turns[0].user, "hello there");
  EXPECT_EQ((*s)[0].turns[0].max_tokens, 5);
  EXPECT_EQ((*s)[0].class_name, "realtime");
  EXPECT_EQ((*s)[1].turns[0].messages.size(), 2u);
  EXPECT_EQ((*s)[1].turns[0].max_tokens, 9);
  EXPECT_EQ((*s)[1].class_name, "default");
  EXPECT_EQ(request_messages((*s)[1], 0, {}).size(), 2u);

  struct Bad {
    const char* text;
    const char* needle;
  };
  for (const Bad& b : {Bad{"{\"prompt\": 3}", "t.jsonl:1:"}, Bad{"\n\nnot json", "t.jsonl:3: not valid JSON"},
                       Bad{"[1]", "JSON object"}, Bad{"{\"x\": 1}", "\"prompt\""},
                       Bad{"{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens"},
                       Bad{"{\"messages\": [{\"role\": \"user\"}]}", "content"},
                       Bad{"{\"prompt\": \"a\", \"class\": \"x y\"}", "class name"}, Bad{"", "no records"}}) {
    auto r = parse_jsonl_sessions(b.text, "t.jsonl", 1);
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_NE(r.status().message().find(b.needle), std::string::npos) << r.status().message();
  }
}

TEST(LoadgenDataset, JsonlFileIsCycledToNumRequests) {
  metro::testing::TempFile f(".jsonl");
  f.write(std::string("{\"prompt\": \"a b\"}\n{\"prompt\": \"c\", \"max_tokens\": 3}\n"));
  DatasetOptions o = options(f.path().c_str(), 5);
  auto w = build_workload(o);
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->kind, "jsonl");
  ASSERT_EQ(w->n_requests(), 5u);
  EXPECT_EQ(w->sessions[4].turns[0].user, "a b");
  EXPECT_EQ(w->sessions[3].turns[0].max_tokens, 3);
  EXPECT_GE(w->sessions[0].turns[0].max_tokens, 8);  // from --output-len
  o.num_requests = 0;
  EXPECT_EQ(build_workload(o)->n_requests(), 2u);
  o.dataset = "/no/such/file.jsonl";
  auto missing = build_workload(o);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("synthetic, shared-prefix"), std::string::npos);
}

TEST(LoadgenClasses, ParseAndPick) {
  auto m = ClassMix::parse("a:1,b:3");
  ASSERT_TRUE(m.ok());
  Rng rng(9);
  int b = 0;
  for (int i = 0; i < 4000; ++i) b += m->pick(rng) == "b";
  EXPECT_NEAR(b, 3000, 150);  // sd 27
  auto plain = ClassMix::parse("x,y");  // weights default to 1
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->entries.size(), 2u);
  EXPECT_EQ(ClassMix().pick(rng), "default");
  for (const char* bad : {"a:0", "a:-1", "a:x", "a,a", ",", "a b:1", "a:1,"}) {
    EXPECT_FALSE(ClassMix::parse(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace metro::loadgen
