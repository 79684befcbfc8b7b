#include "cli/cache_flags.h"

#include <cstdio>

#include "cache/embedder.h"
#include "cli/common.h"
#include "engine/engine.h"

namespace metro::cli {

void add_cache_flags(CLI::App& app, CacheFlags& f) {
  app.add_flag("--semantic-cache", f.on,
               "answer requests that opt in (\"metro\": {\"semantic_cache\": true}) from earlier answers to "
               "requests of the same meaning (needs --cache-embed-model)");
  app.add_option("--cache-embed-model", f.embed_model,
                 "encoder GGUF (e.g. all-MiniLM-L6-v2 written by `metro convert`) that embeds requests for the "
                 "semantic cache");
  app.add_option("--cache-threshold", f.cfg.threshold, "least cosine similarity of a semantic cache hit")
      ->capture_default_str();
  app.add_option("--cache-max-error", f.cfg.max_error,
                 "target share of wrong semantic cache hits; thresholds rise while verification measures more")
      ->capture_default_str();
  app.add_option("--cache-verify-share", f.cfg.verify_share,
                 "share of semantic cache hits also computed and compared with the cached answer")
      ->capture_default_str();
  app.add_option("--cache-max-entries", f.cfg.max_entries, "semantic cache entries kept (least recently used go)")
      ->capture_default_str();
  app.add_option("--cache-ttl", f.cfg.ttl_s, "seconds a semantic cache entry is answered")->capture_default_str();
}

Status check_cache_flags(const CacheFlags& f) {
  if (!f.on) {
    if (!f.embed_model.empty()) return invalid_argument("--cache-embed-model needs --semantic-cache");
    return {};
  }
  if (f.embed_model.empty()) {
    // The served model's own pooled hidden state does not tell different questions apart
    // (docs/status.md measures it): a cache keyed on it would answer wrongly.
    return invalid_argument(
        "--semantic-cache needs --cache-embed-model FILE: an encoder such as all-MiniLM-L6-v2 "
        "(`make model-minilm`, then `metro convert models/all-MiniLM-L6-v2 minilm.gguf`)");
  }
  cache::SemanticCacheConfig c = f.cfg;
  c.dim = 1;
  return cache::validate(c);
}

Status build_semantic_cache(const CacheFlags& f, std::shared_ptr<ThreadPool> pool, bool allow_repack,
                            server::ServerConfig& sc) {
  if (!f.on) return {};
  METRO_RETURN_IF_ERROR(check_cache_flags(f));
  METRO_ASSIGN_OR_RETURN(LoadedModel lm, load_model(f.embed_model, allow_repack, "cpu", std::chrono::seconds(0), false));
  if (!lm.model->hparams().encoder) {
    return invalid_argument("--cache-embed-model: '" + f.embed_model + "' is a " + lm.model->hparams().architecture +
                            " model, not an encoder (bert)");
  }
  engine::EngineConfig ec;
  ec.pool = std::move(pool);
  ec.prefix_cache = false;
  ec.ctx_total = 4096;
  METRO_ASSIGN_OR_RETURN(std::unique_ptr<engine::Engine> eng, engine::Engine::create(lm.model, *lm.tokenizer, ec));
  auto embedder = std::make_shared<cache::Embedder>(std::shared_ptr<engine::Engine>(std::move(eng)));
  cache::SemanticCacheConfig c = f.cfg;
  c.dim = embedder->dim();
  sc.semantic_cache = std::make_shared<cache::SemanticCache>(c);
  sc.cache_embedder = std::move(embedder);
  std::printf("metro serve: semantic cache on: embeddings from %s (%d dimensions) | threshold %.3f | target error %.3f "
              "| verify %.0f%% of hits | %zu entries, ttl %.0f s\n",
              f.embed_model.c_str(), c.dim, c.threshold, c.max_error, c.verify_share * 100.0, c.max_entries, c.ttl_s);
  std::fflush(stdout);
  return {};
}

}  // namespace metro::cli
