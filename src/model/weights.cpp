#include "model/weights.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "backends/registry.h"
#include "kernels/quant_ref.h"

namespace metro::model {

namespace {

using kernels::DType;

std::string shape_of(std::initializer_list<uint64_t> dims) {
  std::string s = "[";
  bool first = true;
  for (uint64_t d : dims) {
    if (!first) s += ", ";
    s += std::to_string(d);
    first = false;
  }
  return s + "]";
}

Expected<const gguf::TensorInfo*> find(const gguf::File& f, const std::string& name,
                                       std::initializer_list<uint64_t> dims) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) return not_found("tensor '" + name + "' is missing");
  bool ok = t->n_dims == dims.size();
  size_t d = 0;
  for (uint64_t want : dims) {
    if (!ok) break;
    ok = t->ne[d++] == want;
  }
  // GGUF writers sometimes store 1-D tensors with trailing unit dims; accept [n, 1].
  if (!ok && dims.size() == 1 && t->n_dims == 2 && t->ne[0] == *dims.begin() && t->ne[1] == 1) {
    ok = true;
  }
  if (!ok) {
    return data_loss("tensor '" + name + "' has shape " + t->shape_string() + ", expected " +
                     shape_of(dims));
  }
  return t;
}

// A small vector (norm, bias, rope factors) converted to F32: elements [begin, end).
Expected<std::vector<float>> load_vector(const gguf::File& f, const std::string& name, uint64_t n,
                                         uint64_t begin = 0, uint64_t end = 0) {
  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(f, name, {n}));
  auto dt = kernels::dtype_from_ggml(t->type());
  if (!dt || (*dt != DType::kF32 && *dt != DType::kF16 && *dt != DType::kBF16)) {
    return unimplemented("tensor '" + name + "' has type " + std::string(t->type_info.name) +
                         "; a norm/bias vector must be F32, F16 or BF16");
  }
  std::vector<float> all(n);
  kernels::dequantize_row_ref(*dt, t->data, all.data(), static_cast<int64_t>(n));
  if (end == 0) return all;
  return std::vector<float>(all.begin() + static_cast<ptrdiff_t>(begin), all.begin() + static_cast<ptrdiff_t>(end));
}

Expected<DType> matrix_type(const gguf::TensorInfo& t, const std::string& name) {
  auto dt = kernels::dtype_from_ggml(t.type());
  if (!dt || *dt == DType::kQ8_1 || *dt == DType::kQ8_K) {
    return unimplemented("tensor '" + name + "' has type " + std::string(t.type_info.name) +
                         ", which metro cannot compute with yet");
  }
  return *dt;
}

// Whether matrix m (may be null) reads the byte at p in place.
bool reads_bytes(const backends::DeviceMatrix* m, const uint8_t* p) {
  if (m == nullptr) return false;
  for (const auto& r : m->host_memory()) {
    if (p >= r.data() && p < r.data() + r.size()) return true;
  }
  return false;
}

// Binds tensors onto one backend, slicing them for one shard.
class Binder {
 public:
  Binder(const gguf::File& f, backends::Backend& b, bool allow_repack, std::shared_ptr<ColdStore> cold = nullptr)
      : f_(f), b_(b), allow_repack_(allow_repack), cold_(std::move(cold)) {}

