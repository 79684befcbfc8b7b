// HttpSession and the semantic response cache (cache/semantic_cache.h): the lookup of an
// opted-in request on its prep thread, a hit answered with the cached answer's events (the
// formatter streams them like the engine's), and after a computed answer completes, the
// answer kept or compared with the hit it was drawn to verify.
#include <algorithm>

#include "base/clock.h"
#include "base/log.h"
#include "cache/embedder.h"
#include "engine/request_stream.h"
#include "server/http_session.h"
#include "server/semantic_key.h"

namespace metro::server {

namespace {

double now_s() { return static_cast<double>(now_ns()) * 1e-9; }

// What verification compares: the answer's text without its surrounding whitespace.
std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\n' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

std::optional<ApiError> HttpSession::look_up_semantic_cache(Endpoint endpoint, const nlohmann::json& body,
                                                            PreparedCall& pc, const CallContext& call, Prepared& p) {
  auto asks = asks_semantic_cache(body);
  if (!asks.ok()) return asks.error();
  cache::SemanticCache* sc = core_.config().semantic_cache.get();
  if (!*asks || sc == nullptr || !core_.config().cache_embedder) return std::nullopt;
  // With API keys, only tenants whose key line says cache=on.
  const ApiKeys& keys = core_.config().api_keys;
  if (keys.enabled()) {
    const TenantSettings* ts = keys.tenant_settings(call.tenant);
    if (ts == nullptr || !ts->semantic_cache) return std::nullopt;
  }
  std::string why;
  std::optional<SemanticKey> key = semantic_key(endpoint, body, pc, call.tenant, p.model->id(), &why);
  if (!key) return std::nullopt;
  auto emb = core_.config().cache_embedder->embed(key->text);
  if (!emb.ok()) {
    METRO_LOG_WARN("semantic cache: %s", emb.status().message().c_str());
    return std::nullopt;
  }
  auto st = std::make_shared<CacheState>();
  st->ns = key->ns;
  st->embedding = std::move(*emb);
  st->found = sc->lookup(st->ns, st->embedding, now_s());
  if (st->found.hit && !st->found.verify) pc.spec.cache_similarity = st->found.similarity;
  p.cache = std::move(st);
  return std::nullopt;
}

void HttpSession::serve_from_cache() {
  Call& call = *call_;
  call.from_cache = true;
  const cache::CachedResponse& r = *call.cache->found.response;
  auto stream = std::make_shared<engine::RequestStream>(0, r.events.size() + 4);
  const int64_t t = now_ns();
  for (engine::Event e : r.events) {
    e.time_ns = t;
    e.usage.queue_ns = 0;
    if (e.kind == engine::Event::Kind::kDone) {
      stream->push_final(std::move(e));
    } else {
      stream->push(std::move(e));
    }
  }
  call.handles = {engine::Handle{0, std::move(stream)}};
  preparing_ = false;
  start_call(std::move(*call.spec));
}

void HttpSession::settle_semantic_cache(bool completed) {
  Call& call = *call_;
  cache::SemanticCache* sc = core_.config().semantic_cache.get();
  if (!call.cache || call.from_cache || sc == nullptr || !completed) return;
  if (call.formatter && call.formatter->failure()) return;
  std::string text;
  bool finished_well = false;
  for (const engine::Event& e : call.cache_events) {
    if (e.kind == engine::Event::Kind::kDelta) text += e.text;
    if (e.kind == engine::Event::Kind::kFinish) {
      finished_well = e.reason == engine::FinishReason::kStop || e.reason == engine::FinishReason::kLength;
    }
  }
  if (!finished_well) return;
  const cache::Lookup& found = call.cache->found;
  if (found.hit) {  // drawn to verify a hit
    const bool agreed = trimmed(text) == trimmed(found.response->text);
    sc->report(found.entry, found.similarity, agreed);
    if (agreed) return;  // the entry stays; a disagreement keeps this answer too
  }
  auto r = std::make_shared<cache::CachedResponse>();
  r->events = std::move(call.cache_events);
  r->text = std::move(text);
  // An insert into a large index takes milliseconds: on a prep thread, not this
  // connection's strand. When the prep queue is full the answer is simply not kept.
  std::shared_ptr<cache::SemanticCache> keep = core_.config().semantic_cache;
  const size_t bytes = r->bytes();
  core_.prep_pool().submit(request_tenant_, bytes, [keep, st = call.cache, r = std::move(r)]() mutable {
    keep->insert(st->ns, st->embedding, std::move(r), now_s());
  });
}

}  // namespace metro::server
