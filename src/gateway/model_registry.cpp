#include "gateway/model_registry.h"

#include <algorithm>

namespace metro::gateway {

std::vector<std::string> ServedModel::names() const {
  std::vector<std::string> out{name};
  out.insert(out.end(), aliases.begin(), aliases.end());
  return out;
}

bool ServedModel::answers_to(const std::string& n) const {
  return n == name || std::find(aliases.begin(), aliases.end(), n) != aliases.end();
}

Status ModelRegistry::add(std::shared_ptr<ServedModel> model) {
  if (!model || !model->engine) return invalid_argument("a served model needs an engine");
  if (model->name.empty()) return invalid_argument("a served model needs a name");
  for (size_t i = 0; i < model->aliases.size(); ++i) {
    const std::string& a = model->aliases[i];
    if (a.empty()) return invalid_argument("a served model's names may not be empty");
    if (a == model->name || std::find(model->aliases.begin(), model->aliases.begin() + static_cast<long>(i), a) !=
                                model->aliases.begin() + static_cast<long>(i)) {
      return invalid_argument("the name '" + a + "' is given twice");
    }
  }
  std::lock_guard lock(mu_);
  for (const auto& m : models_) {
    if (m->name == model->name && m->variant == model->variant) {
      return invalid_argument("the model '" + model->id() + "' is served already");
    }
    for (const std::string& n : model->names()) {
      // Variants share their name; no other name may be answered by two models.
      if (m->answers_to(n) && !(n == model->name && m->name == model->name)) {
        return invalid_argument("the name '" + n + "' is served already");
      }
    }
  }
  models_.push_back(std::move(model));
  return Status();
}

std::shared_ptr<const ServedModel> ModelRegistry::find(const std::string& name) const {
  std::lock_guard lock(mu_);
  for (const auto& m : models_) {
    if (m->variant.empty() && m->answers_to(name)) return m;
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
