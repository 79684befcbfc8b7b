#include "cache/semantic_cache.h"

#include <hnswlib/hnswlib.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/clock.h"
#include "base/hash.h"
#include "base/log.h"

namespace metro::cache {

namespace {

constexpr size_t kInitialCapacity = 256;
constexpr size_t kNeighbours = 4;          // nearest entries a lookup weighs
constexpr size_t kIndexM = 16;             // hnswlib graph degree
constexpr size_t kIndexEfBuild = 100;
constexpr size_t kIndexEfSearch = 64;
constexpr double kReplaceSimilarity = 0.999;  // an insert this close replaces the entry
constexpr double kEntryMargin = 0.01;         // a wrong hit lifts its entry this far above
constexpr int kDropAfterDisagreements = 2;
constexpr uint64_t kMinVerifiedToMove = 20;   // verified hits before the global threshold moves
constexpr double kThresholdStep = 0.005;
constexpr double kMaxThreshold = 0.995;

// The 95% Wilson upper bound of a rate of k in n.
double wilson_upper(uint64_t k, uint64_t n) {
  if (n == 0) return 1.0;
  const double z = 1.96, nn = static_cast<double>(n), p = static_cast<double>(k) / nn;
  const double c = p + z * z / (2 * nn), r = z * std::sqrt(p * (1 - p) / nn + z * z / (4 * nn * nn));
  return std::min(1.0, (c + r) / (1 + z * z / nn));
}

}  // namespace

struct SemanticCache::Namespace {
  explicit Namespace(int dim) : space(static_cast<size_t>(dim)) {
    index = std::make_unique<hnswlib::HierarchicalNSW<float>>(&space, kInitialCapacity, kIndexM, kIndexEfBuild);
    index->setEf(kIndexEfSearch);
  }
  hnswlib::InnerProductSpace space;
  std::unique_ptr<hnswlib::HierarchicalNSW<float>> index;
  std::vector<uint64_t> entry_of;   // label -> entry id (0: free)
  std::vector<size_t> free_labels;  // deleted points, reused by the next inserts
  size_t live = 0;
};

Status validate(const SemanticCacheConfig& c) {
  if (c.dim <= 0 || c.dim > 65536) return invalid_argument("the cache's embedding width is out of range");
  if (!(c.threshold > 0.0 && c.threshold < 1.0)) return invalid_argument("--cache-threshold must be in (0, 1)");
  if (!(c.max_error > 0.0 && c.max_error < 1.0)) return invalid_argument("--cache-max-error must be in (0, 1)");
  if (!(c.verify_share >= 0.0 && c.verify_share <= 1.0)) return invalid_argument("--cache-verify-share must be in [0, 1]");
  if (c.max_entries < 1 || c.max_entries > (size_t{1} << 26)) return invalid_argument("--cache-max-entries out of range");
  if (!(c.ttl_s > 0.0)) return invalid_argument("--cache-ttl must be positive");
  return {};
}

size_t CachedResponse::bytes() const {
  size_t n = sizeof(*this) + text.size();
  for (const engine::Event& e : events) {
    n += sizeof(e) + e.text.size() + e.message.size() + e.tokens.size() * sizeof(engine::TokenInfo);
  }
  return n;
}

uint64_t namespace_key(std::initializer_list<std::string_view> parts) {
  uint64_t h = 0x73656d616e746963ull;
  for (std::string_view p : parts) h = hash_combine(hash_combine(h, p.size()), hash_string(p));
  return h;
}

SemanticCache::SemanticCache(const SemanticCacheConfig& cfg)
    : cfg_(cfg), threshold_(cfg.threshold), rng_(cfg.seed != 0 ? cfg.seed : static_cast<uint64_t>(now_ns())) {}

SemanticCache::~SemanticCache() = default;

size_t SemanticCache::entry_bytes(const Entry& e) const {
  // The vector and its graph links in the index, the entry, the answer.
  return static_cast<size_t>(cfg_.dim) * sizeof(float) + kIndexM * 2 * sizeof(uint32_t) + sizeof(Entry) +
         e.response->bytes();
}

void SemanticCache::remove_locked(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  Namespace& ns = *spaces_.at(e.ns);
  try {
    ns.index->markDelete(e.label);
  } catch (const std::exception& ex) {
    METRO_LOG_WARN("semantic cache: %s", ex.what());
  }
  ns.entry_of[e.label] = 0;
  ns.free_labels.push_back(e.label);
  --ns.live;
  stats_.bytes -= std::min(stats_.bytes, entry_bytes(e));
  lru_.erase(e.lru);
  entries_.erase(it);
}

Lookup SemanticCache::lookup(uint64_t ns_key, std::span<const float> embedding, double now_s) {
  Lookup out;
  std::lock_guard lock(mu_);
  auto sit = spaces_.find(ns_key);
  if (sit == spaces_.end() || sit->second->live == 0 || static_cast<int>(embedding.size()) != cfg_.dim) {
    ++stats_.misses;
    return out;
  }
  Namespace& ns = *sit->second;
  std::priority_queue<std::pair<float, hnswlib::labeltype>> found;
  try {
    found = ns.index->searchKnn(embedding.data(), std::min(kNeighbours, ns.live));
  } catch (const std::exception& ex) {
    METRO_LOG_WARN("semantic cache: %s", ex.what());
    ++stats_.misses;
    return out;
  }
  // Nearest first (the queue pops the farthest first).
  std::vector<std::pair<float, hnswlib::labeltype>> near;
  while (!found.empty()) {
    near.push_back(found.top());
    found.pop();
  }
  std::reverse(near.begin(), near.end());
  std::vector<uint64_t> expired;
  for (const auto& [dist, label] : near) {
    if (label >= ns.entry_of.size() || ns.entry_of[label] == 0) continue;
    const uint64_t id = ns.entry_of[label];
    Entry& e = entries_.at(id);
    if (now_s - e.created_s > cfg_.ttl_s) {
      expired.push_back(id);
      continue;
    }
    const double sim = 1.0 - static_cast<double>(dist);  // hnswlib's inner-product distance
    out.similarity = std::max(out.similarity, sim);
    if (sim < std::max(threshold_, e.threshold)) continue;
    out.hit = true;
    out.similarity = sim;
    out.entry = id;
    out.response = e.response;
    out.verify = std::uniform_real_distribution<double>(0.0, 1.0)(rng_) < cfg_.verify_share;
    lru_.splice(lru_.begin(), lru_, e.lru);
    break;
  }
  for (uint64_t id : expired) {
    remove_locked(id);
    ++stats_.expired;
  }
  ++(out.hit ? stats_.hits : stats_.misses);
  return out;
}

void SemanticCache::insert(uint64_t ns_key, std::span<const float> embedding,
                           std::shared_ptr<const CachedResponse> response, double now_s) {
  if (static_cast<int>(embedding.size()) != cfg_.dim || !response) return;
  std::lock_guard lock(mu_);
  auto& slot = spaces_[ns_key];
  if (!slot) slot = std::make_unique<Namespace>(cfg_.dim);
  Namespace& ns = *slot;
  // The same question asked again: the new answer replaces the old entry.
  if (ns.live > 0) {
    try {
      auto found = ns.index->searchKnn(embedding.data(), 1);
      if (!found.empty() && 1.0 - static_cast<double>(found.top().first) >= kReplaceSimilarity) {
        const size_t label = found.top().second;
        if (label < ns.entry_of.size() && ns.entry_of[label] != 0) remove_locked(ns.entry_of[label]);
      }
    } catch (const std::exception& ex) {
      METRO_LOG_WARN("semantic cache: %s", ex.what());
    }
  }
  while (entries_.size() >= cfg_.max_entries && !lru_.empty()) {
    remove_locked(lru_.back());
    ++stats_.evictions;
  }
  size_t label;
  if (!ns.free_labels.empty()) {
    label = ns.free_labels.back();
    ns.free_labels.pop_back();
  } else {
    label = ns.entry_of.size();
    if (label >= ns.index->max_elements_) {
      try {
        ns.index->resizeIndex(ns.index->max_elements_ * 2);
      } catch (const std::exception& ex) {
        METRO_LOG_WARN("semantic cache: %s; answer not kept", ex.what());
        return;
      }
    }
    ns.entry_of.push_back(0);
  }
  try {
    ns.index->addPoint(embedding.data(), label);  // a freed label's point is replaced in place
  } catch (const std::exception& ex) {
    METRO_LOG_WARN("semantic cache: %s; answer not kept", ex.what());
    ns.free_labels.push_back(label);
    return;
  }
  const uint64_t id = next_id_++;
  Entry e;
  e.id = id;
  e.ns = ns_key;
  e.label = label;
  e.created_s = now_s;
  e.response = std::move(response);
  lru_.push_front(id);
  e.lru = lru_.begin();
  stats_.bytes += entry_bytes(e);
  entries_.emplace(id, std::move(e));
  ns.entry_of[label] = id;
  ++ns.live;
  ++stats_.inserts;
}

void SemanticCache::report(uint64_t id, double similarity, bool agreed) {
  std::lock_guard lock(mu_);
  ++(agreed ? stats_.verified_agree : stats_.verified_disagree);
  ++(agreed ? window_agree_ : window_disagree_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    Entry& e = it->second;
    if (agreed) {
      ++e.agreed;
    } else {
      e.threshold = std::max(e.threshold, std::min(1.0, similarity + kEntryMargin));
      if (++e.disagreed >= kDropAfterDisagreements) {
        remove_locked(id);
        ++stats_.dropped;
      }
    }
  }
  adjust_global_locked();
}

void SemanticCache::adjust_global_locked() {
  const uint64_t n = window_agree_ + window_disagree_;
  if (n < kMinVerifiedToMove) return;
  const double upper = wilson_upper(window_disagree_, n);
  const double rate = static_cast<double>(window_disagree_) / static_cast<double>(n);
  if (upper > cfg_.max_error && window_disagree_ > 0) {
    threshold_ = std::min(kMaxThreshold, threshold_ + kThresholdStep);
  } else if (rate == 0.0 && upper <= cfg_.max_error && threshold_ > cfg_.threshold) {
    threshold_ = std::max(cfg_.threshold, threshold_ - kThresholdStep);
  } else {
    return;
  }
  window_agree_ = window_disagree_ = 0;
}

SemanticCacheStats SemanticCache::stats() const {
  std::lock_guard lock(mu_);
  SemanticCacheStats s = stats_;
  s.entries = entries_.size();
  s.threshold = threshold_;
  return s;
}

void SemanticCache::export_metrics(metrics::Exposition& e) const {
  const SemanticCacheStats s = stats();
  e.counter("metro_semantic_cache_hits_total", "Requests answered from the semantic cache", "",
            static_cast<double>(s.hits));
  e.counter("metro_semantic_cache_misses_total", "Opted-in requests the semantic cache had no answer for", "",
            static_cast<double>(s.misses));
  e.counter("metro_semantic_cache_inserts_total", "Answers kept in the semantic cache", "",
            static_cast<double>(s.inserts));
  e.counter("metro_semantic_cache_evictions_total", "Entries evicted for room (least recently used)", "",
            static_cast<double>(s.evictions));
  e.counter("metro_semantic_cache_expired_total", "Entries dropped past their time to live", "",
            static_cast<double>(s.expired));
  e.counter("metro_semantic_cache_verified_total", "Hits also computed and compared, by result", "result=\"agree\"",
            static_cast<double>(s.verified_agree));
  e.counter("metro_semantic_cache_verified_total", "Hits also computed and compared, by result",
            "result=\"disagree\"", static_cast<double>(s.verified_disagree));
  e.counter("metro_semantic_cache_dropped_total", "Entries dropped after verified hits disagreed", "",
            static_cast<double>(s.dropped));
  e.gauge("metro_semantic_cache_entries", "Entries in the semantic cache", "", static_cast<double>(s.entries));
  e.gauge("metro_semantic_cache_bytes", "Bytes held by the semantic cache (index and answers)", "",
          static_cast<double>(s.bytes));
  e.gauge("metro_semantic_cache_threshold", "The global similarity threshold of a hit now", "", s.threshold);
}

}  // namespace metro::cache
