#include "grammar/cache.h"

namespace metro::grammar {

GrammarCache::GrammarCache(const tokenizer::Tokenizer& tok, size_t capacity)
    : tok_(tok), capacity_(capacity == 0 ? 1 : capacity) {}

std::shared_ptr<const TokenTrie> GrammarCache::trie() {
  std::lock_guard lock(mu_);
  if (!trie_) trie_ = TokenTrie::build(tok_);
  return trie_;
}

Expected<std::shared_ptr<const CompiledGrammar>> GrammarCache::get(const std::string& key,
                                                                  const std::function<Expected<Grammar>()>& make) {
  {
    std::lock_guard lock(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      ++hits_;
      lru_.splice(lru_.begin(), lru_, it->second.at);
      return it->second.grammar;
    }
    ++misses_;
  }
  // Compiled outside the lock: two requests for a new grammar at once compile it twice,
  // and the second copy is dropped.
  METRO_ASSIGN_OR_RETURN(Grammar g, make());
  METRO_ASSIGN_OR_RETURN(std::shared_ptr<const CompiledGrammar> c, CompiledGrammar::compile(std::move(g), trie(), key));
  std::lock_guard lock(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.grammar;
  lru_.push_front(key);
  entries_.emplace(key, Entry{c, lru_.begin()});
  while (entries_.size() > capacity_) {
    entries_.erase(lru_.back());
    lru_.pop_back();
  }
  return c;
}

GrammarCache::Stats GrammarCache::stats() const {
  std::lock_guard lock(mu_);
  return Stats{hits_, misses_, entries_.size()};
}

}  // namespace metro::grammar
