#include "engine/speculative/ngram.h"

#include <algorithm>
#include <bit>

namespace metro::engine::speculative {

const char* draft_source_name(DraftSource s) {
  switch (s) {
    case DraftSource::kPrediction:
      return "prediction";
    case DraftSource::kContext:
      return "ngram";
    case DraftSource::kPool:
      return "ngram_pool";
    case DraftSource::kDraftModel:
      return "draft";
    case DraftSource::kSelf:
      return "self";
    case DraftSource::kGrammar:
      return "grammar";
    case DraftSource::kNone:
      break;
  }
  return "none";
}

namespace {

uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The n tokens before position `end` of the sequence `at` reads (at(i) for i < end); never 0.
template <typename At>
uint64_t hash_ngram(At at, int end, int n, uint64_t salt) {
  uint64_t h = mix(salt ^ (static_cast<uint64_t>(n) << 56));
  for (int i = end - n; i < end; ++i) h = mix(h ^ static_cast<uint32_t>(at(i)));
  return h | 1;
}

}  // namespace

NgramProposer::NgramProposer(NgramOptions options) : opt_(options) {
  opt_.min_n = std::max(1, opt_.min_n);
  opt_.max_n = std::max(opt_.min_n, opt_.max_n);
  if (opt_.pool_n >= 2 && opt_.pool_entries > 0) {
    const size_t n = std::bit_ceil(opt_.pool_entries);
    pool_.assign(n, PoolEntry{});
    pool_mask_ = n - 1;
  }
}

void NgramProposer::forget(uint64_t seq_id) { seqs_.erase(seq_id); }

DraftSource NgramProposer::propose(const ProposeInput& in, int k, std::vector<int32_t>& out) {
  if (in.seq == nullptr || k <= 0) return DraftSource::kNone;
  const std::vector<int32_t>& tokens = in.seq->tokens;
  SeqIndex& ix = seqs_[in.seq->id];
  if (ix.last_end.empty()) ix.last_end.resize(static_cast<size_t>(opt_.max_n - opt_.min_n + 1));
  index(ix, tokens);
  if (!pool_.empty()) feed_pool(ix, tokens, in.seq->cache_scope);
  if (from_prediction(ix, in, k, out)) return DraftSource::kPrediction;
  out.clear();
  if (from_context(ix, tokens, k, out)) return DraftSource::kContext;
  out.clear();
  if (!pool_.empty() && from_pool(tokens, in.seq->cache_scope, k, out)) return DraftSource::kPool;
  out.clear();
  return DraftSource::kNone;
}

void NgramProposer::index(SeqIndex& ix, const std::vector<int32_t>& tokens) {
  const int len = static_cast<int>(tokens.size());
  auto at = [&](int i) { return tokens[static_cast<size_t>(i)]; };
  // An n-gram ending at `end` is indexed once the token after it (tokens[end]) exists and
  // is not the sequence's last: the tail itself must not match itself.
  for (int end = std::max(ix.indexed, opt_.min_n); end < len; ++end) {
    for (int n = opt_.min_n; n <= opt_.max_n && n <= end; ++n) {
      ix.last_end[static_cast<size_t>(n - opt_.min_n)][hash_ngram(at, end, n, 0)] = end;
    }
  }
  ix.indexed = std::max(ix.indexed, len);
}

bool NgramProposer::from_context(SeqIndex& ix, const std::vector<int32_t>& tokens, int k,
                                 std::vector<int32_t>& out) const {
  const int len = static_cast<int>(tokens.size());
  auto at = [&](int i) { return tokens[static_cast<size_t>(i)]; };
  for (int n = std::min(opt_.max_n, len); n >= opt_.min_n; --n) {
    const auto& map = ix.last_end[static_cast<size_t>(n - opt_.min_n)];
    auto it = map.find(hash_ngram(at, len, n, 0));
    if (it == map.end()) continue;
    const int p = it->second;
    // Check the match (hashes can collide), then copy what followed it; past the end of the
    // sequence the copy continues from itself (a repeating span repeats on).
    bool same = true;
    for (int i = 0; i < n && same; ++i) {
      same = tokens[static_cast<size_t>(p - n + i)] == tokens[static_cast<size_t>(len - n + i)];
    }
    if (!same) continue;
    for (int j = 0; j < k; ++j) {
      const int src = p + j;
      const int32_t t = src < len ? tokens[static_cast<size_t>(src)] : out[static_cast<size_t>(src - len)];
      out.push_back(t);
    }
    return true;
  }
  return false;
}

bool NgramProposer::from_prediction(SeqIndex& ix, const ProposeInput& in, int k, std::vector<int32_t>& out) const {
  const std::span<const int32_t> pred = in.prediction;
  if (pred.empty()) return false;
  const std::vector<int32_t>& tokens = in.seq->tokens;
  const int len = static_cast<int>(tokens.size());
  const int g = in.seq->n_generated();
  const int n_pred = static_cast<int>(pred.size());
  int cursor = -1;
  // Fast path: the output since the last call followed the prediction from the cursor.
  if (ix.pred_cursor >= 0) {
    const int d = g - ix.at_generated;
    const int to = ix.pred_cursor + d;
    if (d >= 0 && to <= n_pred) {
      bool follows = true;
      for (int i = 0; i < d && follows; ++i) {
        follows = tokens[static_cast<size_t>(len - d + i)] == pred[static_cast<size_t>(ix.pred_cursor + i)];
      }
      if (follows) cursor = to;
    }
  }
  if (cursor < 0 && g == 0) cursor = 0;
  if (cursor < 0) {
    // Re-align: the longest tail of the output (16 tokens down to 1) found in the
    // prediction, at the occurrence nearest after the old cursor (a single token only near it).
    const int from = std::max(0, ix.pred_cursor);
    for (int m = std::min(g, 16); m >= 1 && cursor < 0; --m) {
      int best = -1;
      for (int e = m; e <= n_pred; ++e) {
        if (m == 1 && (e < from || e > from + 16)) continue;
        bool same = true;
        for (int i = 0; i < m && same; ++i) {
          same = pred[static_cast<size_t>(e - m + i)] == tokens[static_cast<size_t>(len - m + i)];
        }
        if (!same) continue;
        if (best < 0 || (best < from && e >= from)) best = e;
        if (best >= from) break;
      }
      cursor = best;
    }
  }
  ix.pred_cursor = cursor;
  ix.at_generated = g;
  if (cursor < 0 || cursor >= n_pred) return false;
  const int n = std::min(k, n_pred - cursor);
  out.insert(out.end(), pred.begin() + cursor, pred.begin() + cursor + n);
  return true;
}

void NgramProposer::feed_pool(SeqIndex& ix, const std::vector<int32_t>& tokens, uint64_t scope) {
  const int len = static_cast<int>(tokens.size());
  auto at = [&](int i) { return tokens[static_cast<size_t>(i)]; };
  for (int end = std::max(ix.pooled, opt_.pool_n - 1); end < len; ++end) {
    for (int n = opt_.pool_n; n >= opt_.pool_n - 1; --n) {
      if (n > end) continue;
      const uint64_t key = hash_ngram(at, end, n, scope);
      pool_[key & pool_mask_] = PoolEntry{key, tokens[static_cast<size_t>(end)]};
    }
  }
  ix.pooled = std::max(ix.pooled, len);
}

int32_t NgramProposer::pool_lookup(uint64_t key) const {
  const PoolEntry& e = pool_[key & pool_mask_];
  return e.key == key ? e.next : -1;
}

bool NgramProposer::from_pool(const std::vector<int32_t>& tokens, uint64_t scope, int k,
                              std::vector<int32_t>& out) const {
  const int len = static_cast<int>(tokens.size());
  auto at = [&](int i) {
    return i < len ? tokens[static_cast<size_t>(i)] : out[static_cast<size_t>(i - len)];
  };
  for (int j = 0; j < k; ++j) {
    const int end = len + j;
    int32_t next = -1;
    for (int n = opt_.pool_n; n >= opt_.pool_n - 1 && next < 0; --n) {
      if (n <= end) next = pool_lookup(hash_ngram(at, end, n, scope));
    }
    if (next < 0) break;
    out.push_back(next);
  }
  return !out.empty();
}

}  // namespace metro::engine::speculative
