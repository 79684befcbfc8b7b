#include "loadgen/prompt_text.h"

#include <array>

namespace metro::loadgen {
namespace {

// Common English words, each one token in SmolLM2's GPT-2-style BPE vocabulary both with its
// leading space and without (the first word of a prompt has none): 340 of 340 checked,
// and N words joined by spaces tokenize to exactly N tokens there. Larger BPE vocabularies
// will mostly hold them whole too; the report's measured prompt tokens tell. Words rather
// than random token ids, so that every tokenizer sees ordinary text and no request needs a
// /tokenize round trip.
constexpr std::array<std::string_view, 340> kWords = {
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "that", "with", "as", "by", "at",
    "from", "his", "her", "it", "an", "were", "are", "which", "this", "be", "has", "had", "also",
    "not", "but", "their", "they", "one", "first", "two", "new", "after", "its", "who", "been",
    "other", "have", "more", "all", "when", "there", "during", "time", "into", "only", "most",
    "some", "would", "over", "city", "where", "school", "year", "years", "later", "three",
    "about", "under", "state", "world", "between", "used", "made", "such", "then", "because",
    "known", "both", "these", "may", "each", "many", "part", "people", "while", "area", "since",
    "them", "before", "well", "life", "found", "team", "season", "through", "out", "being",
    "early", "work", "what", "until", "several", "family", "group", "number", "name", "second",
    "called", "played", "national", "war", "including", "university", "states", "government",
    "public", "house", "high", "music", "film", "game", "series", "line", "water", "light",
    "power", "river", "road", "story", "land", "book", "body", "place", "point", "home", "field",
    "night", "church", "court", "party", "force", "death", "side", "history", "order", "women",
    "age", "club", "person", "region", "building", "service", "report", "language", "center",
    "company", "system", "station", "small", "large", "great", "long", "little", "old", "young",
    "good", "right", "left", "same", "different", "next", "last", "few", "late", "major", "local",
    "real", "full", "open", "best", "better", "certain", "clear", "close", "common", "dark",
    "deep", "easy", "free", "hard", "human", "main", "modern", "natural", "poor", "red", "white",
    "black", "blue", "green", "simple", "single", "special", "strong", "whole", "wide", "make",
    "take", "give", "find", "think", "tell", "show", "leave", "feel", "begin", "keep", "hold",
    "write", "stand", "mean", "run", "move", "live", "sit", "continue", "learn", "change", "lead",
    "understand", "watch", "follow", "stop", "create", "read", "allow", "add", "grow", "offer",
    "remember", "love", "consider", "buy", "wait", "die", "send", "expect", "build", "stay",
    "fall", "cut", "reach", "kill", "suggest", "raise", "pass", "sell", "require", "return",
    "develop", "break", "receive", "agree", "support", "hit", "eat", "cover", "catch", "draw",
    "choose", "day", "week", "month", "summer", "winter", "spring", "money", "food", "car",
    "door", "table", "window", "room", "street", "tree", "horse", "dog", "cat", "bird", "fish",
    "bread", "milk", "paper", "letter", "picture", "song", "word", "page", "voice", "hand",
    "head", "face", "eye", "heart", "mind", "friend", "child", "father", "mother", "brother",
    "king", "doctor", "teacher", "student", "market", "office", "bank", "hospital", "library",
    "museum", "park", "bridge", "forest", "ocean", "sky", "sun", "moon", "star", "rain", "snow",
    "wind", "fire", "stone", "glass", "metal", "wood", "gold", "iron", "plant", "seed", "flower",
    "grass", "apple", "lake", "sea", "coast",
};

}  // namespace

std::span<const std::string_view> prompt_words() { return kWords; }

std::string random_words(int64_t n_words, Rng& rng) {
  std::string out;
  out.reserve(static_cast<size_t>(n_words) * 7);
  for (int64_t i = 0; i < n_words; ++i) {
    if (i > 0) out.push_back(' ');
    out += kWords[rng.below(kWords.size())];
  }
  return out;
}

}  // namespace metro::loadgen
