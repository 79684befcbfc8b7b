// Matching generated tokens against a grammar, and the mask of the tokens that may come next.
//
// A matcher holds the set of parse stacks the text so far allows (a pushdown automaton run
// on every alternative at once). A stack is a linked list of grammar positions: the element
// to match next, then what follows when its alternative ends. Stacks are interned, so equal
// stacks are one node and a repetition that returns to the same place in the grammar makes
// no new node: the set stays as small as the grammar's ambiguity at that point.
//
// The mask of allowed next tokens walks the vocabulary's byte trie, pruning every subtree
// whose prefix no stack accepts. It is computed in parts. What a stack allows depends on
// its top few elements until they are all matched and the stack pops into the rest below
// them; so a walk with the stack cut below its top gives the tokens allowed whatever lies
// beneath and the trie nodes where the cut stack ran out. Below each such node the real
// stack's rest takes over, and is split the same way, from that node. The parts are cached
// per compiled grammar by (trie node, positions above the cut), shared at every depth of
// nesting and by every request, so a new stack set mostly combines parts already known.
// The cut is one element deep where that pops at few nodes, deeper where it pops at many
// (a loop's element ends after every byte of it). Whole masks are cached too, by the
// structure of the stack set: in a JSON string, each token after the first finds its mask
// there.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"

namespace metro::tokenizer {
class Tokenizer;
}

namespace metro::grammar {

// The vocabulary as a trie over token bytes, tokens listed in preorder (a subtree's tokens
// are contiguous). Control tokens and empty pieces are left out; end-of-generation tokens are
// kept apart (allowed exactly when the text is complete).
class TokenTrie {
 public:
  struct Node {
    uint32_t first_child = 0;
    uint32_t n_children = 0;
    uint32_t tokens_begin = 0;  // this node's own tokens: [tokens_begin, tokens_end)
    uint32_t tokens_end = 0;
    uint8_t byte = 0;
  };

  static std::shared_ptr<const TokenTrie> build(const tokenizer::Tokenizer& tok);
  // From explicit pieces (tests): id i has bytes pieces[i]; `eog` ids end generation.
  static std::shared_ptr<const TokenTrie> from_pieces(const std::vector<std::string>& pieces,
                                                       const std::vector<int32_t>& eog);

  // A set of byte values, bit b of word b / 64.
  using ByteSet = std::array<uint64_t, 4>;

  int32_t n_vocab() const { return n_vocab_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  // The bytes on the edges below node n (its subtree without n's own edge), and the end of
  // its subtree's tokens: they are tokens()[nodes()[n].tokens_begin, subtree_end(n)).
  const ByteSet& bytes_below(uint32_t n) const { return below_[n]; }
  uint32_t subtree_end(uint32_t n) const { return subtree_end_[n]; }
  const std::vector<int32_t>& eog() const { return eog_; }
  std::string_view piece(int32_t id) const;

 private:
  void build_from(std::vector<std::pair<std::string, int32_t>> entries);
  int32_t n_vocab_ = 0;
  std::vector<Node> nodes_;  // nodes_[0] is the root
  std::vector<ByteSet> below_;
  std::vector<uint32_t> subtree_end_;
  std::vector<int32_t> tokens_;
  std::vector<int32_t> eog_;
  std::vector<std::string> pieces_;
};

struct StackNode {
  uint32_t pos = 0;               // an element of Grammar::elements()
  const StackNode* next = nullptr;  // null: the bottom (the root's alternative ends here)
  // The expansion that last visited it (a per-thread counter): a node reached again by
  // another path in the same expansion is not expanded twice, so shared sub-rules cost
  // once however many alternatives lead to them. Nodes belong to one matcher (and its
  // copies), used by one thread at a time.
  mutable uint32_t mark = 0;
};

// Interned stack nodes (equal (pos, next) pairs are one node).
class NodeArena {
 public:
  const StackNode* intern(uint32_t pos, const StackNode* next);
  void clear();
  size_t size() const { return nodes_.size(); }

