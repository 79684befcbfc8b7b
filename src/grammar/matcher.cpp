#include "grammar/matcher.h"

#include <algorithm>
#include <bit>

#include "tokenizer/tokenizer.h"

namespace metro::grammar {

// ---------------------------------------------------------------------------------------
// TokenTrie

std::shared_ptr<const TokenTrie> TokenTrie::build(const tokenizer::Tokenizer& tok) {
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  std::vector<int32_t> eog;
  for (int32_t id = 0; id < tok.n_vocab(); ++id) {
    if (tok.is_eog(id)) {
      eog.push_back(id);
      continue;
    }
    if (tok.is_control(id)) continue;
    pieces[static_cast<size_t>(id)] = tok.token_to_piece(id);
  }
  return from_pieces(pieces, eog);
}

std::shared_ptr<const TokenTrie> TokenTrie::from_pieces(const std::vector<std::string>& pieces,
                                                         const std::vector<int32_t>& eog) {
  auto t = std::make_shared<TokenTrie>();
  t->n_vocab_ = static_cast<int32_t>(pieces.size());
  t->eog_ = eog;
  t->pieces_ = pieces;
  std::vector<bool> is_eog(pieces.size(), false);
  for (int32_t id : eog) {
    if (id >= 0 && static_cast<size_t>(id) < pieces.size()) is_eog[static_cast<size_t>(id)] = true;
  }
  std::vector<std::pair<std::string, int32_t>> entries;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!pieces[i].empty() && !is_eog[i]) entries.emplace_back(pieces[i], static_cast<int32_t>(i));
  }
  t->build_from(std::move(entries));
  return t;
}

std::string_view TokenTrie::piece(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= pieces_.size()) return {};
  return pieces_[static_cast<size_t>(id)];
}

