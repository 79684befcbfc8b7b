#include "router/policy.h"

#include <algorithm>
#include <limits>

#include "base/hash.h"

namespace metro::router {

bool parse_policy(std::string_view name, Policy* out) {
  if (name == "round-robin") {
    *out = Policy::kRoundRobin;
  } else if (name == "least-load") {
    *out = Policy::kLeastLoad;
  } else if (name == "prefix") {
    *out = Policy::kPrefix;
  } else {
    return false;
  }
  return true;
}

const char* policy_name(Policy p) {
  switch (p) {
    case Policy::kRoundRobin: return "round-robin";
    case Policy::kLeastLoad: return "least-load";
    case Policy::kPrefix: return "prefix";
  }
  return "?";
}

std::vector<uint64_t> prefix_block_hashes(std::string_view text, size_t block_bytes) {
  std::vector<uint64_t> out;
  if (block_bytes == 0) return out;
  uint64_t h = 0x726f75746572ull;
  for (size_t b = 0; b + block_bytes <= text.size(); b += block_bytes) {
    h = hash_combine(h, hash_bytes(text.data() + b, block_bytes));
    out.push_back(h);
  }
  return out;
}

Picker::Picker(Policy policy, size_t n_replicas, PrefixConfig cfg) : policy_(policy), n_(n_replicas), cfg_(cfg) {}

static double load_of(const ReplicaLoad& l) { return static_cast<double>(l.inflight) + l.waiting; }

size_t Picker::matched_locked(int r, const std::vector<uint64_t>& blocks) const {
  size_t n = 0;
  for (uint64_t h : blocks) {
    auto it = blocks_.find(h);
    if (it == blocks_.end() || std::find(it->second.replicas.begin(), it->second.replicas.end(), r) ==
                                   it->second.replicas.end()) {
      break;
    }
    ++n;
  }
  return n;
}

size_t Picker::matched(int r, const std::vector<uint64_t>& blocks) const {
  std::lock_guard lock(mu_);
  return matched_locked(r, blocks);
}

void Picker::remember_locked(int r, const std::vector<uint64_t>& blocks) {
  for (uint64_t h : blocks) {
    auto [it, fresh] = blocks_.try_emplace(h);
    if (fresh) {
      lru_.push_front(h);
      it->second.lru = lru_.begin();
    } else {
      lru_.splice(lru_.begin(), lru_, it->second.lru);
    }
    if (std::find(it->second.replicas.begin(), it->second.replicas.end(), r) == it->second.replicas.end()) {
      it->second.replicas.push_back(r);
    }
  }
  while (blocks_.size() > cfg_.max_blocks && !lru_.empty()) {
    blocks_.erase(lru_.back());
    lru_.pop_back();
  }
}

void Picker::forget(int r) {
  std::lock_guard lock(mu_);
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    auto& reps = it->second.replicas;
    reps.erase(std::remove(reps.begin(), reps.end(), r), reps.end());
    if (reps.empty()) {
      lru_.erase(it->second.lru);
      it = blocks_.erase(it);
    } else {
      ++it;
    }
  }
}

int Picker::pick(const std::vector<ReplicaLoad>& load, const std::vector<uint64_t>& blocks,
                 const std::vector<size_t>* held) {
  std::lock_guard lock(mu_);
  const bool by_events = held != nullptr && std::any_of(held->begin(), held->end(), [](size_t h) { return h > 0; });
  const size_t n = std::min(n_, load.size());
  int best = -1;
  if (policy_ == Policy::kRoundRobin) {
    for (size_t k = 0; k < n; ++k) {
      const size_t r = (next_ + k) % n;
      if (load[r].healthy) {
        best = static_cast<int>(r);
        next_ = r + 1;
        break;
      }
    }
    return best;
  }
  double least = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < n; ++r) {
    if (load[r].healthy) least = std::min(least, load_of(load[r]));
  }
  if (least == std::numeric_limits<double>::infinity()) return -1;
  double best_score = -std::numeric_limits<double>::infinity();
  const double bound = least * cfg_.load_factor + cfg_.load_slack;
  // Ties go round the replicas rather than always to the first.
  for (size_t k = 0; k < n; ++k) {
    const size_t r = (next_ + k) % n;
    if (!load[r].healthy) continue;
    const double l = load_of(load[r]);
    double score = -l;
    if (policy_ == Policy::kPrefix) {
      if (l > bound) continue;
      const double match = by_events ? static_cast<double>(r < held->size() ? (*held)[r] : 0) / kTokensPerBlock
                                     : static_cast<double>(matched_locked(static_cast<int>(r), blocks));
      score = match - cfg_.load_penalty * l;
    }
    if (score > best_score) {
      best_score = score;
      best = static_cast<int>(r);
    }
  }
  next_ = (next_ + 1) % std::max<size_t>(1, n);
  if (best >= 0 && policy_ == Policy::kPrefix) remember_locked(best, blocks);
  return best;
}

}  // namespace metro::router
