#include "engine/engine_test_util.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "support/test_util.h"

namespace metro::testing {

std::vector<Generation> collect_choices(const engine::Handle& h, int n) {
  std::vector<Generation> g(static_cast<size_t>(n));
  for (;;) {
    auto e = h.stream->pop(std::chrono::milliseconds(120000));
    if (!e) {
      ADD_FAILURE() << "request " << h.id << " stalled";
      return g;
    }
    if (e->kind == engine::Event::Kind::kDone) {
      for (auto& c : g) c.usage = e->usage;
      return g;
    }
    Generation& c = g.at(static_cast<size_t>(e->index));
    switch (e->kind) {
      case engine::Event::Kind::kDelta:
        c.text += e->text;
        for (const auto& t : e->tokens) c.tokens.push_back(t.id);
        break;
      case engine::Event::Kind::kFinish: c.reason = e->reason; break;
      case engine::Event::Kind::kEmbedding: c.embedding = e->embedding; break;
      case engine::Event::Kind::kDone: break;
    }
  }
}

Generation collect(const engine::Handle& h) { return collect_choices(h, 1)[0]; }

const SharedModel& default_model() {
  static const SharedModel shared = [] {
    SharedModel s;
    auto m = model::Model::load(default_model_path());
    if (!m.ok()) return s;
    auto t = tokenizer::Tokenizer::from_gguf((*m)->file());
    if (!t.ok()) return s;
    s.model = std::move(*m);
    s.tokenizer = std::make_shared<tokenizer::Tokenizer>(std::move(*t));
    return s;
  }();
  return shared;
}

engine::Request greedy_request(std::vector<int32_t> prompt, int max_tokens) {
  engine::Request r;
  r.prompt = std::move(prompt);
  r.stop.max_tokens = max_tokens;
  r.sampling.temperature = 0.0f;
  return r;
}

bool sanitized() { return std::getenv("METRO_SANITIZED") != nullptr; }

}  // namespace metro::testing
