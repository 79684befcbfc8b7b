#include "gateway/model_registry.h"

namespace metro::gateway {

Status ModelRegistry::add(std::shared_ptr<ServedModel> model) {
  if (!model || !model->engine) return invalid_argument("a served model needs an engine");
  if (model->name.empty()) return invalid_argument("a served model needs a name");
  std::lock_guard lock(mu_);
  for (const auto& m : models_) {
    if (m->name == model->name && m->variant == model->variant) {
      return invalid_argument("the model '" + model->id() + "' is served already");
    }
  }
  models_.push_back(std::move(model));
  return Status();
}

std::shared_ptr<const ServedModel> ModelRegistry::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const auto& m : models_) {
    if (m->name == name && m->variant.empty()) return m;
  }
  return nullptr;
}

std::shared_ptr<const ServedModel> ModelRegistry::default_model() const {
  std::lock_guard lock(mu_);
  return models_.empty() ? nullptr : models_.front();
}

std::vector<std::shared_ptr<const ServedModel>> ModelRegistry::variants(const std::string& name) const {
  std::vector<std::shared_ptr<const ServedModel>> out;
  std::lock_guard lock(mu_);
  for (const auto& m : models_) {
    if (m->name == name && m->variant.empty()) out.insert(out.begin(), m);
    else if (m->name == name) out.push_back(m);
  }
  return out;
}

std::vector<std::shared_ptr<const ServedModel>> ModelRegistry::all() const {
  std::lock_guard lock(mu_);
  return models_;
}

size_t ModelRegistry::size() const {
  std::lock_guard lock(mu_);
  return models_.size();
}

void ModelRegistry::clear() {
  std::lock_guard lock(mu_);
  models_.clear();
}

}  // namespace metro::gateway
