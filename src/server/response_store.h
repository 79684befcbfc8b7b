// Stored responses of POST /v1/responses: what `previous_response_id` continues from and
// GET /v1/responses/{id} returns.
//
// Bounded by bytes: the least recently used responses go first when a new one would pass
// the bound (a response larger than the whole bound is not kept). Every entry belongs to the
// tenant that made it; another tenant's lookup finds nothing, exactly as for an id that was
// never stored, so ids say nothing across tenants. Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

namespace metro::server {

class ResponseStore {
 public:
  struct Entry {
    std::string tenant;
    // The conversation a continuation starts from: the messages of every turn so far (the
    // answer included), without the instructions, which OpenAI does not carry over.
    nlohmann::json conversation;
    std::string response_json;  // the response object as answered
    size_t bytes = 0;
  };

  explicit ResponseStore(size_t max_bytes) : max_bytes_(max_bytes) {}

  void put(const std::string& tenant, const std::string& id, nlohmann::json conversation, std::string response_json);
  // Null when `id` was never stored, was evicted or deleted, or belongs to another tenant.
  std::shared_ptr<const Entry> get(const std::string& tenant, const std::string& id);
  // Whether an entry of the tenant was removed.
  bool erase(const std::string& tenant, const std::string& id);

  size_t bytes() const;
  size_t size() const;
  size_t max_bytes() const { return max_bytes_; }

 private:
  using Lru = std::list<std::pair<std::string, std::shared_ptr<const Entry>>>;
  void drop_locked(Lru::iterator it);

  const size_t max_bytes_;
  mutable std::mutex mu_;
  Lru lru_;  // most recently used first
  std::unordered_map<std::string, Lru::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace metro::server