  // Rows [row_begin, row_end) and columns [col_begin, col_end) of the [n_out][n_in] matrix
  // `name` (a range end of 0 means the whole dimension).
  Expected<std::unique_ptr<backends::DeviceMatrix>> matrix(const std::string& name, uint64_t n_in,
                                                           uint64_t n_out, int64_t row_begin = 0,
                                                           int64_t row_end = 0, int64_t col_begin = 0,
                                                           int64_t col_end = 0) {
    METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(f_, name, {n_in, n_out}));
    return slice(*t, name, 0, n_in, n_out, row_begin, row_end, col_begin, col_end);
  }

  // Expert e's [n_out][n_in] matrix of the [n_expert][n_out][n_in] tensor `name`, sliced as
  // matrix() slices.
  Expected<std::unique_ptr<backends::DeviceMatrix>> expert(const std::string& name, uint64_t n_in, uint64_t n_out,
                                                           uint64_t n_expert, uint64_t e, int64_t row_begin = 0,
                                                           int64_t row_end = 0, int64_t col_begin = 0,
                                                           int64_t col_end = 0) {
    METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(f_, name, {n_in, n_out, n_expert}));
    return slice(*t, name, e * n_out, n_in, n_out, row_begin, row_end, col_begin, col_end, cold_);
  }

  const std::shared_ptr<ColdStore>& cold() const { return cold_; }

  // The file bytes of tensor `name` once every matrix bound from it went to the cold store:
  // given back at once (gguf::File::give_back), so that loading a model larger than memory
  // never holds the file's experts and their copies together. Model::load counts them
  // later with the rest of what it gives back.
  void give_back_if_cold(const std::string& name, const std::vector<std::unique_ptr<backends::DeviceMatrix>>& ms) {
    if (!cold_) return;
    for (const auto& m : ms) {
      if (!m->cold()) return;
    }
    if (const gguf::TensorInfo* t = f_.find_tensor(name)) f_.give_back({t->data, static_cast<size_t>(t->n_bytes)});
  }

  Expected<std::unique_ptr<backends::DeviceVector>> vector(const std::string& name, uint64_t n,
                                                           uint64_t begin = 0, uint64_t end = 0) {
    METRO_ASSIGN_OR_RETURN(std::vector<float> v, load_vector(f_, name, n, begin, end));
    return b_.upload_vector(v);
  }

  // A column cut must fall on a block of the weight and of its activation partner.
  static bool column_cut_ok(DType t, int64_t c) {
    const auto& tr = kernels::traits(t);
    return c % tr.block_size == 0 && c % kernels::traits(tr.dot_partner).block_size == 0;
  }

 private:
  // Rows [row_begin, row_end) (0: all n_out) and columns [col_begin, col_end) of the n_out
  // rows of tensor t starting at its row `first_row`.
  Expected<std::unique_ptr<backends::DeviceMatrix>> slice(const gguf::TensorInfo& t, const std::string& name,
                                                          uint64_t first_row, uint64_t n_in, uint64_t n_out,
                                                          int64_t row_begin, int64_t row_end, int64_t col_begin,
                                                          int64_t col_end, std::shared_ptr<ColdStore> cold = nullptr) {
    METRO_ASSIGN_OR_RETURN(DType dt, matrix_type(t, name));
    if (!b_.reads(dt)) {
      return invalid_argument("tensor '" + name + "' is " + std::string(kernels::dtype_name(dt)) + ", which the " +
                              std::string(b_.name()) + " backend does not read");
    }
    if (row_end == 0) row_end = static_cast<int64_t>(n_out);
    if (col_end == 0) col_end = static_cast<int64_t>(n_in);
    for (int64_t c : {col_begin, col_end}) {
      if (c != 0 && c != static_cast<int64_t>(n_in) && !column_cut_ok(dt, c)) {
        return invalid_argument("tensor '" + name + "' (" + std::string(kernels::dtype_name(dt)) +
                                ") cannot be cut for tensor parallelism at column " + std::to_string(c) +
                                ": not a multiple of its block size");
      }
    }
    backends::HostMatrix m;
    m.type = dt;
    m.n_rows = row_end - row_begin;
    m.n_cols = col_end - col_begin;
    m.row_stride = kernels::row_bytes(dt, static_cast<int64_t>(n_in));
    m.data = t.data + (first_row + static_cast<uint64_t>(row_begin)) * m.row_stride + kernels::row_bytes(dt, col_begin);
    m.cold = std::move(cold);
    return b_.upload_matrix(m, backends::MatrixUse::kProduct, allow_repack_);
  }

  const gguf::File& f_;
  backends::Backend& b_;
  bool allow_repack_;
  std::shared_ptr<ColdStore> cold_;  // where experts and the embedding table go (ModelWeights::bind)
};

}  // namespace

