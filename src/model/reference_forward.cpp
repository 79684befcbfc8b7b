#include "model/reference_forward.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>

#include "kernels/dtype.h"
#include "kernels/quant_ref.h"

namespace metro::model {

namespace {

using Mat = std::vector<double>;  // row-major [rows][cols]

struct DenseMat {
  int64_t rows = 0, cols = 0;
  Mat w;
};

// Rows [first, first + n) of tensor `name` (n = 0: every row of a 1-D or 2-D tensor).
Expected<DenseMat> dense_rows(const gguf::File& f, const std::string& name, int64_t first, int64_t n) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return not_found("tensor '" + name + "' is missing");
  auto dt = kernels::dtype_from_ggml(t->type());
  if (!dt) return unimplemented("tensor '" + name + "' type");
  DenseMat m;
  m.cols = static_cast<int64_t>(t->ne[0]);
  m.rows = n > 0 ? n : t->n_dims > 1 ? static_cast<int64_t>(t->ne[1]) : 1;
  int64_t all_rows = 1;
  for (uint32_t d = 1; d < t->n_dims; ++d) all_rows *= static_cast<int64_t>(t->ne[d]);
  if (first < 0 || first + m.rows > all_rows) return out_of_range("rows past the end of tensor '" + name + "'");
  m.w.resize(static_cast<size_t>(m.rows * m.cols));
  std::vector<float> row(static_cast<size_t>(m.cols));
  const size_t rb = kernels::row_bytes(*dt, m.cols);
  for (int64_t r = 0; r < m.rows; ++r) {
    kernels::dequantize_row_ref(*dt, t->data + static_cast<size_t>(first + r) * rb, row.data(), m.cols);
    for (int64_t c = 0; c < m.cols; ++c) m.w[static_cast<size_t>(r * m.cols + c)] = row[static_cast<size_t>(c)];
  }
  return m;
}

Expected<DenseMat> dense(const gguf::File& f, const std::string& name) { return dense_rows(f, name, 0, 0); }

// Expert e's matrix of the 3-D tensor `name` ([n_expert][rows][cols]).
Expected<DenseMat> dense_expert(const gguf::File& f, const std::string& name, int64_t e) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t || t->n_dims != 3) return not_found("3-D tensor '" + name + "' is missing");
  const int64_t rows = static_cast<int64_t>(t->ne[1]);
  return dense_rows(f, name, e * rows, rows);
}

// Rows [r0, r1) of m.
DenseMat row_range(const DenseMat& m, int64_t r0, int64_t r1) {
  DenseMat out;
  out.rows = r1 - r0;
  out.cols = m.cols;
  out.w.assign(m.w.begin() + static_cast<std::ptrdiff_t>(r0 * m.cols), m.w.begin() + static_cast<std::ptrdiff_t>(r1 * m.cols));
  return out;
}

std::vector<double> matvec(const DenseMat& m, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(m.rows), 0.0);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < m.cols; ++c) s += m.w[static_cast<size_t>(r * m.cols + c)] * x[static_cast<size_t>(c)];
    y[static_cast<size_t>(r)] = s;
  }
  return y;
}

double silu_times(double g, double u) { return g / (1.0 + std::exp(-g)) * u; }

// A routed layer's experts (and shared expert) in double.
struct MoeLayer {
  DenseMat router, shexp_gate;
  std::vector<DenseMat> gate, up, down;
  DenseMat sh_gate, sh_up, sh_down;  // rows = 0 without a shared expert
};

