#include "support/synthetic_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gguf/writer.h"
#include "kernels/quant_ref.h"

namespace metro::testing {

namespace {

std::vector<uint8_t> quantized(kernels::DType t, const std::vector<float>& v, int64_t cols) {
  const int64_t rows = static_cast<int64_t>(v.size()) / cols;
  const size_t rb = kernels::row_bytes(t, cols);
  std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    kernels::quantize_row_ref(t, v.data() + r * cols, out.data() + static_cast<size_t>(r) * rb, cols);
  }
  return out;
}

}  // namespace

std::vector<uint8_t> make_synthetic_model(const SyntheticModelSpec& s) {
  std::mt19937 rng(static_cast<uint32_t>(s.seed));
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::mt19937 norm_rng(static_cast<uint32_t>(s.seed) + 7919u);
  std::normal_distribution<float> norm_nd(0.0f, 1.0f);
  gguf::Writer w;
  const std::string a = s.arch + ".";
  w.add_string("general.architecture", s.arch);
  w.add_string("general.name", "synthetic");
  w.add_u32(a + "embedding_length", s.n_embd);
  w.add_u32(a + "block_count", s.n_layer);
  w.add_u32(a + "attention.head_count", s.n_head);
  w.add_u32(a + "attention.head_count_kv", s.n_head_kv);
  w.add_u32(a + "feed_forward_length", s.n_ff);
  w.add_u32(a + "context_length", s.n_ctx);
  if (s.write_vocab_size) w.add_u32(a + "vocab_size", s.n_vocab);
  w.add_f32(a + "rope.freq_base", s.rope_base);
  if (s.sliding_window != 0) w.add_u32(a + "attention.sliding_window", s.sliding_window);
  if (s.yarn_factor > 1.0f) {
    w.add_string(a + "rope.scaling.type", "yarn");
    w.add_f32(a + "rope.scaling.factor", s.yarn_factor);
    w.add_u32(a + "rope.scaling.original_context_length", s.yarn_orig_ctx);
  }
  if (s.longrope_orig_ctx != 0) w.add_u32(a + "rope.scaling.original_context_length", s.longrope_orig_ctx);
  if (s.rope_attn_factor != 0) w.add_f32(a + "rope.scaling.attn_factor", s.rope_attn_factor);
  if (s.attn_softcap >= 0) w.add_f32(a + "attn_logit_softcapping", s.attn_softcap);
  if (s.final_softcap >= 0) w.add_f32(a + "final_logit_softcapping", s.final_softcap);
  if (s.head_dim != 0) {
    w.add_u32(a + "attention.key_length", s.head_dim);
    w.add_u32(a + "attention.value_length", s.head_dim);
  }
  w.add_f32(a + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (s.n_expert > 0) {
    w.add_u32(a + "expert_count", s.n_expert);
    w.add_u32(a + "expert_used_count", s.n_expert_used);
    w.add_u32(a + "expert_feed_forward_length", s.n_ff_exp);
    if (s.n_ff_shexp > 0) w.add_u32(a + "expert_shared_feed_forward_length", s.n_ff_shexp);
    if (s.expert_weights_norm >= 0) w.add_bool(a + "expert_weights_norm", s.expert_weights_norm == 1);
    if (s.expert_gating != 0) w.add_u32(a + "expert_gating_func", s.expert_gating);
  }
  std::vector<std::string> toks;
  const uint32_t n_tokens = s.n_tokens > 0 ? s.n_tokens : s.n_vocab;
  for (uint32_t i = 0; i < n_tokens; ++i) toks.push_back("t" + std::to_string(i));
  w.add_string("tokenizer.ggml.model", "gpt2");
  w.add_string_array("tokenizer.ggml.tokens", toks);
  w.add_string("tokenizer.ggml.pre", "default");
  w.add_string_array("tokenizer.ggml.merges", {});  // none, but present: a usable tokenizer

  auto add = [&](const std::string& name, kernels::DType t, std::vector<uint64_t> dims, float scale,
                 SyntheticModelSpec::Cols zero = {}) {
    uint64_t n = 1;
    for (auto d : dims) n *= d;
    std::vector<float> v(n);
    for (auto& x : v) x = nd(rng) * scale;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t col = i % dims[0];
      if (col >= zero.begin && col < zero.end) v[i] = 0.0f;
    }
    auto bytes = quantized(t, v, static_cast<int64_t>(dims[0]));
    auto st = w.add_tensor(name, kernels::traits(t).ggml, dims, bytes);
    (void)st;
  };
  auto add_norm = [&](const std::string& name, uint64_t n) {
    std::vector<float> v(n);
    for (auto& x : v) x = 1.0f + 0.1f * nd(rng);
    auto st = w.add_tensor(name, gguf::GgmlType::kF32, {n},
                           {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4});
    (void)st;
  };
  const uint64_t hd = s.head_dim != 0 ? s.head_dim : s.n_embd / s.n_head;
  const uint64_t nq = s.n_head * hd, nkv = s.n_head_kv * hd;
  const float ws = 1.0f / std::sqrt(static_cast<float>(s.n_embd));
  add("token_embd.weight", s.embd_type, {s.n_embd, s.n_vocab}, 1.0f);
  add_norm("output_norm.weight", s.n_embd);
  if (s.longrope_orig_ctx != 0) {
    const uint64_t half = hd / 2;
    std::vector<float> short_f(half), long_f(half);
    for (uint64_t i = 0; i < half; ++i) {
      const float x = static_cast<float>(i) / static_cast<float>(half);
      short_f[i] = 1.0f + 0.3f * x;
      long_f[i] = 1.0f + 19.0f * x * x;
    }
    for (const auto& [name, v] : {std::pair{"rope_factors_short.weight", &short_f}, std::pair{"rope_factors_long.weight", &long_f}}) {
      auto st = w.add_tensor(name, gguf::GgmlType::kF32, {half},
                             {reinterpret_cast<const uint8_t*>(v->data()), v->size() * 4});
      (void)st;
    }
  }
  if (!s.tied_output) add("output.weight", s.matrix_type, {s.n_embd, s.n_vocab}, ws);
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const std::string p = "blk." + std::to_string(il) + ".";
    add_norm(p + "attn_norm.weight", s.n_embd);
    if (s.fused) {
      add(p + "attn_qkv.weight", s.matrix_type, {s.n_embd, nq + 2 * nkv}, ws);
    } else {
      add(p + "attn_q.weight", s.matrix_type, {s.n_embd, nq}, ws);
      add(p + "attn_k.weight", s.matrix_type, {s.n_embd, nkv}, ws);
      add(p + "attn_v.weight", s.matrix_type, {s.n_embd, nkv}, ws);
    }
    if (s.qkv_bias) {
      add(p + "attn_q.bias", kernels::DType::kF32, {nq}, 0.1f);
      add(p + "attn_k.bias", kernels::DType::kF32, {nkv}, 0.1f);
      add(p + "attn_v.bias", kernels::DType::kF32, {nkv}, 0.1f);
    }
    if (s.qk_norm) {
      // From a generator of their own: the other weights stay those of the same spec
      // without the norms.
      for (const char* n : {"attn_q_norm.weight", "attn_k_norm.weight"}) {
        std::vector<float> v(hd);
        for (auto& x : v) x = 1.0f + 0.3f * norm_nd(norm_rng);
        auto st = w.add_tensor(p + n, gguf::GgmlType::kF32, {hd},
                               {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4});
        (void)st;
      }
    }
    add(p + "attn_output.weight", s.matrix_type, {nq, s.n_embd}, ws, s.zero_attn_output_cols);
    add_norm(p + "ffn_norm.weight", s.n_embd);
    if (s.post_norms) {
      add_norm(p + "post_attention_norm.weight", s.n_embd);
      add_norm(p + "post_ffw_norm.weight", s.n_embd);
    }
    if (s.n_expert > 0) {
      const uint64_t ne = s.n_expert;
      add(p + "ffn_gate_inp.weight", kernels::DType::kF32, {s.n_embd, ne}, 4.0f * ws);
      add(p + "ffn_gate_exps.weight", s.expert_type, {s.n_embd, s.n_ff_exp, ne}, ws);
      add(p + "ffn_up_exps.weight", s.expert_type, {s.n_embd, s.n_ff_exp, ne}, ws);
      add(p + "ffn_down_exps.weight", s.expert_type, {s.n_ff_exp, s.n_embd, ne},
          1.0f / std::sqrt(static_cast<float>(s.n_ff_exp)), s.zero_ffn_down_cols);
      if (s.n_ff_shexp > 0) {
        if (s.shexp_gate) add(p + "ffn_gate_inp_shexp.weight", kernels::DType::kF32, {s.n_embd}, ws);
        add(p + "ffn_gate_shexp.weight", s.matrix_type, {s.n_embd, s.n_ff_shexp}, ws);
        add(p + "ffn_up_shexp.weight", s.matrix_type, {s.n_embd, s.n_ff_shexp}, ws);
        add(p + "ffn_down_shexp.weight", s.matrix_type, {s.n_ff_shexp, s.n_embd},
            1.0f / std::sqrt(static_cast<float>(s.n_ff_shexp)));
      }
      continue;
    }
    if (s.fused) {
      add(p + "ffn_up.weight", s.matrix_type, {s.n_embd, 2 * uint64_t{s.n_ff}}, ws);
    } else {
      add(p + "ffn_gate.weight", s.matrix_type, {s.n_embd, s.n_ff}, ws);
      add(p + "ffn_up.weight", s.matrix_type, {s.n_embd, s.n_ff}, ws);
    }
    add(p + "ffn_down.weight", s.matrix_type, {s.n_ff, s.n_embd}, 1.0f / std::sqrt(static_cast<float>(s.n_ff)),
        s.zero_ffn_down_cols);
  }
  return w.serialize();
}

SyntheticModelSpec qwen3moe_spec(kernels::DType type) {
  SyntheticModelSpec spec;
  spec.arch = "qwen3moe";
  spec.qk_norm = true;
  spec.tied_output = false;
  spec.n_expert = 8;
  spec.n_expert_used = 2;
  spec.n_ff_exp = 96;
  spec.matrix_type = type;
  spec.expert_type = type;
  return spec;
}

LoadedSynthetic load_synthetic(const SyntheticModelSpec& spec) {
  LoadedSynthetic l;
  l.bytes = make_synthetic_model(spec);
  auto f = gguf::File::parse(l.bytes);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return l;
  auto m = model::Model::from_file(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.status().message();
  if (m.ok()) l.model = std::move(*m);
  return l;
}

std::vector<int32_t> random_tokens(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (auto& x : t) x = static_cast<int32_t>(rng() % static_cast<uint32_t>(vocab));
  return t;
}

}  // namespace metro::testing