void TokenTrie::build_from(std::vector<std::pair<std::string, int32_t>> entries) {
  std::sort(entries.begin(), entries.end());
  nodes_.assign(1, Node{});
  tokens_.clear();
  // Depth-first, children of a node allocated together; tokens in preorder.
  struct Frame {
    size_t lo, hi, depth;
    uint32_t node;
  };
  std::vector<Frame> work{{0, entries.size(), 0, 0}};
  // Preorder needs a node's tokens before its children's: a stack processes a node, then
  // pushes its children in reverse so the first child is next.
  while (!work.empty()) {
    const Frame f = work.back();
    work.pop_back();
    size_t i = f.lo;
    Node& n = nodes_[f.node];
    n.tokens_begin = static_cast<uint32_t>(tokens_.size());
    while (i < f.hi && entries[i].first.size() == f.depth) tokens_.push_back(entries[i++].second);
    nodes_[f.node].tokens_end = static_cast<uint32_t>(tokens_.size());
    std::vector<Frame> kids;
    while (i < f.hi) {
      const auto b = static_cast<uint8_t>(entries[i].first[f.depth]);
      size_t j = i;
      while (j < f.hi && static_cast<uint8_t>(entries[j].first[f.depth]) == b) ++j;
      kids.push_back(Frame{i, j, f.depth + 1, 0});
      i = j;
    }
    const auto first = static_cast<uint32_t>(nodes_.size());
    nodes_[f.node].first_child = first;
    nodes_[f.node].n_children = static_cast<uint32_t>(kids.size());
    for (size_t k = 0; k < kids.size(); ++k) {
      Node child;
      child.byte = static_cast<uint8_t>(entries[kids[k].lo].first[f.depth]);
      nodes_.push_back(child);
      kids[k].node = first + static_cast<uint32_t>(k);
    }
    for (size_t k = kids.size(); k-- > 0;) work.push_back(kids[k]);
  }
  // Children come after their parent in nodes_, so one pass from the end sees every child
  // before its parent; a subtree's tokens end where its last child's do.
  below_.assign(nodes_.size(), ByteSet{});
  subtree_end_.assign(nodes_.size(), 0);
  for (size_t i = nodes_.size(); i-- > 0;) {
    const Node& n = nodes_[i];
    subtree_end_[i] = n.n_children > 0 ? subtree_end_[n.first_child + n.n_children - 1] : n.tokens_end;
    for (uint32_t c = n.first_child; c < n.first_child + n.n_children; ++c) {
      for (int w = 0; w < 4; ++w) below_[i][static_cast<size_t>(w)] |= below_[c][static_cast<size_t>(w)];
      below_[i][nodes_[c].byte >> 6] |= uint64_t{1} << (nodes_[c].byte & 63);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Stacks

const StackNode* NodeArena::intern(uint32_t pos, const StackNode* next) {
  const Key k{pos, next};
  if (auto it = index_.find(k); it != index_.end()) return it->second;
  nodes_.push_back(StackNode{pos, next});
  const StackNode* n = &nodes_.back();
  index_.emplace(k, n);
  return n;
}

void NodeArena::clear() {
  nodes_.clear();
  index_.clear();
}

namespace {

using Kind = Element::Kind;

uint32_t next_epoch() {
  thread_local uint32_t epoch = 0;
  if (++epoch == 0) ++epoch;  // 0 is "never visited"
  return epoch;
}

// Adds the stacks ready to match a byte that `s` stands for (expanding rules at its top,
// popping ended alternatives) to `out`, once each; sets `accept` when the bottom is
// reached. Nodes already visited in this expansion (`epoch`) are skipped.
void expand(const Grammar& g, const StackNode* s, NodeArena& arena, std::vector<const StackNode*>& out,
            bool& accept, uint32_t epoch) {
  if (s == nullptr) {
    accept = true;
    return;
  }
  if (s->mark == epoch) return;
  s->mark = epoch;
  const std::vector<Element>& el = g.elements();
  const Element& e = el[s->pos];
  switch (e.kind) {
    case Kind::kBytes:
      out.push_back(s);
      return;
    case Kind::kEnd:
      expand(g, s->next, arena, out, accept, epoch);
      return;
    case Kind::kRule: {
      // What follows the rule; a rule last in its alternative returns straight to the
      // caller's continuation, so right recursion does not grow the stack.
      const StackNode* cont = el[s->pos + 1].kind == Kind::kEnd ? s->next : arena.intern(s->pos + 1, s->next);
      for (uint32_t start : g.alternatives(e.index)) expand(g, arena.intern(start, cont), arena, out, accept, epoch);
      return;
    }
  }
}

// The stacks after byte b from `in` (ready stacks) into `out`.
void advance(const Grammar& g, const std::vector<const StackNode*>& in, uint8_t b, NodeArena& arena,
             std::vector<const StackNode*>& out, bool& accept) {
  out.clear();
  accept = false;
  const uint32_t epoch = next_epoch();
  const std::vector<Element>& el = g.elements();
  for (const StackNode* s : in) {
    if (!g.byte_set(el[s->pos].index).has(b)) continue;
    const StackNode* after = el[s->pos + 1].kind == Kind::kEnd ? s->next : arena.intern(s->pos + 1, s->next);
    if (after == nullptr) {
      accept = true;
      continue;
    }
    expand(g, after, arena, out, accept, epoch);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// CompiledGrammar

Expected<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::compile(Grammar g,
                                                                         std::shared_ptr<const TokenTrie> trie,
                                                                         std::string description) {
  METRO_RETURN_IF_ERROR(g.validate());
  if (!trie) return invalid_argument("grammar: no vocabulary");
  return std::shared_ptr<const CompiledGrammar>(new CompiledGrammar(std::move(g), std::move(trie), std::move(description)));
}

size_t CompiledGrammar::KeyHash::operator()(const std::vector<uint32_t>& k) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint32_t v : k) h = (h ^ v) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

std::shared_ptr<const TokenMask> CompiledGrammar::find_mask(const std::vector<uint32_t>& key) const {
  std::lock_guard lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second.at);
  return it->second.mask;
}

void CompiledGrammar::store_mask(const std::vector<uint32_t>& key, std::shared_ptr<const TokenMask> mask) const {
  std::lock_guard lock(mu_);
  if (cache_.count(key)) return;
  lru_.push_front(key);
  cache_.emplace(key, Entry{std::move(mask), lru_.begin()});
  while (cache_.size() > kMaxCachedMasks) {
    cache_.erase(lru_.back());
    lru_.pop_back();
  }
}

std::shared_ptr<const CompiledGrammar::TopMask> CompiledGrammar::find_top(const std::vector<uint32_t>& key) const {
  std::lock_guard lock(mu_);
  auto it = tops_.find(key);
  return it == tops_.end() ? nullptr : it->second;
}

void CompiledGrammar::store_top(const std::vector<uint32_t>& key, std::shared_ptr<const TopMask> top) const {
  const size_t bytes = sizeof(TopMask) + 64 + 4 * key.size() + 8 * top->bits.size() + 4 * top->ids.size() +
                       4 * top->pops.size();
  std::lock_guard lock(mu_);
  if (top_bytes_ + bytes > kMaxTopBytes) {
    tops_.clear();
    top_bytes_ = 0;
  }
  if (tops_.emplace(key, std::move(top)).second) top_bytes_ += bytes;
}

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard lock(mu_);
  return CacheStats{hits_, misses_, cache_.size(), tops_.size(), top_bytes_};
}

// ---------------------------------------------------------------------------------------
// Matcher

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> g) : g_(std::move(g)), arena_(std::make_shared<NodeArena>()) {
  const Grammar& gr = g_->grammar();
  const uint32_t epoch = next_epoch();
  for (uint32_t start : gr.alternatives(gr.root())) {
    expand(gr, arena_->intern(start, nullptr), *arena_, ready_, accepting_, epoch);
  }
}

Matcher::Matcher(const Matcher& o) : g_(o.g_), arena_(o.arena_), ready_(o.ready_), accepting_(o.accepting_) {}

bool Matcher::accept_bytes(std::string_view bytes) {
  const Grammar& gr = g_->grammar();
  std::vector<const StackNode*> cur = ready_, next;
  bool acc = accepting_;
  for (char c : bytes) {
    advance(gr, cur, static_cast<uint8_t>(c), *arena_, next, acc);
    if (next.empty() && !acc) return false;
    if (next.size() > kMaxStacks) return false;
    cur.swap(next);
  }
  ready_ = std::move(cur);
  accepting_ = acc;
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const TokenTrie& t = g_->trie();
  if (std::find(t.eog().begin(), t.eog().end(), id) != t.eog().end()) return accepting_;
  const std::string_view p = t.piece(id);
  if (p.empty()) return false;
  return accept_bytes(p);
}

bool Matcher::allows(int32_t id) const {
  Matcher probe(*this);
  return probe.accept_token(id);
}

void Matcher::key(std::vector<uint32_t>& out) const {
  out.clear();
  for (const StackNode* s : ready_) {
    for (const StackNode* n = s; n != nullptr; n = n->next) out.push_back(n->pos);
    out.push_back(UINT32_MAX);
  }
}

size_t Matcher::SetAutomaton::Hash::operator()(const std::vector<const StackNode*>& v) const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const StackNode* n : v) h = (h ^ reinterpret_cast<uintptr_t>(n)) * 0x100000001b3ull;
  return static_cast<size_t>(h);
}