Expected<MoeLayer> load_moe(const gguf::File& f, const HParams& hp, const std::string& p) {
  MoeLayer m;
  METRO_ASSIGN_OR_RETURN(m.router, dense(f, p + "ffn_gate_inp.weight"));
  for (int64_t e = 0; e < static_cast<int64_t>(hp.n_expert); ++e) {
    METRO_ASSIGN_OR_RETURN(DenseMat g, dense_expert(f, p + "ffn_gate_exps.weight", e));
    METRO_ASSIGN_OR_RETURN(DenseMat u, dense_expert(f, p + "ffn_up_exps.weight", e));
    METRO_ASSIGN_OR_RETURN(DenseMat d, dense_expert(f, p + "ffn_down_exps.weight", e));
    m.gate.push_back(std::move(g));
    m.up.push_back(std::move(u));
    m.down.push_back(std::move(d));
  }
  if (hp.n_ff_shexp > 0) {
    METRO_ASSIGN_OR_RETURN(m.sh_gate, dense(f, p + "ffn_gate_shexp.weight"));
    METRO_ASSIGN_OR_RETURN(m.sh_up, dense(f, p + "ffn_up_shexp.weight"));
    METRO_ASSIGN_OR_RETURN(m.sh_down, dense(f, p + "ffn_down_shexp.weight"));
    if (hp.has_shexp_gate) {
      METRO_ASSIGN_OR_RETURN(m.shexp_gate, dense(f, p + "ffn_gate_inp_shexp.weight"));
    }
  }
  return m;
}

// The routed FFN of one token's normed state h: the n_used most probable experts (the
// lower id first on a tie), weighted by their probabilities (rescaled to sum 1 when the
// model says), plus the gated shared expert.
std::vector<double> moe_ffn(const MoeLayer& m, const HParams& hp, const std::string& prefix,
                            const std::vector<double>& h, const MatvecObserver& observer) {
  auto seen = [&](const char* name, const std::vector<double>& x) {
    if (observer) observer(prefix + name, x);
  };
  seen("ffn_gate_inp.weight", h);
  std::vector<double> p = matvec(m.router, h);
  if (hp.expert_gating == ExpertGating::kSoftmax) {
    const double mx = *std::max_element(p.begin(), p.end());
    double z = 0;
    for (double& v : p) z += (v = std::exp(v - mx));
    for (double& v : p) v /= z;
  } else {
    for (double& v : p) v = 1.0 / (1.0 + std::exp(-v));
  }
  std::vector<int> chosen;
  double total = 0;
  for (uint32_t j = 0; j < hp.n_expert_used; ++j) {
    int best = -1;
    for (int e = 0; e < static_cast<int>(p.size()); ++e) {
      if (std::find(chosen.begin(), chosen.end(), e) != chosen.end()) continue;
      if (best < 0 || p[static_cast<size_t>(e)] > p[static_cast<size_t>(best)]) best = e;
    }
    chosen.push_back(best);
    total += p[static_cast<size_t>(best)];
  }
  const double scale = hp.expert_weights_norm ? 1.0 / std::max(total, 6.103515625e-5) : 1.0;
  std::vector<double> out(h.size(), 0.0);
  auto add_ffn = [&](const DenseMat& wg, const DenseMat& wu, const DenseMat& wd, double w, bool shared) {
    seen(shared ? "ffn_gate_shexp.weight" : "ffn_gate_exps.weight", h);
    seen(shared ? "ffn_up_shexp.weight" : "ffn_up_exps.weight", h);
    auto g = matvec(wg, h);
    const auto u = matvec(wu, h);
    for (size_t i = 0; i < g.size(); ++i) g[i] = silu_times(g[i], u[i]);
    seen(shared ? "ffn_down_shexp.weight" : "ffn_down_exps.weight", g);
    const auto d = matvec(wd, g);
    for (size_t i = 0; i < out.size(); ++i) out[i] += w * d[i];
  };
  for (int e : chosen) {
    add_ffn(m.gate[static_cast<size_t>(e)], m.up[static_cast<size_t>(e)], m.down[static_cast<size_t>(e)],
            p[static_cast<size_t>(e)] * scale, false);
  }
  if (m.sh_gate.rows > 0) {
    double gate = 1.0;
    if (m.shexp_gate.rows > 0) {
      double d = 0;
      for (size_t i = 0; i < h.size(); ++i) d += m.shexp_gate.w[i] * h[i];
      gate = 1.0 / (1.0 + std::exp(-d));
    }
    add_ffn(m.sh_gate, m.sh_up, m.sh_down, gate, true);
  }
  return out;
}

