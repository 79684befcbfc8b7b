// The models one process serves: name -> engine, and variants of one name.
//
// Each served model is an engine with what requests need to be prepared for it (its chat
// template) and what the gateway keeps per model (admission control over its queue, its
// series on /metrics). Variants of one name (e.g. a canary) share the name and differ in
// `variant`; find() gives the primary one (variant ""). Thread-safe; entries are shared and
// immutable once added, so a request keeps its model alive while it runs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/metrics.h"
#include "base/status.h"
#include "engine/engine.h"
#include "gateway/admission.h"
#include "grammar/cache.h"
#include "tokenizer/chat_template.h"

namespace metro::gateway {

struct ServedModel {
  std::string name;     // the id in responses and the first in /v1/models
  std::vector<std::string> aliases;  // other names requests may use (listed after `name`)
  std::string variant;  // "" for the primary
  std::shared_ptr<engine::Engine> engine;
  // The LoRA adapter of the engine's model its requests run with (0: none): the entries
  // of one base model's adapters share its engine, and so its steps.
  int16_t adapter = 0;
  std::optional<tokenizer::ChatTemplate> chat_template;  // none: chat requests are refused
  int64_t created_unix_s = 0;  // when it was loaded (/v1/models `created`)
  double load_seconds = 0.0;
  double calibrated_prefill_tokens_per_s = 0.0;  // 0: not measured
  // Gateway state of this model; null with admission control off.
  std::shared_ptr<AdmissionController> admission;
  // Compiled output grammars (structured outputs) over its vocabulary; FrontDoor::add_model
  // makes it when null.
  std::shared_ptr<grammar::GrammarCache> grammars;
  // The engine's series on /metrics under `metrics_label` (id(), renamed by a swap). Shared
  // by the entries a swap makes of one engine; declared last: unregistered before the
  // engine it reads goes away.
  std::shared_ptr<metrics::SharedLabel> metrics_label;
  std::shared_ptr<metrics::Registration> engine_metrics;

  const tokenizer::Tokenizer& tokenizer() const { return engine->tokenizer(); }
  // "name" or "name@variant".
  std::string id() const { return variant.empty() ? name : name + "@" + variant; }
  // `name` and the aliases.
  std::vector<std::string> names() const;
  bool answers_to(const std::string& n) const;
};

class ModelRegistry {
 public:
  // Errors: an empty name, a name or name@variant already served, an alias another model
  // answers to.
  Status add(std::shared_ptr<ServedModel> model);
  // The primary variant of `name`; null when it is not served.
  std::shared_ptr<const ServedModel> find(const std::string& name) const;
  // The model requests that name none go to: the first one added (null when none).
  std::shared_ptr<const ServedModel> default_model() const;
  // Sends `share` (0 to 1) of `name`'s requests to its `variant`; 0 removes it. Errors: the
  // variant or its primary is not served, the variants' shares would pass 1.
  Status set_split(const std::string& name, const std::string& variant, double share);
  // Where a request for `name` (or an alias) goes under the split: the same `sticky_key` (a
  // user, a tenant) always to the same variant while the split holds; an empty key draws at
  // random. Null when `name` is not served.
  std::shared_ptr<const ServedModel> pick(const std::string& name, std::string_view sticky_key) const;
  // The split of every name that has one: (name, variant) -> share.
  std::map<std::pair<std::string, std::string>, double> splits() const;
  // Every variant of `name`, primary first.
  std::vector<std::shared_ptr<const ServedModel>> variants(const std::string& name) const;
  // Every served model, in the order added.
  std::vector<std::shared_ptr<const ServedModel>> all() const;
  size_t size() const;
  bool empty() const { return size() == 0; }
  // Stops serving `name`'s `variant` ("" the primary) and drops its split; requests that
  // hold it finish on it, and its engine stops once the last of them ends. Errors: not
  // served, a primary whose variants are still served, the only model.
  Status remove(const std::string& name, const std::string& variant);
  // Makes `name`'s `variant` its primary and the primary that variant, each with the share
  // of requests the other had (aliases stay with the primary's place; the engines' series
  // are renamed). Requests that hold either finish on the engine they started on. Errors:
  // no such variant.
  Status swap(const std::string& name, const std::string& variant);
  // Drops every model (their engines stop once the last request using them ends).
  void clear();

 private:
  mutable std::mutex mu_;
  std::vector<std::shared_ptr<const ServedModel>> models_;
  std::map<std::pair<std::string, std::string>, double> splits_;  // (name, variant) -> share
};

}  // namespace metro::gateway
