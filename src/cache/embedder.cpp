#include "cache/embedder.h"

#include <algorithm>

#include "base/clock.h"
#include "base/check.h"
#include "engine/request_stream.h"
#include "model/model.h"

namespace metro::cache {

std::vector<int32_t> embedding_input(const tokenizer::Tokenizer& tok, std::string_view text, int n_ctx) {
  std::vector<int32_t> ids = tok.encode(text, /*add_special=*/true, /*parse_special=*/false);
  const size_t max_len = static_cast<size_t>(std::max(1, n_ctx));
  if (ids.size() > max_len) {
    const int32_t last = ids.back();
    ids.resize(max_len - 1);
    ids.push_back(last);
  }
  return ids;
}

Embedder::Embedder(std::shared_ptr<engine::Engine> engine) : engine_(std::move(engine)) {
  METRO_CHECK(engine_ != nullptr);
  dim_ = static_cast<int>(engine_->model().hparams().n_embd);
}

Expected<std::vector<float>> Embedder::embed(std::string_view text, std::chrono::milliseconds timeout) const {
  engine::Request r;
  r.kind = engine::RequestKind::kEmbed;
  r.prompt = embedding_input(engine_->tokenizer(), text, engine_->n_ctx());
  if (r.prompt.empty()) return invalid_argument("nothing to embed");
  METRO_ASSIGN_OR_RETURN(engine::Handle h, engine_->submit(std::move(r)));
  const int64_t deadline = now_ns() + static_cast<int64_t>(timeout.count()) * 1000000;
  std::vector<float> out;
  for (;;) {
    const int64_t left_ms = (deadline - now_ns()) / 1000000;
    if (left_ms <= 0) {
      engine_->abort(h.id);
      return unavailable("the embedding model did not answer in time");
    }
    auto e = h.stream->pop(std::chrono::milliseconds(left_ms));
    if (!e) continue;
    if (e->kind == engine::Event::Kind::kEmbedding) {
      out = std::move(e->embedding);
    } else if (e->kind == engine::Event::Kind::kFinish &&
               (e->reason == engine::FinishReason::kError || e->reason == engine::FinishReason::kAbort)) {
      return unavailable("the embedding model failed: " + e->message);
    } else if (e->kind == engine::Event::Kind::kDone) {
      break;
    }
  }
  if (static_cast<int>(out.size()) != dim_) return internal_error("the embedding model returned no vector");
  return out;
}

}  // namespace metro::cache