int32_t Matcher::set_id(std::vector<const StackNode*> set) {
  std::sort(set.begin(), set.end());
  if (auto it = dfa_.ids.find(set); it != dfa_.ids.end()) return it->second;
  const auto id = static_cast<int32_t>(dfa_.sets.size());
  dfa_.sets.push_back(set);
  std::array<int32_t, 256> row;
  row.fill(kUnknown);
  dfa_.next.push_back(row);
  TokenTrie::ByteSet first{};
  const std::vector<Element>& el = g_->grammar().elements();
  for (const StackNode* s : set) {
    const ByteSet& b = g_->grammar().byte_set(el[s->pos].index);
    for (size_t w = 0; w < 4; ++w) first[w] |= b.bits[w];
  }
  dfa_.first.push_back(first);
  dfa_.loop.push_back(TokenTrie::ByteSet{});
  dfa_.loop_known.push_back(0);
  dfa_.ids.emplace(std::move(set), id);
  return id;
}

const TokenTrie::ByteSet& Matcher::self_loop(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (!dfa_.loop_known[i]) {
    TokenTrie::ByteSet loop{};
    const TokenTrie::ByteSet first = dfa_.first[i];
    for (unsigned w = 0; w < 4; ++w) {
      for (uint64_t bits = first[w]; bits != 0; bits &= bits - 1) {
        const auto b = static_cast<uint8_t>(w * 64 + static_cast<unsigned>(std::countr_zero(bits)));
        if (transition(id, b) == (id << 1)) loop[w] |= uint64_t{1} << (b & 63u);
      }
    }
    dfa_.loop[i] = loop;  // transition() may have grown the vectors: index again
    dfa_.loop_known[i] = 1;
  }
  return dfa_.loop[i];
}

