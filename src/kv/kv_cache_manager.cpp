#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "base/check.h"
#include "base/hash.h"
#include "kernels/attention.h"

namespace metro::kv {

KvCacheManager::KvCacheManager(const KvCacheConfig& cfg)
    : cfg_(cfg), pool_(cfg.n_blocks, cfg.block_size) {
  if (cfg_.prefix_cache) {
    hint_ = std::make_shared<PrefixHint>(cfg_.model_variant, cfg_.block_size);
    pool_.set_hint(hint_.get());
  }
}

uint64_t KvCacheManager::root_hash_of(uint64_t variant, uint64_t scope) {
  const uint64_t global = mix64(variant ^ 0x6b7663616368ull);
  return scope == 0 ? global : hash_combine(global, mix64(scope));
}
uint64_t KvCacheManager::root_hash() const { return root_hash_of(cfg_.model_variant); }

uint64_t KvCacheManager::chain_hash(uint64_t variant, uint64_t parent,
                                    std::span<const int32_t> tokens) {
  return hash_combine(parent, hash_bytes(tokens.data(), tokens.size_bytes(), variant));
}

uint64_t KvCacheManager::block_hash(uint64_t parent, std::span<const int32_t> tokens) const {
  return chain_hash(cfg_.model_variant, parent, tokens);
}

int KvCacheManager::computed_blocks(SeqId seq, std::span<const int32_t> tokens, uint64_t scope) {
  SeqBlocks& s = seqs_[seq];
  METRO_CHECK(s.blocks.empty() && s.chain.empty());
  s.root = scope == 0 ? 0 : root_hash_of(cfg_.model_variant, scope);
  if (!cfg_.prefix_cache || tokens.empty()) return 0;
  const int bs = cfg_.block_size;
  const int usable = static_cast<int>(tokens.size()) - 1;  // keep the last token to compute
  queries_ += tokens.size();
  int n = 0;
  while (n + bs <= usable) {
    auto blk = tokens.subspan(static_cast<size_t>(n), static_cast<size_t>(bs));
    const uint64_t parent = last_hash(s);
    const uint64_t h = block_hash(parent, blk);
    auto hit = pool_.lookup(h, parent, blk);
    if (hit) {
      pool_.ref(*hit);
    } else {
      // Memory evicted it: the spill tier may still hold it.
      if (spill_ == nullptr || !spill_->worth_restoring(h, n)) break;
      hit = pool_.allocate();
      if (!hit) break;
      if (!spill_->restore(h, parent, blk, *hit)) {
        pool_.unref(*hit);
        break;
      }
      pool_.set_hash(*hit, h, parent, blk);
      restored_ += static_cast<uint64_t>(bs);
    }
    s.blocks.push_back(*hit);
    s.chain.push_back(h);
    n += bs;
  }
  s.n_tokens = n;
  hits_ += static_cast<uint64_t>(n);
  return n;
}

void KvCacheManager::set_spill(KvSpillTier* tier) {
  spill_ = tier;
  if (tier == nullptr || !cfg_.prefix_cache) {
    pool_.set_on_evict(nullptr);
    return;
  }
  pool_.set_on_evict([tier](BlockId b, uint64_t hash, uint64_t parent, std::span<const int32_t> tokens) {
    tier->on_evict(b, hash, parent, tokens);
  });
}

int32_t KvCacheManager::blocks_needed(SeqId seq, int n_new, int n_lookahead) const {
  METRO_CHECK(n_new >= 0 && n_lookahead >= 0);
  auto it = seqs_.find(seq);
  const int have_tokens = it == seqs_.end() ? 0 : it->second.n_tokens;
  const int have_blocks = it == seqs_.end() ? 0 : static_cast<int>(it->second.blocks.size());
  const int bs = cfg_.block_size;
  const int need = (have_tokens + n_new + n_lookahead + bs - 1) / bs;
  return need > have_blocks ? need - have_blocks : 0;
}

std::optional<std::span<const BlockId>> KvCacheManager::allocate(SeqId seq, int n_new, int n_lookahead) {
  METRO_CHECK(n_new >= 0 && n_lookahead >= 0);
  const int32_t need = blocks_needed(seq, n_new, n_lookahead);
  if (need > pool_.n_free()) return std::nullopt;
  SeqBlocks& s = seqs_[seq];
  for (int32_t i = 0; i < need; ++i) {
    auto b = pool_.allocate();
    METRO_CHECK(b.has_value());
    s.blocks.push_back(*b);
  }
  s.n_tokens += n_new + n_lookahead;
  return std::span<const BlockId>(s.blocks);
}

void KvCacheManager::commit(SeqId seq, std::span<const int32_t> tokens, int n_committed) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqBlocks& s = it->second;
  METRO_CHECK(n_committed >= 0 && static_cast<size_t>(n_committed) <= tokens.size());
  METRO_CHECK_MSG(n_committed <= s.n_tokens, "commit past the slots the sequence reserved");
  if (cfg_.prefix_cache && s.publish) {
    const size_t bs = static_cast<size_t>(cfg_.block_size);
    // Every full block among the first n_committed tokens lies inside the reserved slots, so
    // it is in the table, and not released: release follows publication below, and a block
    // released unpublished (publishing stopped) ends the chain for good.
    const size_t full = static_cast<size_t>(n_committed) / bs;
    while (s.chain.size() < full && s.blocks[s.chain.size()] != kNoBlock) {
      const size_t i = s.chain.size();
      auto blk = tokens.subspan(i * bs, bs);
      const uint64_t parent = last_hash(s);
      const uint64_t h = block_hash(parent, blk);
      pool_.set_hash(s.blocks[i], h, parent, blk);
      s.chain.push_back(h);
    }
  }
  release_behind(s, n_committed);
}

