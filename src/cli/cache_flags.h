// Semantic cache flags of `metro serve` (cache/semantic_cache.h, docs/server.md):
//
//   --semantic-cache             answers found again by meaning; opt-in per request
//                                (`"metro": {"semantic_cache": true}`) and, with an API key
//                                file, per tenant (`cache=on`)
//   --cache-embed-model FILE     the encoder GGUF that embeds requests (e.g. all-MiniLM-L6-v2
//                                from `metro convert`); required with --semantic-cache
//   --cache-threshold X          least cosine similarity of a hit (default 0.90)
//   --cache-max-error X          target share of wrong hits the thresholds adapt to (0.01)
//   --cache-verify-share X       share of hits also computed and compared (0.10)
//   --cache-max-entries N        entries kept, least recently used evicted (100000)
//   --cache-ttl SECONDS          an entry's life (3600)
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "base/status.h"
#include "base/thread_pool.h"
#include "cache/semantic_cache.h"
#include "server/server_config.h"

namespace metro::cli {

struct CacheFlags {
  bool on = false;
  std::string embed_model;
  cache::SemanticCacheConfig cfg;
};
void add_cache_flags(CLI::App& app, CacheFlags& flags);
// The flags' values alone (to refuse bad flags before loading anything).
Status check_cache_flags(const CacheFlags& flags);
// Loads the embedding model onto `pool` and sets sc.semantic_cache and sc.cache_embedder
// (nothing when the cache is off).
Status build_semantic_cache(const CacheFlags& flags, std::shared_ptr<ThreadPool> pool, bool allow_repack,
                            server::ServerConfig& sc);

}  // namespace metro::cli
