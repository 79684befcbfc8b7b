#include "server/response_store.h"

namespace metro::server {

void ResponseStore::put(const std::string& tenant, const std::string& id, nlohmann::json conversation,
                        std::string response_json) {
  auto e = std::make_shared<Entry>();
  e->tenant = tenant;
  e->conversation = std::move(conversation);
  e->response_json = std::move(response_json);
  e->bytes = id.size() + tenant.size() + e->response_json.size() + e->conversation.dump().size();
  std::lock_guard lock(mu_);
  if (auto it = index_.find(id); it != index_.end()) drop_locked(it->second);
  if (e->bytes > max_bytes_) return;
  while (bytes_ + e->bytes > max_bytes_ && !lru_.empty()) drop_locked(std::prev(lru_.end()));
  bytes_ += e->bytes;
  lru_.emplace_front(id, std::move(e));
  index_[id] = lru_.begin();
}

std::shared_ptr<const ResponseStore::Entry> ResponseStore::get(const std::string& tenant, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end() || it->second->second->tenant != tenant) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return lru_.front().second;
}

bool ResponseStore::erase(const std::string& tenant, const std::string& id) {
  std::lock_guard lock(mu_);
  auto it = index_.find(id);
  if (it == index_.end() || it->second->second->tenant != tenant) return false;
  drop_locked(it->second);
  return true;
}

void ResponseStore::drop_locked(Lru::iterator it) {
  bytes_ -= it->second->bytes;
  index_.erase(it->first);
  lru_.erase(it);
}

size_t ResponseStore::bytes() const {
  std::lock_guard lock(mu_);
  return bytes_;
}

size_t ResponseStore::size() const {
  std::lock_guard lock(mu_);
  return lru_.size();
}

}  // namespace metro::server
