// Tokenizer throughput: MB/s of text encoded (and decoded) on one core.
//
//   build/bin/metro_kernel_bench --benchmark_filter=Tokenizer
//   METRO_BENCH_TEXT=some_english.txt build/bin/metro_kernel_bench --benchmark_filter=Tokenizer
//
// Without METRO_BENCH_TEXT the text is generated English-like prose: words drawn from a
// Zipf distribution over a list of common English words, with capitals, punctuation,
// numbers and paragraph breaks. The bar is >= 10 MB/s encoding English prose.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

constexpr const char* kWords[] = {
    "the", "of", "and", "to", "a", "in", "is", "it", "that", "was", "for", "on", "are", "with",
    "as", "I", "his", "they", "be", "at", "one", "have", "this", "from", "or", "had", "by",
    "not", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there",
    "when", "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their",
    "time", "if", "will", "way", "about", "many", "then", "them", "write", "would", "like",
    "so", "these", "her", "long", "make", "thing", "see", "him", "two", "has", "look", "more",
    "day", "could", "go", "come", "did", "number", "sound", "no", "most", "people", "my",
    "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been",
    "now", "find", "any", "new", "work", "part", "take", "get", "place", "made", "live",
    "where", "after", "back", "little", "only", "round", "man", "year", "came", "show",
    "every", "good", "me", "give", "our", "under", "name", "very", "through", "just", "form",
    "sentence", "great", "think", "say", "help", "low", "line", "differ", "turn", "cause",
    "much", "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does",
    "set", "three", "want", "air", "well", "also", "play", "small", "end", "put", "home",
    "read", "hand", "port", "large", "spell", "add", "even", "land", "here", "must", "big",
    "high", "such", "follow", "act", "why", "ask", "men", "change", "went", "light", "kind",
    "off", "need", "house", "picture", "try", "us", "again", "animal", "point", "mother",
    "world", "near", "build", "self", "earth", "father", "head", "stand", "own", "page",
    "should", "country", "found", "answer", "school", "grow", "study", "still", "learn",
    "plant", "cover", "food", "sun", "four", "between", "state", "keep", "eye", "never",
    "last", "let", "thought", "city", "tree", "cross", "farm", "hard", "start", "might",
    "story", "saw", "far", "sea", "draw", "left", "late", "run", "don't", "while", "press",
    "close", "night", "real", "life", "few", "north", "open", "seem", "together", "next",
    "white", "children", "begin", "got", "walk", "example", "ease", "paper", "group",
    "always", "music", "those", "both", "mark", "often", "letter", "until", "mile", "river",
    "car", "feet", "care", "second", "book", "carry", "took", "science", "eat", "room",
    "friend", "began", "idea", "fish", "mountain", "stop", "once", "base", "hear", "horse",
    "cut", "sure", "watch", "color", "face", "wood", "main", "enough", "plain", "girl",
    "usual", "young", "ready", "above", "ever", "red", "list", "though", "feel", "talk",
    "bird", "soon", "body", "dog", "family", "direct", "pose", "leave", "song", "measure",
    "door", "product", "black", "short", "numeral", "class", "wind", "question", "happen",
    "complete", "ship", "area", "half", "rock", "order", "fire", "south", "problem", "piece",
    "told", "knew", "pass", "since", "top", "whole", "king", "space", "heard", "best", "hour",
    "better", "true", "during", "hundred", "five", "remember", "step", "early", "hold",
    "west", "ground", "interest", "reach", "fast", "verb", "sing", "listen", "six", "table",
    "travel", "less", "morning", "ten", "simple", "several", "vowel", "toward", "war", "lay",
    "against", "pattern", "slow", "center", "love", "person", "money", "serve", "appear",
    "road", "map", "rain", "rule", "govern", "pull", "cold", "notice", "voice", "unit",
    "power", "town", "fine", "certain", "fly", "fall", "lead", "cry", "dark", "machine",
    "note", "wait", "plan", "figure", "star", "box", "noun", "field", "rest", "correct",
    "able", "pound", "done", "beauty", "drive", "stood", "contain", "front", "teach", "week",
    "final", "gave", "green", "oh", "quick", "develop", "ocean", "warm", "free", "minute",
    "strong", "special", "mind", "behind", "clear", "tail", "produce", "fact", "street",
    "inch", "multiply", "nothing", "course", "stay", "wheel", "full", "force", "blue",
    "object", "decide", "surface", "deep", "moon", "island", "foot", "system", "busy", "test",
    "record", "boat", "common", "gold", "possible", "plane", "stead", "dry", "wonder",
    "laugh", "thousand", "ago", "ran", "check", "game", "shape", "equate", "hot", "miss",
    "brought", "heat", "snow", "tire", "bring", "yes", "distant", "fill", "east", "paint",
    "language", "among", "tokenizer", "metro", "scheduler", "passengers", "platform",
    "extraordinarily", "reconsideration", "misunderstanding", "infrastructure"};