namespace {

// A routed layer's FFN (HParams::n_expert): the router, every expert's matrices (the
// shard's columns of each), and the shared expert with its gate where the file has one.
Status bind_experts(Binder& b, const HParams& hp, const ShardGeometry& g, const std::string& p, LayerWeights& L) {
  const uint64_t n_embd = hp.n_embd, n_ff = hp.n_ff_exp, n_exp = hp.n_expert;
  METRO_ASSIGN_OR_RETURN(L.router, b.matrix(p + "ffn_gate_inp.weight", n_embd, n_exp));
  L.exp_gate.resize(n_exp);
  L.exp_up.resize(n_exp);
  L.exp_down.resize(n_exp);
  for (uint64_t e = 0; e < n_exp; ++e) {
    METRO_ASSIGN_OR_RETURN(L.exp_gate[e], b.expert(p + "ffn_gate_exps.weight", n_embd, n_ff, n_exp, e, g.ff_begin, g.ff_end));
    METRO_ASSIGN_OR_RETURN(L.exp_up[e], b.expert(p + "ffn_up_exps.weight", n_embd, n_ff, n_exp, e, g.ff_begin, g.ff_end));
    METRO_ASSIGN_OR_RETURN(L.exp_down[e],
                           b.expert(p + "ffn_down_exps.weight", n_ff, n_embd, n_exp, e, 0, 0, g.ff_begin, g.ff_end));
    L.experts.gate.push_back(L.exp_gate[e].get());
    L.experts.up.push_back(L.exp_up[e].get());
    L.experts.down.push_back(L.exp_down[e].get());
  }
  b.give_back_if_cold(p + "ffn_gate_exps.weight", L.exp_gate);
  b.give_back_if_cold(p + "ffn_up_exps.weight", L.exp_up);
  b.give_back_if_cold(p + "ffn_down_exps.weight", L.exp_down);
  if (hp.n_ff_shexp == 0) return {};
  if (g.sliced()) return unimplemented("tensor-parallel shards of a model with a shared expert");
  const uint64_t n_sh = hp.n_ff_shexp;
  METRO_ASSIGN_OR_RETURN(L.w_gate, b.matrix(p + "ffn_gate_shexp.weight", n_embd, n_sh));
  METRO_ASSIGN_OR_RETURN(L.w_up, b.matrix(p + "ffn_up_shexp.weight", n_embd, n_sh));
  METRO_ASSIGN_OR_RETURN(L.w_down, b.matrix(p + "ffn_down_shexp.weight", n_sh, n_embd));
  if (hp.has_shexp_gate) {
    METRO_ASSIGN_OR_RETURN(L.shexp_gate, b.vector(p + "ffn_gate_inp_shexp.weight", n_embd));
  }
  return {};
}

}  // namespace

std::vector<const backends::DeviceMatrix*> LayerWeights::matrices() const {
  std::vector<const backends::DeviceMatrix*> all;
  for (const auto* m : {wq.get(), wk.get(), wv.get(), wo.get(), router.get(), w_gate.get(), w_up.get(), w_down.get()}) {
    if (m != nullptr) all.push_back(m);
  }
  for (size_t e = 0; e < exp_gate.size(); ++e) {
    all.push_back(exp_gate[e].get());
    all.push_back(exp_up[e].get());
    all.push_back(exp_down[e].get());
  }
  return all;
}

Expected<ModelWeights> ModelWeights::bind(const gguf::File& f, const HParams& hp, bool allow_repack) {
  auto backend = backends::default_backend();
  return bind(f, hp, Shard{}, *backend, allow_repack);
}

