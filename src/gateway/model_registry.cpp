#include "gateway/model_registry.h"

#include <algorithm>
#include <random>

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

Status ModelRegistry::set_split(const std::string& name, const std::string& variant, double share) {
  if (!(share >= 0.0 && share <= 1.0)) return invalid_argument("a split share is between 0 and 1");
  std::lock_guard lock(mu_);
  bool primary = false, served = false;
  for (const auto& m : models_) {
    primary = primary || (m->name == name && m->variant.empty());
    served = served || (m->name == name && m->variant == variant && !variant.empty());
  }
  if (!primary || !served) return invalid_argument("no variant '" + variant + "' of '" + name + "' is served");
  double others = 0.0;
  for (const auto& [key, s] : splits_) {
    if (key.first == name && key.second != variant) others += s;
  }
  if (others + share > 1.0 + 1e-9) return invalid_argument("the variants of '" + name + "' would take over 100%");
  if (share == 0.0) {
    splits_.erase({name, variant});
  } else {
    splits_[{name, variant}] = share;
  }
  return Status();
}

std::shared_ptr<const ServedModel> ModelRegistry::pick(const std::string& name, std::string_view sticky_key) const {
  std::lock_guard lock(mu_);
  std::shared_ptr<const ServedModel> primary;
  for (const auto& m : models_) {
    if (m->variant.empty() && (name.empty() || m->answers_to(name))) {
      primary = m;
      break;
    }
  }
  if (!primary) return nullptr;
  auto first = splits_.lower_bound({primary->name, std::string()});
  if (first == splits_.end() || first->first.first != primary->name) return primary;
  // A point in [0, 1) from the key (FNV-1a over name and key, so two names split one
  // user's traffic independently) or at random.
  double u;
  if (sticky_key.empty()) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  } else {
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](std::string_view s) {
      for (unsigned char c : s) {
        h ^= c;
        h *= 1099511628211ull;
      }
    };
    mix(primary->name);
    mix(std::string_view("\0", 1));
    mix(sticky_key);
    h ^= h >> 33;  // FNV's low bits are weak: fold the high ones in
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    u = static_cast<double>(h >> 11) * 0x1.0p-53;
  }
  double edge = 0.0;
  for (auto it = first; it != splits_.end() && it->first.first == primary->name; ++it) {
    edge += it->second;
    if (u < edge) {
      for (const auto& m : models_) {
        if (m->name == primary->name && m->variant == it->first.second) return m;
      }
    }
  }
  return primary;
}

std::map<std::pair<std::string, std::string>, double> ModelRegistry::splits() const {
  std::lock_guard lock(mu_);
  return splits_;
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

Status ModelRegistry::remove(const std::string& name, const std::string& variant) {
  std::lock_guard lock(mu_);
  auto it = std::find_if(models_.begin(), models_.end(),
                         [&](const auto& m) { return m->name == name && m->variant == variant; });
  if (it == models_.end()) {
    return not_found(std::string("no model '") + (variant.empty() ? name : name + "@" + variant) + "' is served");
  }
  if (variant.empty()) {
    for (const auto& m : models_) {
      if (m->name == name && !m->variant.empty()) {
        return invalid_argument("'" + name + "' still has the variant '" + m->variant + "'; unload it first");
      }
    }
  }
  if (models_.size() == 1) return invalid_argument("'" + (*it)->id() + "' is the only model served");
  models_.erase(it);
  splits_.erase({name, variant});
  return Status();
}

Status ModelRegistry::swap(const std::string& name, const std::string& variant) {
  if (variant.empty()) return invalid_argument("a swap names a variant");
  std::lock_guard lock(mu_);
  size_t ip = models_.size(), iv = models_.size();
  for (size_t i = 0; i < models_.size(); ++i) {
    if (models_[i]->name != name) continue;
    if (models_[i]->variant.empty()) ip = i;
    if (models_[i]->variant == variant) iv = i;
  }
  if (ip == models_.size() || iv == models_.size()) {
    return not_found("no variant '" + variant + "' of '" + name + "' is served");
  }
  // Entries are immutable once shared: the swap makes new ones over the same engines.
  auto primary = std::make_shared<ServedModel>(*models_[iv]);
  auto demoted = std::make_shared<ServedModel>(*models_[ip]);
  primary->variant.clear();
  primary->aliases = models_[ip]->aliases;
  demoted->variant = variant;
  demoted->aliases = models_[iv]->aliases;
  for (ServedModel* m : {primary.get(), demoted.get()}) {
    if (m->metrics_label) m->metrics_label->set(m->id());
  }
  // Each engine keeps its share: the demoted primary takes what the primary had.
  double variants_share = 0.0;
  for (const auto& [key, share] : splits_) {
    if (key.first == name) variants_share += share;
  }
  const double primary_share = std::max(0.0, 1.0 - variants_share);
  if (primary_share <= 1e-12) {
    splits_.erase({name, variant});
  } else {
    splits_[{name, variant}] = primary_share;
  }
  models_[ip] = std::move(primary);
  models_[iv] = std::move(demoted);
  return Status();
}

void ModelRegistry::clear() {
  std::lock_guard lock(mu_);
  models_.clear();
}

}  // namespace metro::gateway