std::string generated_prose(size_t bytes) {
  std::mt19937 rng(1234);
  const size_t n_words = std::size(kWords);
  std::vector<double> weights(n_words);
  for (size_t i = 0; i < n_words; ++i) weights[i] = 1.0 / static_cast<double>(i + 1);
  std::discrete_distribution<size_t> zipf(weights.begin(), weights.end());
  std::uniform_int_distribution<int> pct(0, 99);
  std::string text;
  bool sentence_start = true;
  while (text.size() < bytes) {
    std::string w = kWords[zipf(rng)];
    if (sentence_start) w[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(w[0])));
    text += w;
    sentence_start = false;
    const int r = pct(rng);
    if (r < 7) {
      text += ". ";
      sentence_start = true;
    } else if (r < 12) {
      text += ", ";
    } else if (r < 13) {
      text += " " + std::to_string(pct(rng) * 37) + " ";
    } else if (r < 14) {
      text += ".\n\n";
      sentence_start = true;
    } else {
      text += " ";
    }
  }
  return text;
}

std::string bench_text() {
  if (const char* path = std::getenv("METRO_BENCH_TEXT")) {
    std::ifstream f(path, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    if (!ss.str().empty()) return ss.str();
  }
  return generated_prose(4 << 20);
}

// Relative to the repository root, where `make bench` runs; METRO_MODEL overrides.
std::string model_path() {
  if (const char* env = std::getenv("METRO_MODEL")) return env;
  return "models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

std::optional<metro::tokenizer::Tokenizer> load(benchmark::State& state, size_t cache_entries) {
  auto f = metro::gguf::File::open(model_path());
  if (!f.ok()) {
    state.SkipWithError("default model missing (run from the repository root, or set METRO_MODEL)");
    return std::nullopt;
  }
  metro::tokenizer::TokenizerOptions opt;
  opt.word_cache_entries = cache_entries;
  auto t = metro::tokenizer::Tokenizer::from_gguf(*f, opt);
  if (!t.ok()) {
    state.SkipWithError(t.status().message().c_str());
    return std::nullopt;
  }
  return *t;
}

void report(benchmark::State& state, size_t bytes, size_t tokens) {
  state.counters["MB/s"] = benchmark::Counter(static_cast<double>(state.iterations() * bytes) / 1e6,
                                              benchmark::Counter::kIsRate);
  state.counters["bytes/token"] = static_cast<double>(bytes) / static_cast<double>(tokens);
}

void encode_bench(benchmark::State& state, size_t cache_entries) {
  const std::string text = bench_text();
  auto tok = load(state, cache_entries);
  if (!tok) return;
  size_t n_tokens = 0;
  for (auto _ : state) {
    auto ids = tok->encode(text, false, false);
    n_tokens = ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  report(state, text.size(), n_tokens);
}

void BM_TokenizerEncodeProse(benchmark::State& state) { encode_bench(state, 32768); }
void BM_TokenizerEncodeProseNoCache(benchmark::State& state) { encode_bench(state, 0); }

void BM_TokenizerDecodeProse(benchmark::State& state) {
  const std::string text = bench_text();
  auto tok = load(state, 32768);
  if (!tok) return;
  const auto ids = tok->encode(text, false, false);
  for (auto _ : state) {
    std::string out = tok->decode(ids);
    benchmark::DoNotOptimize(out.data());
  }
  report(state, text.size(), ids.size());
}

BENCHMARK(BM_TokenizerEncodeProse)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TokenizerEncodeProseNoCache)->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK(BM_TokenizerDecodeProse)->Unit(benchmark::kMillisecond);

}  // namespace