void KvCacheManager::release_behind(SeqBlocks& s, int next) {
  if (cfg_.window <= 0) return;
  const int64_t first_read = kernels::window_first_read(next, cfg_.window, cfg_.window_read_align);
  const size_t dead = static_cast<size_t>(first_read / cfg_.block_size);  // blocks wholly before it
  // The last block always stays: a truncate or a fork may end inside it.
  const size_t limit = std::min(dead, s.blocks.empty() ? size_t{0} : s.blocks.size() - 1);
  while (s.n_released < limit) {
    if (s.chain.size() <= s.n_released) s.publish = false;  // its chain cannot go on past a hole
    pool_.unref(s.blocks[s.n_released]);
    s.blocks[s.n_released++] = kNoBlock;
  }
}

void KvCacheManager::stop_publishing(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it != seqs_.end()) it->second.publish = false;
}

void KvCacheManager::truncate(SeqId seq, int n_tokens) {
  auto it = seqs_.find(seq);
  METRO_CHECK_MSG(it != seqs_.end(), "truncate of an unknown sequence");
  SeqBlocks& s = it->second;
  const int bs = cfg_.block_size;
  METRO_CHECK_MSG(n_tokens >= static_cast<int>(s.chain.size()) * bs,
                  "truncate below the tokens committed to the prefix cache");
  METRO_CHECK_MSG(n_tokens <= s.n_tokens, "truncate past the reserved slots");
  const size_t keep = static_cast<size_t>((n_tokens + bs - 1) / bs);
  if (n_tokens % bs != 0) {
    // The kept partial block gets its slots from n_tokens on overwritten by later tokens.
    const BlockId last = s.blocks[keep - 1];
    METRO_CHECK_MSG(pool_.ref_count(last) == 1 && !pool_.is_cached(last),
                    "truncate into a block shared with another sequence or the prefix cache");
  }
  METRO_CHECK_MSG(keep >= s.n_released, "truncate into the released blocks");
  while (s.blocks.size() > keep) {
    if (s.blocks.back() != kNoBlock) pool_.unref(s.blocks.back());
    s.blocks.pop_back();
  }
  s.n_released = std::min(s.n_released, s.blocks.size());
  s.n_tokens = n_tokens;
}

void KvCacheManager::free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  auto& blocks = it->second.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) {
    if (*b != kNoBlock) pool_.unref(*b);
  }
  seqs_.erase(it);
}

std::optional<std::optional<BlockCopy>> KvCacheManager::fork(SeqId parent, SeqId child, int n_tokens) {
  auto pit = seqs_.find(parent);
  METRO_CHECK(pit != seqs_.end() && !seqs_.count(child));
  const SeqBlocks& p = pit->second;
  const int bs = cfg_.block_size;
  METRO_CHECK(n_tokens >= 0 && n_tokens <= p.n_tokens);
  const int n_full = n_tokens / bs;
  const bool partial = n_tokens % bs != 0;
  std::optional<BlockId> copy_dst;
  if (partial) {
    copy_dst = pool_.allocate();
    if (!copy_dst) return std::nullopt;
  }
  SeqBlocks c;
  for (int i = 0; i < n_full; ++i) {
    const BlockId b = p.blocks[static_cast<size_t>(i)];
    if (b != kNoBlock) pool_.ref(b);  // the child shares what the parent still holds
    c.blocks.push_back(b);
  }
  c.n_released = std::min(p.n_released, static_cast<size_t>(n_full));
  // The child reads from position n_tokens on: none of the blocks it may read can be a hole.
  METRO_CHECK_MSG(cfg_.window <= 0 || static_cast<int64_t>(c.n_released) * bs <=
                                          kernels::window_first_read(n_tokens, cfg_.window, cfg_.window_read_align),
                  "fork behind the window of its parent's released blocks");
  // The shared prefix has the same chained hashes as the parent's at that depth.
  const size_t n_chain = std::min(p.chain.size(), static_cast<size_t>(n_full));
  c.chain.assign(p.chain.begin(), p.chain.begin() + static_cast<long>(n_chain));
  c.root = p.root;  // the child is in its parent's scope
  if (c.n_released > c.chain.size()) c.publish = false;  // a hole before its chain's end
  std::optional<BlockCopy> copy;
  if (partial) {
    c.blocks.push_back(*copy_dst);
    METRO_CHECK_MSG(p.blocks[static_cast<size_t>(n_full)] != kNoBlock, "fork inside a released block");
    copy = BlockCopy{p.blocks[static_cast<size_t>(n_full)], *copy_dst};
  }
  c.n_tokens = n_tokens;
  seqs_.emplace(child, std::move(c));
  return copy;
}

std::span<const BlockId> KvCacheManager::table(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return {};
  return it->second.blocks;
}

int KvCacheManager::n_held(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int>(it->second.blocks.size() - it->second.n_released);
}

int KvCacheManager::n_slots(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.n_tokens;
}

int KvCacheManager::n_committed(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : static_cast<int>(it->second.chain.size()) * cfg_.block_size;
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats s;
  s.blocks_total = pool_.n_blocks();
  s.blocks_used = pool_.n_used();
  s.blocks_cached = pool_.n_cached();
  s.prefix_queries = queries_;
  s.prefix_hits = hits_;
  s.restored_tokens = restored_;
  return s;
}

}  // namespace metro::kv
