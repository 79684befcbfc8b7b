#include "grammar/matcher.h"

#include <algorithm>

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

CompiledGrammar::CacheStats CompiledGrammar::cache_stats() const {
  std::lock_guard lock(mu_);
  return CacheStats{hits_, misses_, cache_.size()};
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
  dfa_.loop.push_back(TokenTrie::ByteSet{});
  dfa_.loop_known.push_back(0);
  dfa_.ids.emplace(std::move(set), id);
  return id;
}

const TokenTrie::ByteSet& Matcher::self_loop(int32_t id) {
  const auto i = static_cast<size_t>(id);
  if (!dfa_.loop_known[i]) {
    TokenTrie::ByteSet loop{};
    for (int b = 0; b < 256; ++b) {
      const int32_t t = transition(id, static_cast<uint8_t>(b));
      if (t != kDead && (t >> 1) == id) loop[static_cast<size_t>(b >> 6)] |= uint64_t{1} << (b & 63);
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

std::shared_ptr<const TokenMask> Matcher::compute_mask() {
  const TokenTrie& t = g_->trie();
  auto mask = std::make_shared<TokenMask>((static_cast<size_t>(t.n_vocab()) + 63) / 64, 0);
  TokenMask& m = *mask;
  // Bounded memory: the automaton and its nodes start over when they have grown large.
  if (dfa_.sets.size() > 2000 || scratch_.size() > 1'000'000) {
    dfa_.clear();
    scratch_.clear();
  }
  // Depth-first over the trie, each frame holding the stack set after its node's bytes.
  struct Frame {
    uint32_t node;
    uint32_t next_child;
    int32_t set;
  };
  std::vector<Frame> path{{0, 0, set_id(ready_)}};
  const auto& nodes = t.nodes();
  const auto& toks = t.tokens();
  // Allows the tokens tokens()[from, to).
  auto allow = [&](uint32_t from, uint32_t to) {
    for (uint32_t i = from; i < to; ++i) {
      const auto id = static_cast<uint32_t>(toks[i]);
      m[id >> 6] |= uint64_t{1} << (id & 63);
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
    const int32_t tr = transition(f.set, nodes[child].byte);
    if (tr == kDead) continue;
    // The token's bytes are all consumed: allowed (accepting or not: stacks remain).
    allow(nodes[child].tokens_begin, nodes[child].tokens_end);
    const int32_t next_set = tr >> 1;
    if (nodes[child].n_children > 0 && !dfa_.sets[static_cast<size_t>(next_set)].empty()) {
      // A large subtree whose every byte leads the set back to itself (the inside of a
      // string, most often) has every token allowed: its tokens are marked without walking
      // it. The same tokens as the walk: each of its nodes would be reached in this set.
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
  }
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
