// The precise reference of paged attention: per query and head, every visible key's score
// (the causal prefix, or its last `window` keys) in double, a dense softmax in double, and
// the weighted sum of values in double.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "base/check.h"
#include "kernels/attention.h"

namespace metro::kernels {

void attention_ref(const AttentionParams& p, const AttentionSeq& seq) {
  const KvPageLayout& lay = p.layout;
  METRO_CHECK(p.n_head > 0 && lay.n_head_kv > 0 && p.n_head % lay.n_head_kv == 0);
  if (seq.n_q <= 0) return;
  const int hd = lay.head_dim;
  const int group = p.n_head / lay.n_head_kv;
  const int64_t n_keys = seq.pos0 + seq.n_q;
  std::vector<float> row(static_cast<size_t>(hd));
  std::vector<double> keys(static_cast<size_t>(n_keys * hd));
  std::vector<double> values(static_cast<size_t>(n_keys * hd));
  std::vector<double> w(static_cast<size_t>(n_keys));
  std::vector<double> o(static_cast<size_t>(hd));
  for (int kvh = 0; kvh < lay.n_head_kv; ++kvh) {
    for (int64_t pos = 0; pos < n_keys; ++pos) {
      const int slot = static_cast<int>(pos % lay.block_size);
      kv_load(lay, seq.k_pages[pos / lay.block_size], slot, kvh, row.data());
      std::copy(row.begin(), row.end(), keys.begin() + pos * hd);
      kv_load(lay, seq.v_pages[pos / lay.block_size], slot, kvh, row.data());
      std::copy(row.begin(), row.end(), values.begin() + pos * hd);
    }
    for (int i = 0; i < seq.n_q; ++i) {
      const int64_t visible = seq.pos0 + i + 1;
      const int64_t first = p.window > 0 ? std::max<int64_t>(0, visible - p.window) : 0;
      for (int h = kvh * group; h < (kvh + 1) * group; ++h) {
        const float* q = seq.q + static_cast<size_t>(i) * seq.q_stride + static_cast<size_t>(h) * hd;
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t pos = first; pos < visible; ++pos) {
          double s = 0.0;
          for (int d = 0; d < hd; ++d) s += static_cast<double>(q[d]) * keys[pos * hd + d];
          w[pos] = s * p.scale;
          if (p.softcap > 0.0f) w[pos] = p.softcap * std::tanh(w[pos] / p.softcap);
          mx = std::max(mx, w[pos]);
        }
        double sum = 0.0;
        for (int64_t pos = first; pos < visible; ++pos) {
          w[pos] = std::exp(w[pos] - mx);
          sum += w[pos];
        }
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t pos = first; pos < visible; ++pos) {
          for (int d = 0; d < hd; ++d) o[d] += w[pos] * values[pos * hd + d];
        }
        float* out = seq.out + static_cast<size_t>(i) * seq.out_stride + static_cast<size_t>(h) * hd;
        for (int d = 0; d < hd; ++d) out[d] = static_cast<float>(o[d] / sum);
      }
    }
  }
}

}  // namespace metro::kernels