Expected<ModelWeights> ModelWeights::bind(const gguf::File& f, const HParams& hp, const Shard& shard,
                                          backends::Backend& backend, bool allow_repack,
                                          std::shared_ptr<ColdStore> cold) {
  if (hp.encoder) return bind_encoder(f, hp, shard, backend, allow_repack);
  ModelWeights w;
  const uint64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ff = hp.n_ff, hd = hp.head_dim;
  const uint64_t n_q = static_cast<uint64_t>(hp.n_head) * hd;
  const uint64_t n_kv = static_cast<uint64_t>(hp.n_head_kv) * hd;

  // FFN slices are whole blocks of the down projections' columns (the experts' when routed).
  int ff_align = 1;
  const uint64_t n_ff_exp = hp.n_ff_exp, n_exp = hp.n_expert;
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const std::string name = "blk." + std::to_string(il) + (hp.is_moe() ? ".ffn_down_exps.weight" : ".ffn_down.weight");
    METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, hp.is_moe() ? find(f, name, {n_ff_exp, n_embd, n_exp})
                                                                 : find(f, name, {n_ff, n_embd}));
    METRO_ASSIGN_OR_RETURN(DType dt, matrix_type(*t, name));
    ff_align = std::max({ff_align, kernels::traits(dt).block_size,
                         kernels::traits(kernels::traits(dt).dot_partner).block_size});
  }
  METRO_ASSIGN_OR_RETURN(w.shard, ShardGeometry::resolve(shard, hp, ff_align));
  const ShardGeometry& g = w.shard;
  Binder b(f, backend, allow_repack, std::move(cold));

  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* embd, find(f, "token_embd.weight", {n_embd, n_vocab}));
  auto et = kernels::dtype_from_ggml(embd->type());
  if (!et || *et == DType::kQ8_1 || *et == DType::kQ8_K) {
    return unimplemented("tensor 'token_embd.weight' has unsupported type " +
                         std::string(embd->type_info.name));
  }
  backends::HostMatrix embd_m;
  embd_m.type = *et;
  embd_m.n_rows = static_cast<int64_t>(n_vocab);
  embd_m.n_cols = static_cast<int64_t>(n_embd);
  embd_m.data = embd->data;
  embd_m.row_stride = kernels::row_bytes(*et, static_cast<int64_t>(n_embd));
  if (!backend.reads(*et)) {
    return invalid_argument("tensor 'token_embd.weight' is " + std::string(kernels::dtype_name(*et)) + ", which the " +
                            std::string(backend.name()) + " backend does not read");
  }
  if (g.ends_model) {
    METRO_ASSIGN_OR_RETURN(w.output_norm, b.vector("output_norm.weight", n_embd));
    if (hp.tied_output) {
      w.output = backend.upload_matrix(embd_m, backends::MatrixUse::kProduct, allow_repack);
    } else {
      METRO_ASSIGN_OR_RETURN(w.output, b.matrix("output.weight", n_embd, n_vocab));
    }
  }
  if (g.starts_model()) {
    // A step reads a row per token: the table is cold under a budget, unless the head reads
    // these same bytes in place (a tied head not copied), which keeps them in anyway.
    backends::HostMatrix rows = embd_m;
    if (b.cold() && !reads_bytes(w.output.get(), embd->data)) rows.cold = b.cold();
    w.token_embd = backend.upload_matrix(rows, backends::MatrixUse::kRows, false);
  }
  if (hp.has_rope_freq_factors) {
    METRO_ASSIGN_OR_RETURN(w.rope_freqs, load_vector(f, "rope_freqs.weight", hp.n_rot / 2));
  }
  if (hp.has_longrope) {
    METRO_ASSIGN_OR_RETURN(w.rope_short, load_vector(f, "rope_factors_short.weight", hp.n_rot / 2));
    METRO_ASSIGN_OR_RETURN(w.rope_long, load_vector(f, "rope_factors_long.weight", hp.n_rot / 2));
  }
  // Frequencies are divided by these factors: each must be a positive finite number.
  for (const auto* factors : {&w.rope_freqs, &w.rope_short, &w.rope_long}) {
    for (float v : *factors) {
      if (!(v > 0.0f && std::isfinite(v))) return data_loss("model weights: a RoPE frequency factor is not a positive number");
    }
  }

  // This rank's rows of Q (its heads), of K and V (its KV heads), of gate and up (its FFN
  // columns); its columns of the output and down projections. All of them when unsliced.
  const int64_t q0 = int64_t{g.head_begin} * static_cast<int64_t>(hd), q1 = int64_t{g.head_end} * static_cast<int64_t>(hd);
  const int64_t k0 = int64_t{g.kv_head_begin} * static_cast<int64_t>(hd), k1 = int64_t{g.kv_head_end} * static_cast<int64_t>(hd);
  const int64_t f0 = g.ff_begin, f1 = g.ff_end;
  w.layers.resize(static_cast<size_t>(g.n_layer()));
  const std::vector<int> held = g.layers();
  for (size_t ix = 0; ix < held.size(); ++ix) {
    const int il = held[ix];
    LayerWeights& L = w.layers[ix];
    L.model_layer = il;
    const std::string p = "blk." + std::to_string(il) + ".";
    if (hp.pre_norms) {
      METRO_ASSIGN_OR_RETURN(L.attn_norm, b.vector(p + "attn_norm.weight", n_embd));
      METRO_ASSIGN_OR_RETURN(L.ffn_norm, b.vector(p + "ffn_norm.weight", n_embd));
    }
    if (hp.fused_qkv) {
      // Row ranges of one [n_q + 2 n_kv][n_embd] matrix: no copy where the backend reads in place.
      const std::string qkv = p + "attn_qkv.weight";
      const uint64_t n_all = n_q + 2 * n_kv;
      const int64_t kb = static_cast<int64_t>(n_q), vb = static_cast<int64_t>(n_q + n_kv);
      METRO_ASSIGN_OR_RETURN(L.wq, b.matrix(qkv, n_embd, n_all, q0, q1));
      METRO_ASSIGN_OR_RETURN(L.wk, b.matrix(qkv, n_embd, n_all, kb + k0, kb + k1));
      METRO_ASSIGN_OR_RETURN(L.wv, b.matrix(qkv, n_embd, n_all, vb + k0, vb + k1));
    } else {
      METRO_ASSIGN_OR_RETURN(L.wq, b.matrix(p + "attn_q.weight", n_embd, n_q, q0, q1));
      METRO_ASSIGN_OR_RETURN(L.wk, b.matrix(p + "attn_k.weight", n_embd, n_kv, k0, k1));
      METRO_ASSIGN_OR_RETURN(L.wv, b.matrix(p + "attn_v.weight", n_embd, n_kv, k0, k1));
    }
    METRO_ASSIGN_OR_RETURN(L.wo, b.matrix(p + "attn_output.weight", n_q, n_embd, 0, 0, q0, q1));
    if (hp.has_qkv_bias) {
      METRO_ASSIGN_OR_RETURN(L.bq, b.vector(p + "attn_q.bias", n_q, static_cast<uint64_t>(q0), static_cast<uint64_t>(q1)));
      METRO_ASSIGN_OR_RETURN(L.bk, b.vector(p + "attn_k.bias", n_kv, static_cast<uint64_t>(k0), static_cast<uint64_t>(k1)));
      METRO_ASSIGN_OR_RETURN(L.bv, b.vector(p + "attn_v.bias", n_kv, static_cast<uint64_t>(k0), static_cast<uint64_t>(k1)));
    }
    if (hp.qk_norm_full) {
      // One weight per element of Q and of K (the model refuses tensor-parallel slicing).
      METRO_ASSIGN_OR_RETURN(L.q_norm, b.vector(p + "attn_q_norm.weight", n_q));
      METRO_ASSIGN_OR_RETURN(L.k_norm, b.vector(p + "attn_k_norm.weight", n_kv));
    } else if (hp.has_qk_norm) {
      // One weight for every head: a shard's heads use all of it.
      METRO_ASSIGN_OR_RETURN(L.q_norm, b.vector(p + "attn_q_norm.weight", hd));
      METRO_ASSIGN_OR_RETURN(L.k_norm, b.vector(p + "attn_k_norm.weight", hd));
    }
    if (hp.has_post_norms) {
      METRO_ASSIGN_OR_RETURN(L.post_attn_norm, b.vector(p + "post_attention_norm.weight", n_embd));
      METRO_ASSIGN_OR_RETURN(L.post_ffn_norm, b.vector(p + "post_ffw_norm.weight", n_embd));
    }
    if (hp.is_moe()) {
      METRO_RETURN_IF_ERROR(bind_experts(b, hp, g, p, L));
    } else if (hp.fused_gate_up) {
      const int64_t ub = static_cast<int64_t>(n_ff);
      METRO_ASSIGN_OR_RETURN(L.w_gate, b.matrix(p + "ffn_up.weight", n_embd, 2 * n_ff, f0, f1));
      METRO_ASSIGN_OR_RETURN(L.w_up, b.matrix(p + "ffn_up.weight", n_embd, 2 * n_ff, ub + f0, ub + f1));
    } else {
      METRO_ASSIGN_OR_RETURN(L.w_gate, b.matrix(p + "ffn_gate.weight", n_embd, n_ff, f0, f1));
      METRO_ASSIGN_OR_RETURN(L.w_up, b.matrix(p + "ffn_up.weight", n_embd, n_ff, f0, f1));
    }
    if (!hp.is_moe()) {
      METRO_ASSIGN_OR_RETURN(L.w_down, b.matrix(p + "ffn_down.weight", n_ff, n_embd, 0, 0, f0, f1));
    }
  }
  w.n_expert_used = static_cast<int>(hp.n_expert_used);
  return w;
}

