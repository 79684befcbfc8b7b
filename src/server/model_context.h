// The loaded model as the HTTP layer sees it: the engine that runs it and what preparing a
// request needs (tokenizer, chat template, context size). Built once by the loader on a
// background thread, then shared read-only by every request.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "engine/engine.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace metro::server {

struct ModelContext {
  std::string name;  // the id in /v1/models and in responses
  std::shared_ptr<engine::Engine> engine;
  tokenizer::Tokenizer tokenizer;
  std::optional<tokenizer::ChatTemplate> chat_template;
  int64_t created_unix_s = 0;  // when it was loaded (/v1/models `created`)
  double load_seconds = 0.0;

  ModelContext(std::string name_, std::shared_ptr<engine::Engine> engine_, tokenizer::Tokenizer tokenizer_,
               std::optional<tokenizer::ChatTemplate> chat_template_, const RequestLimits& limits)
      : name(std::move(name_)),
        engine(std::move(engine_)),
        tokenizer(std::move(tokenizer_)),
        chat_template(std::move(chat_template_)) {
    prompt.tokenizer = &tokenizer;
    prompt.chat_template = chat_template ? &*chat_template : nullptr;
    prompt.model_name = name;
    prompt.n_ctx = engine->n_ctx();
    prompt.n_embd = static_cast<int>(engine->model().hparams().n_embd);
    prompt.limits = limits;
  }
  ModelContext(const ModelContext&) = delete;
  ModelContext& operator=(const ModelContext&) = delete;

  PromptContext prompt;  // points into this object
};

}  // namespace metro::server