 private:
  struct Key {
    uint32_t pos;
    const StackNode* next;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.next) * 0x9E3779B97F4A7C15ull + k.pos;
    }
  };
  std::deque<StackNode> nodes_;
  std::unordered_map<Key, const StackNode*, KeyHash> index_;
};

// Bit i: token i allowed.
using TokenMask = std::vector<uint64_t>;

inline bool mask_has(std::span<const uint64_t> m, int32_t id) {
  return (m[static_cast<size_t>(id) >> 6] >> (static_cast<unsigned>(id) & 63)) & 1u;
}

// A validated grammar bound to a vocabulary, with its shared mask cache. Thread-safe.
class CompiledGrammar {
 public:
  static Expected<std::shared_ptr<const CompiledGrammar>> compile(Grammar g, std::shared_ptr<const TokenTrie> trie,
                                                                 std::string description = {});

  const Grammar& grammar() const { return g_; }
  const TokenTrie& trie() const { return *trie_; }
  const std::string& description() const { return description_; }

  // The cached mask for a stack-set key, or null.
  std::shared_ptr<const TokenMask> find_mask(const std::vector<uint32_t>& key) const;
  void store_mask(const std::vector<uint32_t>& key, std::shared_ptr<const TokenMask> mask) const;

  // What a stack cut below its top few positions allows below a trie node (the root for a
  // whole token), whatever lies below the cut: the tokens it allows outright (as a mask
  // where they are many, else listed), and the trie nodes (with children) after whose bytes
  // the cut stack may have run out, where the tokens below depend on the stack's rest.
  // Where it runs out at too many nodes (more than kMaxPops, or a large share of those it
  // reaches: a loop's element ends after each of its bytes) the split does not pay: the
  // part is `broad`, without the rest, and the stack is cut deeper or walked whole.
  struct TopMask {
    TokenMask bits;
    std::vector<int32_t> ids;
    std::vector<uint32_t> pops;
    bool broad = false;
  };
  static constexpr size_t kMaxPops = 256;
  // Keyed by the trie node, then the positions above the cut, top first.
  std::shared_ptr<const TopMask> find_top(const std::vector<uint32_t>& key) const;
  void store_top(const std::vector<uint32_t>& key, std::shared_ptr<const TopMask> top) const;

  struct CacheStats {
    uint64_t hits = 0, misses = 0;
    size_t entries = 0;
    size_t tops = 0;  // (trie node, positions above the cut) parts cached
    size_t top_bytes = 0;
  };
  CacheStats cache_stats() const;

  static constexpr size_t kMaxCachedMasks = 512;
  // Parts are few in most grammars, and small but at the root; past this many bytes of them
  // the table starts over.
  static constexpr size_t kMaxTopBytes = size_t{2} << 20;

 private:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenTrie> trie, std::string description)
      : g_(std::move(g)), trie_(std::move(trie)), description_(std::move(description)) {}

  Grammar g_;
  std::shared_ptr<const TokenTrie> trie_;
  std::string description_;

  struct KeyHash {
    size_t operator()(const std::vector<uint32_t>& k) const;
  };
  mutable std::mutex mu_;
  mutable std::list<std::vector<uint32_t>> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const TokenMask> mask;
    std::list<std::vector<uint32_t>>::iterator at;
  };
  mutable std::unordered_map<std::vector<uint32_t>, Entry, KeyHash> cache_;
  mutable std::unordered_map<std::vector<uint32_t>, std::shared_ptr<const TopMask>, KeyHash> tops_;
  mutable size_t top_bytes_ = 0;
  mutable uint64_t hits_ = 0, misses_ = 0;
};