int32_t Matcher::transition(int32_t id, uint8_t b) {
  int32_t t = dfa_.next[static_cast<size_t>(id)][b];
  if (t != kUnknown) return t;
  std::vector<const StackNode*> out;
  bool acc = false;
  advance(g_->grammar(), dfa_.sets[static_cast<size_t>(id)], b, scratch_, out, acc);
  if (out.empty() && !acc) {
    t = kDead;
  } else {
    t = (set_id(std::move(out)) << 1) | (acc ? 1 : 0);
  }
  dfa_.next[static_cast<size_t>(id)][b] = t;
  return t;
}

// Subtrees with at least this many tokens below their root are checked for the shortcut
// in compute_mask (a set's self-loop costs its 256 transitions the first time).
constexpr uint32_t kWholeSubtreeTokens = 32;

bool Matcher::walk(uint32_t root, int32_t set, Spans& spans, std::vector<uint32_t>* pops) {
  const TokenTrie& t = g_->trie();
  // Depth-first over the trie, each frame holding the stack set after its node's bytes.
  // Children whose byte no stack of the set matches are dead without a transition.
  struct Frame {
    uint32_t node;
    uint32_t next_child;
    int32_t set;
  };
  std::vector<Frame> path{{root, 0, set}};
  size_t reached_here = 0;
  const auto& nodes = t.nodes();
  // Allows the tokens tokens()[from, to), joined to the run before where they follow it.
  auto allow = [&](uint32_t from, uint32_t to) {
    if (from == to) return;
    if (!spans.empty() && spans.back().second == from) {
      spans.back().second = to;
    } else {
      spans.emplace_back(from, to);
    }
  };
  while (!path.empty()) {
    Frame& f = path.back();
    const TokenTrie::Node& n = nodes[f.node];
    if (f.next_child == n.n_children) {
      path.pop_back();
      continue;
    }
    const uint32_t child = n.first_child + f.next_child++;
    const uint8_t b = nodes[child].byte;
    if (((dfa_.first[static_cast<size_t>(f.set)][b >> 6u] >> (b & 63u)) & 1u) == 0) continue;
    const int32_t tr = transition(f.set, b);
    if (tr == kDead) continue;
    // The token's bytes are all consumed: allowed (accepting or not: stacks remain).
    allow(nodes[child].tokens_begin, nodes[child].tokens_end);
    ++reached_here;
    if (nodes[child].n_children == 0) continue;
    if ((tr & 1) != 0 && pops != nullptr) {
      pops->push_back(child);
      // Running out at a large share of the nodes reached (a loop's element, cut below it,
      // ends after every byte) or at very many: the split would not pay.
      const size_t np = pops->size();
      if (np > CompiledGrammar::kMaxPops || (np > 16 && np * 4 > reached_here)) return false;
    }
    const int32_t next_set = tr >> 1;
    if (dfa_.sets[static_cast<size_t>(next_set)].empty()) continue;
    // A large subtree whose every byte leads the set back to itself (the inside of a
    // string, most often) has every token allowed: its tokens are marked without walking
    // it. The same tokens as the walk: each of its nodes would be reached in this set, and
    // none of them reaches the bottom.
    const uint32_t end = t.subtree_end(child);
    if (end - nodes[child].tokens_end >= kWholeSubtreeTokens) {
      const TokenTrie::ByteSet& loop = self_loop(next_set);
      const TokenTrie::ByteSet& below = t.bytes_below(child);
      if ((below[0] & ~loop[0]) == 0 && (below[1] & ~loop[1]) == 0 && (below[2] & ~loop[2]) == 0 &&
          (below[3] & ~loop[3]) == 0) {
        allow(nodes[child].tokens_end, end);
        continue;
      }
    }
    path.push_back(Frame{child, 0, next_set});
  }
  return true;
}

