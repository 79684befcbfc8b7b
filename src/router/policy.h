// Which replica a request goes to (`metro router --policy`).
//
//  - round-robin: the healthy replicas in turn.
//  - least-load: the healthy replica with the least load, its load being the requests the
//    router has in flight to it plus what its /metrics last said was waiting there.
//  - prefix: the replica expected to hold the longest cached prefix of the prompt, as far
//    as the router knows from what it routed (events off): the prompt's text is cut into
//    fixed-size blocks, chained-hashed, and each routed prompt's block hashes remember their
//    replica (bounded, least recently used forgotten). A replica's score is its matched
//    blocks minus a load penalty; a replica whose load is past the load bound (least load
//    x factor + slack) is not picked however much it matches, so one hot prefix cannot pin
//    one replica while others idle.
// Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace metro::router {

enum class Policy : uint8_t { kRoundRobin, kLeastLoad, kPrefix };
// "round-robin" | "least-load" | "prefix"; false for anything else.
bool parse_policy(std::string_view name, Policy* out);
const char* policy_name(Policy p);

// What the picker sees of one replica.
struct ReplicaLoad {
  bool healthy = true;
  int inflight = 0;       // requests the router has open to it
  double waiting = 0.0;   // its metro_requests_waiting, last poll
};

// About the tokens of a text block of 128 bytes of English: what a held token is worth
// against the load penalty, which is counted in text blocks.
inline constexpr double kTokensPerBlock = 32.0;

struct PrefixConfig {
  size_t block_bytes = 128;         // text per block
  size_t max_blocks = 1u << 20;     // block hashes remembered
  double load_penalty = 2.0;        // blocks a unit of load is worth
  double load_factor = 1.5;         // the load bound: least load x factor + slack
  double load_slack = 4.0;
};

// Chained hashes of the text's whole blocks (a block's hash covers every byte before it).
std::vector<uint64_t> prefix_block_hashes(std::string_view text, size_t block_bytes);

class Picker {
 public:
  Picker(Policy policy, size_t n_replicas, PrefixConfig cfg = {});
  Policy policy() const { return policy_; }
  // The replica for a request whose prompt has these block hashes (any policy); -1 when no
  // replica is healthy. Remembers the choice for later prefixes (prefix policy).
  // `held`: per replica, the prompt tokens its KV events say its cache holds; when one
  // holds any, the prefix policy scores by them (kTokensPerBlock to a text block) instead
  // of what it routed.
  int pick(const std::vector<ReplicaLoad>& load, const std::vector<uint64_t>& blocks,
           const std::vector<size_t>* held = nullptr);
  // How many leading blocks replica r is known to hold (prefix policy's view).
  size_t matched(int r, const std::vector<uint64_t>& blocks) const;
  // A replica that left the pool forgets what it held (its cache is gone or unreachable).
  void forget(int r);

 private:
  struct Entry {
    std::vector<int> replicas;
    std::list<uint64_t>::iterator lru;
  };
  void remember_locked(int r, const std::vector<uint64_t>& blocks);
  size_t matched_locked(int r, const std::vector<uint64_t>& blocks) const;

  const Policy policy_;
  const size_t n_;
  const PrefixConfig cfg_;
  mutable std::mutex mu_;
  size_t next_ = 0;
  std::unordered_map<uint64_t, Entry> blocks_;
  std::list<uint64_t> lru_;  // most recent first
};

}  // namespace metro::router