// One generation's place in a grammar. Not thread-safe; copyable (n > 1 choices fork it).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> g);
  Matcher(const Matcher& other);
  Matcher& operator=(const Matcher&) = delete;

  // Advances by a token's bytes. False (and the state unchanged) when the grammar does not
  // allow them; an end-of-generation token is accepted when the text is complete.
  bool accept_token(int32_t id);
  bool accept_bytes(std::string_view bytes);
  // The text so far is a complete sentence of the grammar.
  bool is_accepting() const { return accepting_; }
  // Some byte may still follow.
  bool can_continue() const { return !ready_.empty(); }
  // The tokens allowed next (end-of-generation tokens when complete), n_vocab bits.
  void fill_mask(TokenMask& out);
  // Whether `id` is allowed next (without computing the whole mask).
  bool allows(int32_t id) const;

  const CompiledGrammar& compiled() const { return *g_; }
  // Stack nodes made so far (shared with copies), for tests and bounds.
  size_t n_nodes() const { return arena_->size(); }
  // Stacks alive now (the parses the text so far has).
  size_t n_stacks() const { return ready_.size(); }
  // Bound on the stacks alive at once; a grammar more ambiguous than this fails the match.
  static constexpr size_t kMaxStacks = 1024;

 private:
  void key(std::vector<uint32_t>& out) const;
  std::shared_ptr<const TokenMask> compute_mask();
  // The part of stack `s` below trie node `node`, cut as deep as it takes (at most
  // kMaxCut positions); *rest: what lies below the cut (null: nothing, the part is exact).
  std::shared_ptr<const CompiledGrammar::TopMask> top_mask(uint32_t node, const StackNode* s, const StackNode** rest);
  static constexpr int kMaxCut = 4;
  // Parts computed per mask before the rest of it is walked whole (bounds the work of a
  // grammar whose parts do not pay).
  static constexpr int kSplitBudget = 1024;
  // Below the root, only nodes with at least this many tokens under them are split.
  static constexpr uint32_t kSplitTokens = 256;
  int split_budget_ = 0;
  // Adds the tokens below trie node `node` that the ready stacks `stacks` allow to `m`.
  void mask_below(uint32_t node, const std::vector<const StackNode*>& stacks, TokenMask& m);
  // Runs of tokens()[first, second) a walk allows.
  using Spans = std::vector<std::pair<uint32_t, uint32_t>>;
  // Walks the trie below `node` from the stack set `set`, listing the tokens whose bytes
  // the set accepts in `spans`; with `pops`, also lists the nodes where the set's bottom is
  // reached (a cut stack ran out) and the walk may go on below, and gives up (false) past
  // CompiledGrammar::kMaxPops of them or where they are a large share of the nodes reached.
  bool walk(uint32_t node, int32_t set, Spans& spans, std::vector<uint32_t>* pops);

  std::shared_ptr<const CompiledGrammar> g_;
  std::shared_ptr<NodeArena> arena_;  // shared with forks (nodes are immutable)
  std::vector<const StackNode*> ready_;
  bool accepting_ = false;
  std::vector<uint32_t> key_;

  // The stack sets a mask walk meets, interned, with their byte transitions filled in as
  // they are taken: inside a JSON string almost every trie node leads back to the same set,
  // so the walk is a table lookup per node. Kept across steps (cleared when it grows past
  // its bound); its nodes live in scratch_.
  struct SetAutomaton {
    struct Hash {
      size_t operator()(const std::vector<const StackNode*>& v) const;
    };
    std::vector<std::vector<const StackNode*>> sets;
    std::vector<std::array<int32_t, 256>> next;  // (id << 1 | accept), kDead, or kUnknown
    // The bytes some stack of the set matches next: every other byte is dead from it.
    std::vector<TokenTrie::ByteSet> first;
    // The bytes that lead from a set back to itself without reaching the bottom, once
    // asked for (self_loop).
    std::vector<TokenTrie::ByteSet> loop;
    std::vector<uint8_t> loop_known;
    std::unordered_map<std::vector<const StackNode*>, int32_t, Hash> ids;
    void clear() {
      sets.clear();
      next.clear();
      first.clear();
      loop.clear();
      loop_known.clear();
      ids.clear();
    }
  };
  static constexpr int32_t kUnknown = -1;
  static constexpr int32_t kDead = -2;  // no stack, not accepting
  int32_t set_id(std::vector<const StackNode*> set);
  int32_t transition(int32_t id, uint8_t b);
  const TokenTrie::ByteSet& self_loop(int32_t id);
  NodeArena scratch_;
  SetAutomaton dfa_;
};

}  // namespace metro::grammar
