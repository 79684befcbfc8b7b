#include "router/kv_index.h"

#include <optional>
#include <string>

#include "base/msgpack_reader.h"

namespace metro::router {

namespace {

constexpr uint64_t kRoot = 0x6d6574726f6b7631ull;  // the chain's start

uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t chain(uint64_t prev, std::span<const int32_t> block) {
  uint64_t h = mix(prev ^ 0x9e3779b97f4a7c15ull);
  for (int32_t t : block) h = mix(h ^ static_cast<uint32_t>(t));
  return h;
}

// One event, either layout: its tag and fields by name.
struct Event {
  std::string type;
  const MsgpackValue* hashes = nullptr;
  const MsgpackValue* parent = nullptr;
  const MsgpackValue* tokens = nullptr;
  const MsgpackValue* block_size = nullptr;
};

std::optional<Event> read_event(const MsgpackValue& v) {
  Event e;
  if (v.is_map()) {
    const MsgpackValue* t = v.get("type");
    if (t == nullptr || !t->is_str()) return std::nullopt;
    e.type = t->s;
    e.hashes = v.get("block_hashes");
    e.parent = v.get("parent_block_hash");
    e.tokens = v.get("token_ids");
    e.block_size = v.get("block_size");
  } else if (v.is_array() && !v.items.empty() && v.items[0].is_str()) {
    // [tag, block_hashes, parent_block_hash, token_ids, block_size, ...] / [tag, block_hashes, ...]
    e.type = v.items[0].s;
    auto at = [&](size_t k) { return k < v.items.size() ? &v.items[k] : nullptr; };
    e.hashes = at(1);
    if (e.type == "BlockStored") {
      e.parent = at(2);
      e.tokens = at(3);
      e.block_size = at(4);
    }
  } else {
    return std::nullopt;
  }
  return e;
}

// An array of block hashes: unsigned integers (or non-negative signed ones).
bool read_hashes(const MsgpackValue* v, std::vector<uint64_t>* out) {
  if (v == nullptr || !v->is_array()) return false;
  for (const MsgpackValue& h : v->items) {
    const auto u = h.as_uint();
    if (!u) return false;
    out->push_back(*u);
  }
  return true;
}

}  // namespace

KvIndex::KvIndex(size_t n_replicas, size_t max_blocks_per_replica)
    : max_blocks_(max_blocks_per_replica), reps_(n_replicas) {}

std::vector<uint64_t> KvIndex::block_keys(std::span<const int32_t> tokens, int block_size) {
  std::vector<uint64_t> keys;
  if (block_size <= 0) return keys;
  const auto bs = static_cast<size_t>(block_size);
  uint64_t prev = kRoot;
  for (size_t b = 0; (b + 1) * bs <= tokens.size(); ++b) {
    prev = chain(prev, tokens.subspan(b * bs, bs));
    keys.push_back(prev);
  }
  return keys;
}

void KvIndex::remove_locked(Replica& rep, uint64_t hash) {
  const auto it = rep.key_of.find(hash);
  if (it == rep.key_of.end()) return;
  const auto k = rep.keys.find(it->second);
  if (k != rep.keys.end() && --k->second == 0) rep.keys.erase(k);
  rep.key_of.erase(it);
}

Status KvIndex::apply(int r, std::string_view payload) {
  if (r < 0 || static_cast<size_t>(r) >= reps_.size()) return invalid_argument("kv events: no such replica");
  METRO_ASSIGN_OR_RETURN(MsgpackValue batch, parse_msgpack(payload));
  const MsgpackValue* events = batch.is_map() ? batch.get("events")
                               : batch.is_array() && batch.items.size() >= 2 ? &batch.items[1]
                                                                              : nullptr;
  if (events == nullptr || !events->is_array()) return invalid_argument("kv events: not an EventBatch");
  std::lock_guard lock(mu_);
  Replica& rep = reps_[static_cast<size_t>(r)];
  for (const MsgpackValue& ev : events->items) {
    const std::optional<Event> e = read_event(ev);
    if (!e) {
      ++skipped_;
      continue;
    }
    if (e->type == "AllBlocksCleared") {
      rep = Replica{};
      continue;
    }
    std::vector<uint64_t> hashes;
    if (!read_hashes(e->hashes, &hashes)) {
      ++skipped_;
      continue;
    }
    if (e->type == "BlockRemoved") {
      for (uint64_t h : hashes) remove_locked(rep, h);
      continue;
    }
    if (e->type != "BlockStored") {
      ++skipped_;
      continue;
    }
    const std::optional<int64_t> bs = e->block_size != nullptr ? e->block_size->as_int() : std::nullopt;
    if (!bs || *bs <= 0 || *bs > 65536 || e->tokens == nullptr || !e->tokens->is_array() ||
        e->tokens->items.size() != hashes.size() * static_cast<size_t>(*bs)) {
      ++skipped_;
      continue;
    }
    std::vector<int32_t> tokens;
    tokens.reserve(e->tokens->items.size());
    bool ok = true;
    for (const MsgpackValue& t : e->tokens->items) {
      const std::optional<int64_t> id = t.as_int();
      ok = ok && id && *id >= INT32_MIN && *id <= INT32_MAX;
      tokens.push_back(id ? static_cast<int32_t>(*id) : 0);
    }
    uint64_t prev = kRoot;
    if (ok && e->parent != nullptr && !e->parent->is_nil()) {
      const std::optional<uint64_t> parent = e->parent->as_uint();
      const auto it = parent ? rep.key_of.find(*parent) : rep.key_of.end();
      ok = it != rep.key_of.end();
      if (ok) prev = it->second;
    }
    if (!ok) {
      ++skipped_;
      continue;
    }
    block_size_ = static_cast<int>(*bs);
    for (size_t b = 0; b < hashes.size(); ++b) {
      prev = chain(prev, std::span<const int32_t>(tokens).subspan(b * static_cast<size_t>(*bs), static_cast<size_t>(*bs)));
      if (rep.key_of.contains(hashes[b])) continue;  // stored again: already counted
      if (rep.key_of.size() >= max_blocks_) {
        ++skipped_;
        break;
      }
      rep.key_of.emplace(hashes[b], prev);
      ++rep.keys[prev];
    }
  }
  return {};
}

void KvIndex::clear(int r) {
  std::lock_guard lock(mu_);
  if (r >= 0 && static_cast<size_t>(r) < reps_.size()) reps_[static_cast<size_t>(r)] = Replica{};
}

int KvIndex::block_size() const {
  std::lock_guard lock(mu_);
  return block_size_;
}

size_t KvIndex::matched(int r, std::span<const int32_t> tokens) const {
  std::lock_guard lock(mu_);
  if (r < 0 || static_cast<size_t>(r) >= reps_.size() || block_size_ <= 0) return 0;
  const Replica& rep = reps_[static_cast<size_t>(r)];
  size_t n = 0;
  for (uint64_t k : block_keys(tokens, block_size_)) {
    if (!rep.keys.contains(k)) break;
    ++n;
  }
  return n;
}

size_t KvIndex::blocks(int r) const {
  std::lock_guard lock(mu_);
  return r >= 0 && static_cast<size_t>(r) < reps_.size() ? reps_[static_cast<size_t>(r)].key_of.size() : 0;
}

uint64_t KvIndex::skipped() const {
  std::lock_guard lock(mu_);
  return skipped_;
}

}  // namespace metro::router
