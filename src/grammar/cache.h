// Compiled grammars of one vocabulary, by the text that defines them (a canonical schema,
// a choice list): compiled once, shared by every request that asks for the same, and kept
// in a bounded LRU. Thread-safe; the prep threads that parse requests use it, so no grammar
// is compiled on the engine thread.
#pragma once

#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "base/status.h"
#include "grammar/matcher.h"

namespace metro::tokenizer {
class Tokenizer;
}

namespace metro::grammar {

class GrammarCache {
 public:
  // `tok` must outlive the cache (the served model owns both).
  explicit GrammarCache(const tokenizer::Tokenizer& tok, size_t capacity = 64);

  // The compiled grammar for `key`; `make` builds it on a miss (its error is returned, and
  // not cached).
  Expected<std::shared_ptr<const CompiledGrammar>> get(const std::string& key,
                                                      const std::function<Expected<Grammar>()>& make);
  // The vocabulary's trie (built on first use).
  std::shared_ptr<const TokenTrie> trie();

  struct Stats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0;
  };
  Stats stats() const;

 private:
  const tokenizer::Tokenizer& tok_;
  const size_t capacity_;
  mutable std::mutex mu_;
  std::shared_ptr<const TokenTrie> trie_;
  std::list<std::string> lru_;
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, Entry> entries_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace metro::grammar