namespace {

// The embeddings' norm and every layer of an encoder (bind_encoder).
Expected<ModelWeights> bind_encoder_layers(const gguf::File& f, const HParams& hp, Binder& b, ModelWeights w) {
  const uint64_t n_embd = hp.n_embd, n_ff = hp.n_ff;
  METRO_ASSIGN_OR_RETURN(w.embd_norm, b.vector("token_embd_norm.weight", n_embd));
  METRO_ASSIGN_OR_RETURN(w.embd_norm_b, b.vector("token_embd_norm.bias", n_embd));
  // A bias where the file has one: null (no add) where it has none.
  auto bias = [&](const std::string& name, uint64_t n) -> Expected<std::unique_ptr<backends::DeviceVector>> {
    if (f.find_tensor(name) == nullptr) return std::unique_ptr<backends::DeviceVector>();
    return b.vector(name, n);
  };
  w.layers.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    L.model_layer = static_cast<int>(il);
    const std::string p = "blk." + std::to_string(il) + ".";
    if (hp.fused_qkv) {  // row ranges of one [3 n_embd][n_embd] matrix
      const std::string qkv = p + "attn_qkv.weight";
      const int64_t e = static_cast<int64_t>(n_embd);
      METRO_ASSIGN_OR_RETURN(L.wq, b.matrix(qkv, n_embd, 3 * n_embd, 0, e));
      METRO_ASSIGN_OR_RETURN(L.wk, b.matrix(qkv, n_embd, 3 * n_embd, e, 2 * e));
      METRO_ASSIGN_OR_RETURN(L.wv, b.matrix(qkv, n_embd, 3 * n_embd, 2 * e, 3 * e));
      if (f.find_tensor(p + "attn_qkv.bias") != nullptr) {
        return unimplemented("tensor '" + p + "attn_qkv.bias' (a fused QKV bias)");
      }
    } else {
      METRO_ASSIGN_OR_RETURN(L.wq, b.matrix(p + "attn_q.weight", n_embd, n_embd));
      METRO_ASSIGN_OR_RETURN(L.wk, b.matrix(p + "attn_k.weight", n_embd, n_embd));
      METRO_ASSIGN_OR_RETURN(L.wv, b.matrix(p + "attn_v.weight", n_embd, n_embd));
    }
    METRO_ASSIGN_OR_RETURN(L.wo, b.matrix(p + "attn_output.weight", n_embd, n_embd));
    if (f.find_tensor(p + "ffn_gate.weight") != nullptr) {
      METRO_ASSIGN_OR_RETURN(L.w_gate, b.matrix(p + "ffn_gate.weight", n_embd, n_ff));
    }
    METRO_ASSIGN_OR_RETURN(L.w_up, b.matrix(p + "ffn_up.weight", n_embd, n_ff));
    METRO_ASSIGN_OR_RETURN(L.w_down, b.matrix(p + "ffn_down.weight", n_ff, n_embd));
    METRO_ASSIGN_OR_RETURN(L.bq, bias(p + "attn_q.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.bk, bias(p + "attn_k.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.bv, bias(p + "attn_v.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.bo, bias(p + "attn_output.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.b_up, bias(p + "ffn_up.bias", n_ff));
    METRO_ASSIGN_OR_RETURN(L.b_down, bias(p + "ffn_down.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.attn_out_norm, b.vector(p + "attn_output_norm.weight", n_embd));
    METRO_ASSIGN_OR_RETURN(L.attn_out_norm_b, b.vector(p + "attn_output_norm.bias", n_embd));
    METRO_ASSIGN_OR_RETURN(L.out_norm, b.vector(p + "layer_output_norm.weight", n_embd));
    METRO_ASSIGN_OR_RETURN(L.out_norm_b, b.vector(p + "layer_output_norm.bias", n_embd));
  }
  return w;
}

}  // namespace

// An encoder's tensors as llama.cpp names BERT's: token_embd, position_embd, token_types,
// token_embd_norm; per layer attn_q/k/v (or one attn_qkv), attn_output, attn_output_norm,
// ffn_up (and ffn_gate: a SiLU-gated FFN), ffn_down, layer_output_norm; products' biases
// where the file has them. nomic-bert has no position_embd (it rotates queries and keys)
// and its token_types may be absent. Whole models only.
Expected<ModelWeights> ModelWeights::bind_encoder(const gguf::File& f, const HParams& hp, const Shard& shard,
                                                  backends::Backend& backend, bool allow_repack) {
  if (shard.layer_begin != 0 || (shard.layer_end != -1 && shard.layer_end != static_cast<int>(hp.n_layer)) ||
      shard.tp_size != 1 || !shard.skip.empty()) {
    return unimplemented("an encoder runs whole: it cannot be split into shards");
  }
  ModelWeights w;
  const uint64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ctx = hp.n_ctx_train;
  METRO_ASSIGN_OR_RETURN(w.shard, ShardGeometry::resolve(shard, hp, 1));
  Binder b(f, backend, allow_repack);

  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* embd, find(f, "token_embd.weight", {n_embd, n_vocab}));
  METRO_ASSIGN_OR_RETURN(DType et, matrix_type(*embd, "token_embd.weight"));
  if (!backend.reads(et)) {
    return invalid_argument("tensor 'token_embd.weight' is " + std::string(kernels::dtype_name(et)) + ", which the " +
                            std::string(backend.name()) + " backend does not read");
  }
  backends::HostMatrix embd_m;
  embd_m.type = et;
  embd_m.n_rows = static_cast<int64_t>(n_vocab);
  embd_m.n_cols = static_cast<int64_t>(n_embd);
  embd_m.data = embd->data;
  embd_m.row_stride = kernels::row_bytes(et, static_cast<int64_t>(n_embd));
  w.token_embd = backend.upload_matrix(embd_m, backends::MatrixUse::kRows, false);

  // Token type 0 (every input is one segment): summed into the position rows once here, or
  // added to every token where there are none.
  const gguf::TensorInfo* types = f.find_tensor("token_types.weight");
  if ((types == nullptr && !hp.encoder_rope) ||
      (types != nullptr && (types->n_dims != 2 || types->ne[0] != n_embd || types->ne[1] < 1))) {
    return data_loss("tensor 'token_types.weight' is missing or not [" + std::to_string(n_embd) + ", n_types]");
  }
  auto check_float = [](const gguf::TensorInfo* t) -> Status {
    auto dt = kernels::dtype_from_ggml(t->type());
    if (!dt || (*dt != DType::kF32 && *dt != DType::kF16 && *dt != DType::kBF16)) {
      return unimplemented("tensor '" + std::string(t->name) + "' has type " + std::string(t->type_info.name) +
                           "; position and token-type embeddings must be F32, F16 or BF16");
    }
    return {};
  };
  std::vector<float> type0(n_embd, 0.0f);
  if (types != nullptr) {
    METRO_RETURN_IF_ERROR(check_float(types));
    kernels::dequantize_row_ref(*kernels::dtype_from_ggml(types->type()), types->data, type0.data(),
                                static_cast<int64_t>(n_embd));
  }
  if (hp.encoder_rope) {
    if (types != nullptr) w.type0 = backend.upload_vector(type0);
    return bind_encoder_layers(f, hp, b, std::move(w));
  }
  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* pos, find(f, "position_embd.weight", {n_embd, n_ctx}));
  METRO_RETURN_IF_ERROR(check_float(pos));
  const DType pt = *kernels::dtype_from_ggml(pos->type());
  const size_t pos_stride = kernels::row_bytes(pt, static_cast<int64_t>(n_embd));
  w.pos_rows.resize(n_ctx * n_embd);
  for (uint64_t p = 0; p < n_ctx; ++p) {
    float* row = w.pos_rows.data() + p * n_embd;
    kernels::dequantize_row_ref(pt, pos->data + p * pos_stride, row, static_cast<int64_t>(n_embd));
    for (uint64_t i = 0; i < n_embd; ++i) row[i] += type0[i];
  }
  backends::HostMatrix pos_m;
  pos_m.type = DType::kF32;
  pos_m.n_rows = static_cast<int64_t>(n_ctx);
  pos_m.n_cols = static_cast<int64_t>(n_embd);
  pos_m.data = reinterpret_cast<const uint8_t*>(w.pos_rows.data());
  pos_m.row_stride = n_embd * sizeof(float);
  w.pos_embd = backend.upload_matrix(pos_m, backends::MatrixUse::kRows, false);
  return bind_encoder_layers(f, hp, b, std::move(w));
}

std::vector<const backends::DeviceMatrix*> ModelWeights::product_matrices() const {
  std::vector<const backends::DeviceMatrix*> all;
  if (output) all.push_back(output.get());
  for (const auto& L : layers) {
    for (const auto* m : L.matrices()) all.push_back(m);
  }
  return all;
}

std::vector<kernels::DType> ModelWeights::matmul_types() const {
  std::vector<kernels::DType> types;
  for (const auto* m : product_matrices()) {
    if (std::find(types.begin(), types.end(), m->type()) == types.end()) types.push_back(m->type());
  }
  return types;
}

namespace {

// Each product matrix once, with the share of tokens that read it: 1, or n_used / n_expert
// for an expert's.
template <class F>
void for_each_product(const ModelWeights& w, F&& f) {
  if (w.output) f(*w.output, 1.0);
  for (const auto& L : w.layers) {
    const double expert_share =
        L.exp_gate.empty() ? 0.0 : static_cast<double>(w.n_expert_used) / static_cast<double>(L.exp_gate.size());
    for (const auto* m : {L.wq.get(), L.wk.get(), L.wv.get(), L.wo.get(), L.router.get(), L.w_gate.get(), L.w_up.get(),
                          L.w_down.get()}) {
      if (m != nullptr) f(*m, 1.0);
    }
    for (size_t e = 0; e < L.exp_gate.size(); ++e) {
      f(*L.exp_gate[e], expert_share);
      f(*L.exp_up[e], expert_share);
      f(*L.exp_down[e], expert_share);
    }
  }
}

}  // namespace

uint64_t ModelWeights::bytes_per_token() const {
  double total = token_embd ? static_cast<double>(kernels::row_bytes(token_embd->type(), token_embd->n_cols())) : 0.0;
  for_each_product(*this, [&](const backends::DeviceMatrix& m, double share) {
    total += share * static_cast<double>(kernels::row_bytes(m.type(), m.n_cols())) * static_cast<double>(m.n_rows());
  });
  return static_cast<uint64_t>(total);
}

uint64_t ModelWeights::product_macs(bool with_head) const {
  double total = 0.0;
  for_each_product(*this, [&](const backends::DeviceMatrix& m, double share) {
    if (&m == output.get() && !with_head) return;
    total += share * static_cast<double>(m.n_rows()) * static_cast<double>(m.n_cols());
  });
  return static_cast<uint64_t>(total);
}

std::string ModelWeights::describe_layouts() const {
  std::map<std::string, int> counts;
  for (const auto* m : product_matrices()) counts[m->describe()]++;
  std::string s;
  for (const auto& [k, n] : counts) {
    if (!s.empty()) s += ", ";
    s += k + " (" + std::to_string(n) + ")";
  }
  return s;
}

}  // namespace metro::model