namespace {

// Token ids of the runs of tokens() in `spans` into m.
void mark(const std::vector<int32_t>& toks, const std::vector<std::pair<uint32_t, uint32_t>>& spans, TokenMask& m) {
  for (const auto& [from, to] : spans) {
    for (uint32_t i = from; i < to; ++i) {
      const auto id = static_cast<uint32_t>(toks[i]);
      m[id >> 6] |= uint64_t{1} << (id & 63);
    }
  }
}

// A part with at most this many tokens lists them; one with more keeps a mask, which costs
// about as much to add as this many single bits.
constexpr size_t kListedTokens = 768;

}  // namespace

std::shared_ptr<const CompiledGrammar::TopMask> Matcher::top_mask(uint32_t node, const StackNode* s,
                                                                  const StackNode** rest) {
  const TokenTrie& t = g_->trie();
  std::vector<uint32_t> key{node};
  std::shared_ptr<const CompiledGrammar::TopMask> top;
  const StackNode* below = s;
  for (int depth = 1; depth <= kMaxCut && below != nullptr; ++depth) {
    key.push_back(below->pos);
    below = below->next;
    top = g_->find_top(key);
    if (!top) {
      --split_budget_;
      auto fresh = std::make_shared<CompiledGrammar::TopMask>();
      // The stack cut below its top `depth` positions: reaching its bottom is running out.
      const StackNode* cut = nullptr;
      for (size_t i = key.size(); i-- > 1;) cut = scratch_.intern(key[i], cut);
      Spans spans;
      if (!walk(node, set_id({cut}), spans, &fresh->pops)) {
        fresh->pops.clear();
        fresh->broad = true;
      } else {
        size_t n = 0;
        for (const auto& [from, to] : spans) n += to - from;
        if (n > kListedTokens) {
          fresh->bits.assign((static_cast<size_t>(t.n_vocab()) + 63) / 64, 0);
          mark(t.tokens(), spans, fresh->bits);
        } else {
          fresh->ids.reserve(n);
          for (const auto& [from, to] : spans) {
            for (uint32_t i = from; i < to; ++i) fresh->ids.push_back(t.tokens()[i]);
          }
        }
      }
      g_->store_top(key, fresh);
      top = std::move(fresh);
    }
    if (!top->broad) break;
  }
  *rest = below;
  return top;
}

