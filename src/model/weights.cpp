#include "model/weights.h"

#include <map>

#include "base/fp16.h"
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

// A small vector (norm, bias, rope factors) converted to F32.
Expected<std::vector<float>> load_vector(const gguf::File& f, const std::string& name,
                                         uint64_t n) {
  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(f, name, {n}));
  auto dt = kernels::dtype_from_ggml(t->type());
  if (!dt || (*dt != DType::kF32 && *dt != DType::kF16 && *dt != DType::kBF16)) {
    return unimplemented("tensor '" + name + "' has type " + std::string(t->type_info.name) +
                         "; a norm/bias vector must be F32, F16 or BF16");
  }
  std::vector<float> out(n);
  kernels::dequantize_row_ref(*dt, t->data, out.data(), static_cast<int64_t>(n));
  return out;
}

Expected<kernels::Weight> load_matrix(const gguf::File& f, const std::string& name,
                                      uint64_t n_in, uint64_t n_out, bool allow_repack,
                                      const std::shared_ptr<BumpArena>& arena) {
  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, find(f, name, {n_in, n_out}));
  auto dt = kernels::dtype_from_ggml(t->type());
  if (!dt || *dt == DType::kQ8_1 || *dt == DType::kQ8_K) {
    return unimplemented("tensor '" + name + "' has type " + std::string(t->type_info.name) +
                         ", which metro cannot compute with yet");
  }
  return kernels::make_weight(*dt, t->data, static_cast<int64_t>(n_out),
                              static_cast<int64_t>(n_in), allow_repack, arena);
}

}  // namespace

Expected<ModelWeights> ModelWeights::bind(const gguf::File& f, const HParams& hp,
                                          bool allow_repack) {
  ModelWeights w;
  // Repacked matrices share huge pages: a 16 MiB chunk holds about seven of SmolLM2's layers.
  const auto arena = std::make_shared<BumpArena>();
  const uint64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ff = hp.n_ff;
  const uint64_t n_q = static_cast<uint64_t>(hp.n_head) * hp.head_dim;
  const uint64_t n_kv = static_cast<uint64_t>(hp.n_head_kv) * hp.head_dim;

  METRO_ASSIGN_OR_RETURN(const gguf::TensorInfo* embd, find(f, "token_embd.weight", {n_embd, n_vocab}));
  auto et = kernels::dtype_from_ggml(embd->type());
  if (!et || *et == DType::kQ8_1 || *et == DType::kQ8_K) {
    return unimplemented("tensor 'token_embd.weight' has unsupported type " +
                         std::string(embd->type_info.name));
  }
  w.embd_type = *et;
  w.token_embd = embd->data;
  w.token_embd_row_bytes = kernels::row_bytes(*et, static_cast<int64_t>(n_embd));
  METRO_ASSIGN_OR_RETURN(w.output_norm, load_vector(f, "output_norm.weight", n_embd));
  if (hp.tied_output) {
    w.output = kernels::make_weight(*et, embd->data, static_cast<int64_t>(n_vocab),
                                    static_cast<int64_t>(n_embd), allow_repack, arena);
  } else {
    METRO_ASSIGN_OR_RETURN(w.output, load_matrix(f, "output.weight", n_embd, n_vocab, allow_repack, arena));
  }
  if (hp.has_rope_freq_factors) {
    METRO_ASSIGN_OR_RETURN(w.rope_freqs, load_vector(f, "rope_freqs.weight", hp.n_rot / 2));
  }

  w.layers.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    LayerWeights& L = w.layers[il];
    const std::string p = "blk." + std::to_string(il) + ".";
    METRO_ASSIGN_OR_RETURN(L.attn_norm, load_vector(f, p + "attn_norm.weight", n_embd));
    METRO_ASSIGN_OR_RETURN(L.wq, load_matrix(f, p + "attn_q.weight", n_embd, n_q, allow_repack, arena));
    METRO_ASSIGN_OR_RETURN(L.wk, load_matrix(f, p + "attn_k.weight", n_embd, n_kv, allow_repack, arena));
    METRO_ASSIGN_OR_RETURN(L.wv, load_matrix(f, p + "attn_v.weight", n_embd, n_kv, allow_repack, arena));
    METRO_ASSIGN_OR_RETURN(L.wo, load_matrix(f, p + "attn_output.weight", n_q, n_embd, allow_repack, arena));
    if (hp.has_qkv_bias) {
      METRO_ASSIGN_OR_RETURN(L.bq, load_vector(f, p + "attn_q.bias", n_q));
      METRO_ASSIGN_OR_RETURN(L.bk, load_vector(f, p + "attn_k.bias", n_kv));
      METRO_ASSIGN_OR_RETURN(L.bv, load_vector(f, p + "attn_v.bias", n_kv));
    }
    METRO_ASSIGN_OR_RETURN(L.ffn_norm, load_vector(f, p + "ffn_norm.weight", n_embd));
    METRO_ASSIGN_OR_RETURN(L.w_gate, load_matrix(f, p + "ffn_gate.weight", n_embd, n_ff, allow_repack, arena));
    METRO_ASSIGN_OR_RETURN(L.w_up, load_matrix(f, p + "ffn_up.weight", n_embd, n_ff, allow_repack, arena));
    METRO_ASSIGN_OR_RETURN(L.w_down, load_matrix(f, p + "ffn_down.weight", n_ff, n_embd, allow_repack, arena));
  }
  return w;
}

std::vector<kernels::DType> ModelWeights::matmul_types() const {
  std::vector<kernels::DType> types;
  auto add = [&](const kernels::Weight& m) {
    for (auto t : types) {
      if (t == m.type) return;
    }
    types.push_back(m.type);
  };
  add(output);
  for (const auto& L : layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) add(*m);
  }
  return types;
}

uint64_t ModelWeights::bytes_per_token() const {
  auto bytes = [](const kernels::Weight& m) {
    return static_cast<uint64_t>(kernels::row_bytes(m.type, m.n_cols)) *
           static_cast<uint64_t>(m.n_rows);
  };
  uint64_t total = bytes(output) + token_embd_row_bytes;
  for (const auto& L : layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      total += bytes(*m);
    }
  }
  return total;
}

std::string ModelWeights::describe_layouts() const {
  std::map<std::string, int> counts;
  counts[output.describe()]++;
  for (const auto& L : layers) {
    for (const auto* m : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      counts[m->describe()]++;
    }
  }
  std::string s;
  for (const auto& [k, n] : counts) {
    if (!s.empty()) s += ", ";
    s += k + " (" + std::to_string(n) + ")";
  }
  return s;
}

}  // namespace metro::model
