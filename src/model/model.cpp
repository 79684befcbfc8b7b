#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "base/clock.h"
#include "base/log.h"
#include "kernels/quant_ref.h"

namespace metro::model {

namespace {

using kernels::DType;

// Rows [begin, end) of n owned by thread ith of nth; the same split in every phase, so a
// thread may chain elementwise work on its own rows without a barrier.
struct RowRange {
  int begin, end;
};
RowRange rows_of(int n, int ith, int nth) {
  return {static_cast<int>(static_cast<int64_t>(n) * ith / nth),
          static_cast<int>(static_cast<int64_t>(n) * (ith + 1) / nth)};
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

}  // namespace

Model::Model(gguf::File file, HParams hp, ModelWeights w)
    : file_(std::move(file)), hp_(std::move(hp)), w_(std::move(w)) {
  kernels::RopeConfig rc;
  rc.head_dim = static_cast<int>(hp_.head_dim);
  rc.n_rot = static_cast<int>(hp_.n_rot);
  rc.freq_base = hp_.rope_freq_base;
  rc.linear_scale = hp_.rope_scaling == RopeScaling::kLinear ? hp_.rope_scale_factor : 1.0f;
  rc.freq_factors = w_.rope_freqs.empty() ? nullptr : w_.rope_freqs.data();
  rc.mode = hp_.rope_type == RopeType::kNeox ? kernels::RopeMode::kNeox : kernels::RopeMode::kNormal;
  rope_ = std::make_unique<kernels::Rope>(rc);
}

Expected<std::unique_ptr<Model>> Model::load(const std::string& path, const ModelOptions& opts) {
  METRO_ASSIGN_OR_RETURN(gguf::File f, gguf::File::open(path));
  return from_file(std::move(f), opts);
}

Expected<std::unique_ptr<Model>> Model::from_file(gguf::File file, const ModelOptions& opts) {
  METRO_ASSIGN_OR_RETURN(HParams hp, HParams::from_gguf(file));
  METRO_ASSIGN_OR_RETURN(ModelWeights w, ModelWeights::bind(file, hp, opts.allow_repack));
  return std::unique_ptr<Model>(new Model(std::move(file), std::move(hp), std::move(w)));
}

Workspace Model::make_workspace(const WorkspaceLimits& lim) const {
  Workspace ws;
  ws.limits_ = lim;
  const size_t T = static_cast<size_t>(lim.max_tokens);
  const size_t L = static_cast<size_t>(lim.max_logits);
  const size_t n_embd = hp_.n_embd, n_q = static_cast<size_t>(hp_.n_head) * hp_.head_dim;
  const size_t n_kv = static_cast<size_t>(hp_.n_head_kv) * hp_.head_dim;
  ws.x.resize(T * n_embd);
  ws.xb.resize(T * n_embd);
  ws.tmp.resize(T * n_embd);
  ws.q.resize(T * n_q);
  ws.att.resize(T * n_q);
  ws.k.resize(T * n_kv);
  ws.v.resize(T * n_kv);
  ws.gate.resize(T * hp_.n_ff);
  ws.up.resize(T * hp_.n_ff);
  ws.xl.resize(L * n_embd);
  ws.logits.resize(L * hp_.n_vocab);
  ws.hidden.resize(T * n_embd);
  ws.rope_cs.resize(T * hp_.n_rot);
  size_t qa = 0;
  const int64_t widest = std::max<int64_t>({static_cast<int64_t>(n_embd), static_cast<int64_t>(n_q),
                                            static_cast<int64_t>(hp_.n_ff)});
  for (DType t : w_.matmul_types()) {
    qa = std::max(qa, kernels::quantized_acts_bytes(t, static_cast<int64_t>(std::max(T, L)), widest));
  }
  ws.qa0.resize(qa);
  ws.qa1.resize(qa);
  const size_t pages = static_cast<size_t>(lim.max_seqs) * static_cast<size_t>(lim.max_blocks_per_seq);
  ws.k_pages.resize(pages);
  ws.v_pages.resize(pages);
  ws.attn_seqs.resize(static_cast<size_t>(lim.max_seqs));
  ws.runs.reserve(static_cast<size_t>(lim.max_seqs));
  ws.logit_rows.reserve(L);
  // Per layer at most q, k, v, o, gate, up, down; then the head.
  ws.n_matmul_next = 7 * w_.layers.size() + 1;
  ws.matmul_next = std::make_unique<Workspace::MatmulCounter[]>(ws.n_matmul_next);
  ws.bytes_ = (ws.x.size() + ws.xb.size() + ws.tmp.size() + ws.q.size() + ws.att.size() +
               ws.k.size() + ws.v.size() + ws.gate.size() + ws.up.size() + ws.xl.size() +
               ws.logits.size() + ws.hidden.size() + ws.rope_cs.size()) * sizeof(float) + 2 * qa +
              2 * pages * sizeof(void*);
  return ws;
}

Status Model::plan(const Batch& b, const KvView& kv, Workspace& ws) const {
  const WorkspaceLimits& lim = ws.limits_;
  const int n = b.size();
  if (n == 0) return invalid_argument("empty batch");
  if (b.pos.size() != b.token.size() || b.seq.size() != b.token.size() ||
      b.logits.size() != b.token.size()) {
    return invalid_argument("batch arrays differ in length");
  }
  if (n > lim.max_tokens) {
    return resource_exhausted("batch of " + std::to_string(n) + " tokens exceeds the workspace (" +
                              std::to_string(lim.max_tokens) + ")");
  }
  if (kv.n_layer != static_cast<int>(hp_.n_layer) || kv.layout.n_head_kv != static_cast<int>(hp_.n_head_kv) ||
      kv.layout.head_dim != static_cast<int>(hp_.head_dim)) {
    return invalid_argument("KV view does not match the model's shape");
  }
  ws.runs.clear();
  ws.logit_rows.clear();
  const int bs = kv.layout.block_size;
  for (int i = 0; i < n; ++i) {
    if (b.token[static_cast<size_t>(i)] < 0 || b.token[static_cast<size_t>(i)] >= static_cast<int32_t>(hp_.n_vocab)) {
      return invalid_argument("token id " + std::to_string(b.token[static_cast<size_t>(i)]) +
                              " is outside the vocabulary");
    }
    const int s = b.seq[static_cast<size_t>(i)];
    const int64_t p = b.pos[static_cast<size_t>(i)];
    if (s < 0 || s >= static_cast<int>(kv.tables.size())) {
      return invalid_argument("sequence slot " + std::to_string(s) + " has no block table");
    }
    if (p < 0) return invalid_argument("negative position");
    if (b.logits[static_cast<size_t>(i)]) ws.logit_rows.push_back(i);
    if (!ws.runs.empty() && ws.runs.back().seq == s) {
      Workspace::Run& r = ws.runs.back();
      if (p != r.pos0 + r.n) return invalid_argument("positions of a sequence must be consecutive");
      ++r.n;
      continue;
    }
    for (const auto& r : ws.runs) {
      if (r.seq == s) return invalid_argument("a sequence's tokens must be contiguous in a batch");
    }
    if (static_cast<int>(ws.runs.size()) == lim.max_seqs) {
      return resource_exhausted("too many sequences in one step");
    }
    ws.runs.push_back({s, i, 1, p});
  }
  if (static_cast<int>(ws.logit_rows.size()) > lim.max_logits) {
    return resource_exhausted(std::to_string(ws.logit_rows.size()) +
                              " tokens want logits; the workspace holds " +
                              std::to_string(lim.max_logits));
  }
  size_t page_total = 0;
  for (const auto& r : ws.runs) {
    const int need = ceil_div(r.pos0 + r.n, bs);
    const auto& table = kv.tables[static_cast<size_t>(r.seq)];
    if (static_cast<int>(table.size()) < need) {
      return out_of_range("sequence slot " + std::to_string(r.seq) + " needs " + std::to_string(need) +
                          " KV blocks, its table has " + std::to_string(table.size()));
    }
    if (need > lim.max_blocks_per_seq) return resource_exhausted("sequence longer than the workspace");
    for (int j = 0; j < need; ++j) {
      if (table[static_cast<size_t>(j)] < 0 || table[static_cast<size_t>(j)] >= kv.n_blocks) {
        return out_of_range("block id outside the KV arena");
      }
    }
    page_total += static_cast<size_t>(need);
  }
  METRO_CHECK(page_total <= ws.k_pages.size());
  return {};
}

Expected<ForwardOutput> Model::forward(const Batch& b, const KvView& kv, Workspace& ws,
                                       ThreadPool& pool, const ForwardOptions& opts) const {
  METRO_RETURN_IF_ERROR(plan(b, kv, ws));
  const int T = b.size();
  const int n_embd = static_cast<int>(hp_.n_embd);
  const int n_head = static_cast<int>(hp_.n_head), n_head_kv = static_cast<int>(hp_.n_head_kv);
  const int hd = static_cast<int>(hp_.head_dim);
  const int n_q = n_head * hd, n_kv = n_head_kv * hd, n_ff = static_cast<int>(hp_.n_ff);
  const int n_vocab = static_cast<int>(hp_.n_vocab);
  const int n_logits = static_cast<int>(ws.logit_rows.size());
  const int bs = kv.layout.block_size;
  const float eps = hp_.rms_eps;
  const size_t n_runs = ws.runs.size();

  kernels::AttentionParams ap;
  ap.layout = kv.layout;
  ap.n_head = n_head;
  ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Page-pointer offsets of each run inside ws.k_pages / ws.v_pages.
  {
    size_t off = 0;
    for (size_t r = 0; r < n_runs; ++r) {
      const auto& run = ws.runs[r];
      kernels::AttentionSeq& s = ws.attn_seqs[r];
      s.q = ws.q.data() + static_cast<size_t>(run.start) * n_q;
      s.out = ws.att.data() + static_cast<size_t>(run.start) * n_q;
      s.n_q = run.n;
      s.pos0 = run.pos0;
      s.k_pages = ws.k_pages.data() + off;
      s.v_pages = ws.v_pages.data() + off;
      s.q_stride = static_cast<size_t>(n_q);
      s.out_stride = static_cast<size_t>(n_q);
      off += static_cast<size_t>(ceil_div(run.pos0 + run.n, bs));
    }
  }
  const std::span<const kernels::AttentionSeq> seqs(ws.attn_seqs.data(), n_runs);
  for (size_t i = 0; i < ws.n_matmul_next; ++i) ws.matmul_next[i].next.store(0, std::memory_order_relaxed);
  int64_t attention_ns = 0;  // thread 0's

  pool.run([&](int ith, int nth) {
    size_t n_matmuls = 0;  // every thread makes the same matmul calls in the same order
    const RowRange mine = rows_of(T, ith, nth);
    float* x = ws.x.data();
    float* xb = ws.xb.data();

    // Quantizes `src` (rows x k, row stride k) once per distinct dot-partner type and runs
    // each (weight, output) product; outputs have row stride weight.n_rows.
    struct Proj {
      const kernels::Weight* w;
      float* out;
    };
    auto project = [&](const float* src, int rows, int k, std::initializer_list<Proj> projs) {
      DType done[3];
      int n_done = 0;
      int buf = 0;
      for (const Proj& p : projs) {
        const DType partner = kernels::traits(p.w->type).dot_partner;
        bool seen = false;
        for (int d = 0; d < n_done; ++d) seen = seen || done[d] == partner;
        if (seen) continue;
        if (n_done == 2) pool.barrier();  // third partner type reuses buffer 0
        uint8_t* qbuf = (buf++ % 2 == 0) ? ws.qa0.data() : ws.qa1.data();
        const kernels::QuantizedActs qa =
            kernels::quantize_acts(p.w->type, src, rows, k, static_cast<size_t>(k), qbuf, ith, nth);
        pool.barrier();
        for (const Proj& o : projs) {
          if (kernels::traits(o.w->type).dot_partner != partner) continue;
          METRO_CHECK(n_matmuls < ws.n_matmul_next);
          kernels::matmul(*o.w, qa, o.out, static_cast<size_t>(o.w->n_rows), ith, nth,
                          &ws.matmul_next[n_matmuls++].next);
        }
        done[n_done++] = partner;
      }
      pool.barrier();
    };

    // Embeddings, RoPE angles (once per token for every layer), then the first layer's
    // attention norm on the same rows.
    const size_t n_rot = hp_.n_rot;
    for (int t = mine.begin; t < mine.end; ++t) {
      float* cs = ws.rope_cs.data() + static_cast<size_t>(t) * n_rot;
      rope_->angles(b.pos[static_cast<size_t>(t)], cs, cs + n_rot / 2);
      const uint8_t* row = w_.token_embd + static_cast<size_t>(b.token[static_cast<size_t>(t)]) * w_.token_embd_row_bytes;
      kernels::dequantize_row_ref(w_.embd_type, row, x + static_cast<size_t>(t) * n_embd, n_embd);
      kernels::rms_norm(x + static_cast<size_t>(t) * n_embd, w_.layers[0].attn_norm.data(),
                        xb + static_cast<size_t>(t) * n_embd, n_embd, eps);
    }
    pool.barrier();

    for (size_t il = 0; il < w_.layers.size(); ++il) {
      const LayerWeights& L = w_.layers[il];
      const int layer = static_cast<int>(il);
      project(xb, T, n_embd, {{&L.wq, ws.q.data()}, {&L.wk, ws.k.data()}, {&L.wv, ws.v.data()}});

      // Biases, RoPE, and K/V into this layer's pages; thread 0 also gathers page pointers.
      for (int t = mine.begin; t < mine.end; ++t) {
        float* qt = ws.q.data() + static_cast<size_t>(t) * n_q;
        float* kt = ws.k.data() + static_cast<size_t>(t) * n_kv;
        float* vt = ws.v.data() + static_cast<size_t>(t) * n_kv;
        if (!L.bq.empty()) {
          kernels::add(qt, L.bq.data(), qt, n_q);
          kernels::add(kt, L.bk.data(), kt, n_kv);
          kernels::add(vt, L.bv.data(), vt, n_kv);
        }
        const int64_t pos = b.pos[static_cast<size_t>(t)];
        const float* cs = ws.rope_cs.data() + static_cast<size_t>(t) * n_rot;
        rope_->apply(qt, n_head, cs, cs + n_rot / 2);
        rope_->apply(kt, n_head_kv, cs, cs + n_rot / 2);
        const auto& table = kv.tables[static_cast<size_t>(b.seq[static_cast<size_t>(t)])];
        const int32_t block = table[static_cast<size_t>(pos / bs)];
        const int slot = static_cast<int>(pos % bs);
        kernels::kv_store(kv.layout, kv.k_page(block, layer), slot, kt);
        kernels::kv_store(kv.layout, kv.v_page(block, layer), slot, vt);
      }
      if (ith == 0) {
        size_t off = 0;
        for (size_t r = 0; r < n_runs; ++r) {
          const auto& run = ws.runs[r];
          const auto& table = kv.tables[static_cast<size_t>(run.seq)];
          const int nb = ceil_div(run.pos0 + run.n, bs);
          for (int j = 0; j < nb; ++j) {
            ws.k_pages[off + static_cast<size_t>(j)] = kv.k_page(table[static_cast<size_t>(j)], layer);
            ws.v_pages[off + static_cast<size_t>(j)] = kv.v_page(table[static_cast<size_t>(j)], layer);
          }
          off += static_cast<size_t>(nb);
        }
      }
      pool.barrier();

      const int64_t attention_t0 = ith == 0 ? now_ns() : 0;
      kernels::attention(ap, seqs, ith, nth);
      pool.barrier();
      if (ith == 0) attention_ns += now_ns() - attention_t0;

      project(ws.att.data(), T, n_q, {{&L.wo, ws.tmp.data()}});
      for (int t = mine.begin; t < mine.end; ++t) {
        float* xt = x + static_cast<size_t>(t) * n_embd;
        kernels::add(xt, ws.tmp.data() + static_cast<size_t>(t) * n_embd, xt, n_embd);
        kernels::rms_norm(xt, L.ffn_norm.data(), xb + static_cast<size_t>(t) * n_embd, n_embd, eps);
      }
      pool.barrier();

      project(xb, T, n_embd, {{&L.w_gate, ws.gate.data()}, {&L.w_up, ws.up.data()}});
      for (int t = mine.begin; t < mine.end; ++t) {
        float* g = ws.gate.data() + static_cast<size_t>(t) * n_ff;
        kernels::swiglu(g, ws.up.data() + static_cast<size_t>(t) * n_ff, g, n_ff);
      }
      pool.barrier();

      project(ws.gate.data(), T, n_ff, {{&L.w_down, ws.tmp.data()}});
      const bool last = il + 1 == w_.layers.size();
      for (int t = mine.begin; t < mine.end; ++t) {
        float* xt = x + static_cast<size_t>(t) * n_embd;
        kernels::add(xt, ws.tmp.data() + static_cast<size_t>(t) * n_embd, xt, n_embd);
        if (!last) {
          kernels::rms_norm(xt, w_.layers[il + 1].attn_norm.data(),
                            xb + static_cast<size_t>(t) * n_embd, n_embd, eps);
        } else if (opts.want_hidden) {
          kernels::rms_norm(xt, w_.output_norm.data(),
                            ws.hidden.data() + static_cast<size_t>(t) * n_embd, n_embd, eps);
        }
      }
      pool.barrier();
    }

    if (n_logits > 0) {
      const RowRange lr = rows_of(n_logits, ith, nth);
      for (int r = lr.begin; r < lr.end; ++r) {
        const int t = ws.logit_rows[static_cast<size_t>(r)];
        kernels::rms_norm(x + static_cast<size_t>(t) * n_embd, w_.output_norm.data(),
                          ws.xl.data() + static_cast<size_t>(r) * n_embd, n_embd, eps);
      }
      pool.barrier();
      project(ws.xl.data(), n_logits, n_embd, {{&w_.output, ws.logits.data()}});
    }
  });

  ForwardOutput out;
  out.logits = ws.logits.data();
  out.n_rows = n_logits;
  out.n_vocab = n_vocab;
  out.batch_index = std::span<const int>(ws.logit_rows.data(), ws.logit_rows.size());
  out.hidden = opts.want_hidden ? ws.hidden.data() : nullptr;
  out.attention_s = static_cast<double>(attention_ns) * 1e-9;
  return out;
}

SequenceKv::SequenceKv(const HParams& hp, int n_ctx, kernels::DType type, int block_size) {
  view_.layout.type = type;
  view_.layout.block_size = block_size;
  view_.layout.n_head_kv = static_cast<int>(hp.n_head_kv);
  view_.layout.head_dim = static_cast<int>(hp.head_dim);
  view_.n_layer = static_cast<int>(hp.n_layer);
  const int n_blocks = (n_ctx + block_size - 1) / block_size;
  view_.n_blocks = n_blocks;
  arena_.resize(view_.block_bytes() * static_cast<size_t>(n_blocks));
  view_.arena = arena_.data();
  table_.resize(static_cast<size_t>(n_blocks));
  for (int i = 0; i < n_blocks; ++i) table_[static_cast<size_t>(i)] = i;
  view_.tables = {std::span<const int32_t>(table_)};
  capacity_ = n_blocks * block_size;
}

}  // namespace metro::model