void Matcher::mask_below(uint32_t node, const std::vector<const StackNode*>& stacks, TokenMask& m) {
  // Each stack's top part, and the trie nodes below which its rest takes over.
  std::vector<const StackNode*> rests;
  std::vector<std::pair<uint32_t, uint32_t>> below;  // (trie node, index in rests)
  std::vector<const StackNode*> whole;                // stacks with broad tops
  // Below a node with few tokens under it, a walk costs less than finding its parts.
  const TokenTrie& t = g_->trie();
  const bool split = node == 0 || (split_budget_ > 0 && t.subtree_end(node) - t.nodes()[node].tokens_end >= kSplitTokens);
  for (const StackNode* s : stacks) {
    if (!split) {
      whole.push_back(s);
      continue;
    }
    const StackNode* rest = nullptr;
    const std::shared_ptr<const CompiledGrammar::TopMask> top = top_mask(node, s, &rest);
    if (top->broad) {
      whole.push_back(s);
      continue;
    }
    if (!top->bits.empty()) {
      for (size_t w = 0; w < m.size(); ++w) m[w] |= top->bits[w];
    }
    for (int32_t id : top->ids) m[static_cast<uint32_t>(id) >> 6] |= uint64_t{1} << (static_cast<uint32_t>(id) & 63);
    // A stack with nothing below the cut ends the text where the cut stack runs out.
    if (top->pops.empty() || rest == nullptr) continue;
    auto r = static_cast<uint32_t>(std::find(rests.begin(), rests.end(), rest) - rests.begin());
    if (r == rests.size()) rests.push_back(rest);
    for (uint32_t n : top->pops) below.emplace_back(n, r);
  }
  if (!whole.empty()) {
    Spans spans;
    walk(node, set_id(whole), spans, nullptr);
    mark(t.tokens(), spans, m);
  }
  if (below.empty()) return;
  std::sort(below.begin(), below.end());
  below.erase(std::unique(below.begin(), below.end()), below.end());
  // The stacks each rest stands for once the part above it has been matched.
  std::vector<std::vector<const StackNode*>> ready(rests.size());
  const Grammar& gr = g_->grammar();
  for (size_t r = 0; r < rests.size(); ++r) {
    bool acc = false;
    expand(gr, rests[r], scratch_, ready[r], acc, next_epoch());
  }
  // Below each node, the rests that take over there, split again from that node.
  std::vector<const StackNode*> set;
  for (size_t i = 0; i < below.size();) {
    const uint32_t at = below[i].first;
    set.clear();
    for (; i < below.size() && below[i].first == at; ++i) {
      const auto& more = ready[below[i].second];
      set.insert(set.end(), more.begin(), more.end());
    }
    std::sort(set.begin(), set.end());
    set.erase(std::unique(set.begin(), set.end()), set.end());
    if (!set.empty()) mask_below(at, set, m);
  }
}

std::shared_ptr<const TokenMask> Matcher::compute_mask() {
  const TokenTrie& t = g_->trie();
  auto mask = std::make_shared<TokenMask>((static_cast<size_t>(t.n_vocab()) + 63) / 64, 0);
  // Bounded memory: the automaton and its nodes start over when they have grown large.
  if (dfa_.sets.size() > 2000 || scratch_.size() > 1'000'000) {
    dfa_.clear();
    scratch_.clear();
  }
  split_budget_ = kSplitBudget;
  mask_below(0, ready_, *mask);
  return mask;
}

void Matcher::fill_mask(TokenMask& out) {
  const TokenTrie& t = g_->trie();
  out.assign((static_cast<size_t>(t.n_vocab()) + 63) / 64, 0);
  if (!ready_.empty()) {
    key(key_);
    std::shared_ptr<const TokenMask> m = g_->find_mask(key_);
    if (!m) {
      m = compute_mask();
      g_->store_mask(key_, m);
    }
    out = *m;
  }
  if (accepting_) {
    for (int32_t id : t.eog()) out[static_cast<size_t>(id) >> 6] |= uint64_t{1} << (static_cast<unsigned>(id) & 63);
  }
}

}  // namespace metro::grammar
