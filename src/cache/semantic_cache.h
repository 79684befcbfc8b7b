// The semantic response cache: answers of earlier requests found again by the meaning of a
// new request's text, within one namespace (tenant x model variant x sampling parameters x
// system prompt: everything but the text must match exactly, so it is never shared across
// tenants).
//
// Each namespace has its own approximate nearest-neighbour index (hnswlib, inner product
// over L2-normalized embeddings, so the score is the cosine similarity). A lookup hits the
// nearest live entry whose similarity reaches the effective threshold: the larger of the
// global one and the entry's own. Both thresholds learn from verification: a sampled share
// of hits is computed anyway and the two answers compared by the caller, who reports back.
//  - An entry whose verified hit disagreed refuses similarities up to that one from then on
//    (its threshold rises past it); a second disagreement drops the entry.
//  - The global threshold rises while the measured wrong-hit rate's upper confidence bound
//    is above the target (--cache-max-error), and falls back toward the configured value
//    once it is well below.
// Bounded: at most max_entries entries (least recently used evicted first) and a TTL.
// Thread-safe (one mutex: a lookup is a fraction of a millisecond).
#pragma once

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "base/metrics.h"
#include "base/status.h"
#include "engine/request.h"

namespace metro::cache {

struct SemanticCacheConfig {
  int dim = 0;                    // embedding width
  double threshold = 0.90;        // least cosine similarity of a hit (--cache-threshold)
  double max_error = 0.01;        // target share of wrong hits (--cache-max-error)
  double verify_share = 0.10;     // share of hits computed anyway and compared
  size_t max_entries = 100000;    // (--cache-max-entries)
  double ttl_s = 3600.0;          // entries older than this are not answered (--cache-ttl)
  uint64_t seed = 0;              // of the verification draw (0: from the clock)
};
Status validate(const SemanticCacheConfig& c);

// What a hit replays: the engine events of the answer (deltas, finish, done with usage).
struct CachedResponse {
  std::vector<engine::Event> events;
  std::string text;  // the answer's text, what verification compares
  size_t bytes() const;
};

struct Lookup {
  bool hit = false;
  double similarity = 0.0;  // of the nearest live entry (0 when the namespace is empty)
  uint64_t entry = 0;       // the entry hit (verification reports name it)
  bool verify = false;      // compute the request anyway and report whether it agrees
  std::shared_ptr<const CachedResponse> response;
};

struct SemanticCacheStats {
  uint64_t hits = 0, misses = 0, inserts = 0, evictions = 0, expired = 0;
  uint64_t verified_agree = 0, verified_disagree = 0, dropped = 0;
  size_t entries = 0;
  size_t bytes = 0;
  double threshold = 0.0;  // the global threshold now
};

class SemanticCache {
 public:
  explicit SemanticCache(const SemanticCacheConfig& cfg);
  ~SemanticCache();
  SemanticCache(const SemanticCache&) = delete;
  SemanticCache& operator=(const SemanticCache&) = delete;

  const SemanticCacheConfig& config() const { return cfg_; }
  // `embedding` has config().dim values, L2-normalized. now_s: any monotonic clock in seconds.
  Lookup lookup(uint64_t ns, std::span<const float> embedding, double now_s);
  // Keeps an answer. An entry of the same namespace within 0.999 similarity is replaced.
  void insert(uint64_t ns, std::span<const float> embedding, std::shared_ptr<const CachedResponse> response,
              double now_s);
  // A verified hit: whether the computed answer agreed with the cached one.
  void report(uint64_t entry, double similarity, bool agreed);
  SemanticCacheStats stats() const;
  // metro_semantic_cache_* on /metrics.
  void export_metrics(metrics::Exposition& e) const;

 private:
  struct Namespace;
  struct Entry {
    uint64_t id = 0;
    uint64_t ns = 0;
    size_t label = 0;  // in its namespace's index
    double created_s = 0.0;
    double threshold = 0.0;  // its own; 0: only the global one
    int agreed = 0, disagreed = 0;
    std::shared_ptr<const CachedResponse> response;
    std::list<uint64_t>::iterator lru;
  };

  void remove_locked(uint64_t id);
  void adjust_global_locked();
  size_t entry_bytes(const Entry& e) const;

  const SemanticCacheConfig cfg_;
  mutable std::mutex mu_;
  std::map<uint64_t, std::unique_ptr<Namespace>> spaces_;
  std::map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;  // most recently used first
  uint64_t next_id_ = 1;
  double threshold_;
  // Verified hits since the global threshold last moved.
  uint64_t window_agree_ = 0, window_disagree_ = 0;
  SemanticCacheStats stats_;
  std::mt19937_64 rng_;
};

// A namespace key: the 64-bit hash of its parts, each length-prefixed so that no two
// different part lists hash alike by concatenation.
uint64_t namespace_key(std::initializer_list<std::string_view> parts);

}  // namespace metro::cache