std::vector<double> rms_norm(const std::vector<double>& x, const DenseMat& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double scale = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * scale * w.w[i];
  return y;
}

// Each head of v RMS-normed with the same weight.
void head_norm(std::vector<double>& v, int n_head, const DenseMat& w, double eps) {
  const size_t hd = v.size() / static_cast<size_t>(n_head);
  for (int h = 0; h < n_head; ++h) {
    const auto first = v.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(h) * hd);
    const auto y = rms_norm(std::vector<double>(first, first + static_cast<std::ptrdiff_t>(hd)), w, eps);
    std::copy(y.begin(), y.end(), first);
  }
}

// Rotates each head of v to `pos` with the shared closed-form frequencies (scaling and
// factors applied there), in double.
void rope(std::vector<double>& v, int n_head, const HParams& hp, int64_t pos, const kernels::RopeFrequencies& fr) {
  const int hd = static_cast<int>(hp.head_dim), n_rot = static_cast<int>(hp.n_rot);
  const double p = static_cast<double>(pos);
  for (int h = 0; h < n_head; ++h) {
    double* x = v.data() + static_cast<size_t>(h) * static_cast<size_t>(hd);
    for (int i = 0; i < n_rot / 2; ++i) {
      const double theta = p * fr.inv_freq[static_cast<size_t>(i)];
      const double c = std::cos(theta) * fr.mscale, s = std::sin(theta) * fr.mscale;
      const int a = hp.rope_type == RopeType::kNeox ? i : 2 * i;
      const int b = hp.rope_type == RopeType::kNeox ? i + n_rot / 2 : 2 * i + 1;
      const double x0 = x[a], x1 = x[b];
      x[a] = x0 * c - x1 * s;
      x[b] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

Expected<std::vector<std::vector<float>>> reference_forward(const gguf::File& f,
                                                            std::span<const int32_t> tokens,
                                                            const MatvecObserver& observer, int n_ctx) {
  auto seen = [&](const std::string& name, const std::vector<double>& x) {
    if (observer) observer(name, x);
  };
  METRO_ASSIGN_OR_RETURN(HParams hp, HParams::from_gguf(f));
  const int n_embd = static_cast<int>(hp.n_embd), hd = static_cast<int>(hp.head_dim);
  const int n_head = static_cast<int>(hp.n_head), n_kv = static_cast<int>(hp.n_head_kv);
  const int gqa = n_head / n_kv;
  METRO_ASSIGN_OR_RETURN(DenseMat embd, dense(f, "token_embd.weight"));
  METRO_ASSIGN_OR_RETURN(DenseMat out_norm, dense(f, "output_norm.weight"));
  DenseMat head_storage;
  const DenseMat* head = &embd;
  if (!hp.tied_output) {
    METRO_ASSIGN_OR_RETURN(head_storage, dense(f, "output.weight"));
    head = &head_storage;
  }
  DenseMat factors;
  if (hp.has_rope_freq_factors) {
    METRO_ASSIGN_OR_RETURN(factors, dense(f, "rope_freqs.weight"));
  } else if (hp.has_longrope) {
    METRO_ASSIGN_OR_RETURN(factors, dense(f, hp.long_rope(n_ctx) ? "rope_factors_long.weight" : "rope_factors_short.weight"));
  }
  std::vector<float> factor_values(factors.w.begin(), factors.w.end());
  if (!factor_values.empty() && factor_values.size() != hp.n_rot / 2) {
    return data_loss("reference forward: RoPE frequency factors must hold n_rot / 2 values");
  }
  const kernels::RopeFrequencies freqs =
      kernels::rope_frequencies(rope_config(hp, factor_values.empty() ? nullptr : factor_values.data()));
  const kernels::RopeFrequencies local_freqs = kernels::rope_frequencies(local_rope_config(hp));
  const size_t T = tokens.size();
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) {
    x[t].assign(embd.w.begin() + static_cast<long>(tokens[t]) * n_embd,
                embd.w.begin() + static_cast<long>(tokens[t] + 1) * n_embd);
    for (double& e : x[t]) e *= static_cast<double>(hp.embd_scale);
  }
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    DenseMat an, fn;
    if (hp.pre_norms) {
      METRO_ASSIGN_OR_RETURN(an, dense(f, p + "attn_norm.weight"));
      METRO_ASSIGN_OR_RETURN(fn, dense(f, p + "ffn_norm.weight"));
    }
    DenseMat wq, wk, wv;
    const int64_t n_q = int64_t{n_head} * hd, n_k = int64_t{n_kv} * hd;
    if (hp.fused_qkv) {
      METRO_ASSIGN_OR_RETURN(DenseMat qkv, dense(f, p + "attn_qkv.weight"));
      wq = row_range(qkv, 0, n_q);
      wk = row_range(qkv, n_q, n_q + n_k);
      wv = row_range(qkv, n_q + n_k, n_q + 2 * n_k);
    } else {
      METRO_ASSIGN_OR_RETURN(wq, dense(f, p + "attn_q.weight"));
      METRO_ASSIGN_OR_RETURN(wk, dense(f, p + "attn_k.weight"));
      METRO_ASSIGN_OR_RETURN(wv, dense(f, p + "attn_v.weight"));
    }
    METRO_ASSIGN_OR_RETURN(DenseMat wo, dense(f, p + "attn_output.weight"));
    DenseMat wg, wu, wd;
    MoeLayer moe;
    if (hp.is_moe()) {
      METRO_ASSIGN_OR_RETURN(moe, load_moe(f, hp, p));
    } else if (hp.fused_gate_up) {
      METRO_ASSIGN_OR_RETURN(DenseMat gu, dense(f, p + "ffn_up.weight"));
      wg = row_range(gu, 0, gu.rows / 2);
      wu = row_range(gu, gu.rows / 2, gu.rows);
    } else {
      METRO_ASSIGN_OR_RETURN(wg, dense(f, p + "ffn_gate.weight"));
      METRO_ASSIGN_OR_RETURN(wu, dense(f, p + "ffn_up.weight"));
    }
    if (!hp.is_moe()) {
      METRO_ASSIGN_OR_RETURN(wd, dense(f, p + "ffn_down.weight"));
    }
    DenseMat bq, bk, bv, qn, kn, pan, pfn;
    if (hp.has_post_norms) {
      METRO_ASSIGN_OR_RETURN(pan, dense(f, p + "post_attention_norm.weight"));
      METRO_ASSIGN_OR_RETURN(pfn, dense(f, p + "post_ffw_norm.weight"));
    }
    const kernels::RopeFrequencies& layer_freqs = hp.is_local_layer(il) ? local_freqs : freqs;
    if (hp.has_qk_norm) {
      METRO_ASSIGN_OR_RETURN(qn, dense(f, p + "attn_q_norm.weight"));
      METRO_ASSIGN_OR_RETURN(kn, dense(f, p + "attn_k_norm.weight"));
    }
    if (hp.has_qkv_bias) {
      METRO_ASSIGN_OR_RETURN(bq, dense(f, p + "attn_q.bias"));
      METRO_ASSIGN_OR_RETURN(bk, dense(f, p + "attn_k.bias"));
      METRO_ASSIGN_OR_RETURN(bv, dense(f, p + "attn_v.bias"));
    }
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto h = hp.pre_norms ? rms_norm(x[t], an, hp.rms_eps) : x[t];
      if (hp.fused_qkv) {
        seen(p + "attn_qkv.weight", h);
      } else {
        seen(p + "attn_q.weight", h);
        seen(p + "attn_k.weight", h);
        seen(p + "attn_v.weight", h);
      }
      q[t] = matvec(wq, h);
      k[t] = matvec(wk, h);
      v[t] = matvec(wv, h);
      if (hp.has_qkv_bias) {
        for (size_t i = 0; i < q[t].size(); ++i) q[t][i] += bq.w[i];
        for (size_t i = 0; i < k[t].size(); ++i) k[t][i] += bk.w[i];
        for (size_t i = 0; i < v[t].size(); ++i) v[t][i] += bv.w[i];
      }
      if (hp.qk_norm_full) {
        q[t] = rms_norm(q[t], qn, hp.rms_eps);
        k[t] = rms_norm(k[t], kn, hp.rms_eps);
      } else if (hp.has_qk_norm) {
        head_norm(q[t], n_head, qn, hp.rms_eps);
        head_norm(k[t], n_kv, kn, hp.rms_eps);
      }
      rope(q[t], n_head, hp, static_cast<int64_t>(t), layer_freqs);
      rope(k[t], n_kv, hp, static_cast<int64_t>(t), layer_freqs);
    }
    const double scale = hp.attn_scale > 0.0f ? static_cast<double>(hp.attn_scale) : 1.0 / std::sqrt(static_cast<double>(hd));
    const double cap = hp.attn_softcap;
    const size_t window = hp.layer_window(il);
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(static_cast<size_t>(n_head * hd), 0.0);
      const size_t first = window > 0 && t + 1 > window ? t + 1 - window : 0;  // the window's first key
      for (int h = 0; h < n_head; ++h) {
        const int kvh = h / gqa;
        std::vector<double> s(t + 1, -1e300);
        double mx = -1e300;
        for (size_t j = first; j <= t; ++j) {
          double d = 0;
          for (int i = 0; i < hd; ++i) {
            d += q[t][static_cast<size_t>(h * hd + i)] * k[j][static_cast<size_t>(kvh * hd + i)];
          }
          s[j] = d * scale;
          if (cap > 0.0) s[j] = cap * std::tanh(s[j] / cap);
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (size_t j = first; j <= t; ++j) z += (s[j] = std::exp(s[j] - mx));
        for (size_t j = first; j <= t; ++j) {
          for (int i = 0; i < hd; ++i) {
            att[static_cast<size_t>(h * hd + i)] += s[j] / z * v[j][static_cast<size_t>(kvh * hd + i)];
          }
        }
      }
      seen(p + "attn_output.weight", att);
      auto o = matvec(wo, att);
      if (hp.has_post_norms) o = rms_norm(o, pan, hp.rms_eps);
      const double rs = hp.residual_scale;
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += rs * o[i];
      auto h2 = hp.pre_norms ? rms_norm(x[t], fn, hp.rms_eps) : x[t];
      if (hp.is_moe()) {
        const auto d = moe_ffn(moe, hp, p, h2, observer);
        for (size_t i = 0; i < d.size(); ++i) x[t][i] += rs * d[i];
        continue;
      }
      if (!hp.fused_gate_up) seen(p + "ffn_gate.weight", h2);
      seen(p + "ffn_up.weight", h2);
      auto g = matvec(wg, h2), u = matvec(wu, h2);
      for (size_t i = 0; i < g.size(); ++i) {
        // silu(g) = g / (1 + e^-g); gelu's tanh form = g / (1 + e^(-2 sqrt(2/pi) (g + 0.044715 g^3))).
        const double e = hp.gelu_ffn ? -2.0 * std::sqrt(2.0 / std::numbers::pi) * (g[i] + 0.044715 * g[i] * g[i] * g[i]) : -g[i];
        g[i] = g[i] / (1.0 + std::exp(e)) * u[i];
      }
      seen(p + "ffn_down.weight", g);
      auto d = matvec(wd, g);
      if (hp.has_post_norms) d = rms_norm(d, pfn, hp.rms_eps);
      for (size_t i = 0; i < d.size(); ++i) x[t][i] += rs * d[i];
    }
  }
  std::vector<std::vector<float>> logits(T);
  for (size_t t = 0; t < T; ++t) {
    auto h = rms_norm(x[t], out_norm, hp.rms_eps);
    seen(hp.tied_output ? "token_embd.weight" : "output.weight", h);
    auto l = matvec(*head, h);
    for (double& e : l) e /= static_cast<double>(hp.logit_scale);
    if (hp.final_softcap > 0.0f) {
      for (double& e : l) e = hp.final_softcap * std::tanh(e / hp.final_softcap);
    }
    logits[t].assign(l.begin(), l.end());
  }
  return logits;
}

}  // namespace metro::model
