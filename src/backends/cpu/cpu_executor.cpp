// The CPU executor. A whole step runs inside one ThreadPool::run: a model step is a few
// hundred short ops, and one fork/join per step costs less than one per op. Every thread
// walks the same op sequence; ops are grouped into phases separated by a spin barrier:
//  - a run of consecutive elementwise ops over the same rows is one phase: each thread
//    takes the same share of the rows (rows_of) for all of them and chains the ops on a
//    row while it is in cache, so they need no barrier between them;
//  - each Project, Attention and AllReduce is a phase of its own; a Moe op is several
//    (moe()).
// Matrix products are not split in fixed equal shares: the threads claim runs of each
// product from a per-product counter in the state (zeroed before the step), so a thread
// that loses its core for a moment does less of it instead of holding the others at the
// next barrier; every element is computed the same way, so bits do not depend on who
// computed it. Attention keeps its static cost-balanced split.
#include <algorithm>
#include <cmath>
#include <variant>

#include "backends/cpu/cpu_backend_impl.h"
#include "backends/validate.h"
#include "base/check.h"
#include "base/clock.h"
#include "base/thread_pool.h"
#include "dist/communicator.h"
#include "kernels/encoder.h"
#include "kernels/ops.h"
#include "kernels/quant_ref.h"

namespace metro::backends::cpu {

namespace {

using kernels::DType;

struct RowRange {
  int begin, end;
};
// Rows [begin, end) of n owned by thread ith of nth: the same split in every phase.
RowRange rows_of(int n, int ith, int nth) {
  return {static_cast<int>(static_cast<int64_t>(n) * ith / nth),
          static_cast<int>(static_cast<int64_t>(n) * (ith + 1) / nth)};
}

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Slot rows per piece of an expert's product: enough rows that a piece's weights are read
// for many activations, few enough that a busy expert spreads over the threads.
constexpr int kPieceRows = 64;

const CpuMatrix& cpu_matrix(const DeviceMatrix* m) { return static_cast<const CpuMatrix&>(*m); }
const float* cpu_vector(const DeviceVector* v) { return static_cast<const CpuVector&>(*v).values.data(); }

// One thread's walk through a step's ops.
class Executor {
 public:
  Executor(const kernels::KernelSet& ks, CpuState& st, const StepDesc& step, std::span<const Op> ops,
           ThreadPool& pool, StepObserver* observer, int ith, int nth)
      : ks_(ks),
        st_(st),
        step_(step),
        ops_(ops),
        pool_(pool),
        observer_(observer),
        timing_(observer != nullptr && ith == 0),
        ith_(ith),
        nth_(nth),
        n_tokens_(static_cast<int>(step.token.size())),
        n_logits_(static_cast<int>(step.logit_rows.size())) {}

  void run() {
    const size_t n = ops_.size();
    if (n > 0 && std::holds_alternative<AttentionOp>(ops_[0])) {
      if (ith_ == 0) prepare_attention(std::get<AttentionOp>(ops_[0]));
      pool_.barrier();
    }
    size_t i = 0;
    while (i < n) {
      const OpKind kind = kind_of(ops_[i]);
      const int64_t t0 = timing_ ? now_ns() : 0;
      size_t j = i + 1;
      if (is_elementwise(kind)) {
        const RowSet rows = row_set(ops_[i]);
        while (j < n && is_elementwise(kind_of(ops_[j])) && row_set(ops_[j]) == rows) ++j;
        run_elementwise(i, j, rows);
      } else {
        run_global(ops_[i]);
      }
      // Thread 0 lays out the next attention's pages while the others finish this phase.
      int64_t prep_ns = 0;
      if (j < n && ith_ == 0 && std::holds_alternative<AttentionOp>(ops_[j])) {
        const int64_t p0 = timing_ ? now_ns() : 0;
        prepare_attention(std::get<AttentionOp>(ops_[j]));
        if (timing_) prep_ns = now_ns() - p0;
      }
      // The last phase needs no barrier (run() joins), unless it is being timed.
      if (j < n || observer_ != nullptr) {
        const int64_t tb = timing_ ? now_ns() : 0;
        pool_.barrier();
        if (timing_) {
          const int64_t te = now_ns();
          if (is_elementwise(kind)) {
            observer_->wait_timed(te - tb);
          } else {
            observer_->op_timed(i, kind, te - t0 - prep_ns + (kind == OpKind::kAttention ? pending_prep_ns_ : 0));
          }
        }
      }
      pending_prep_ns_ = prep_ns;
      i = j;
    }
  }

 private:
  // Ops [i, j), all elementwise over `rows`: row by row, or op by op when observed (the
  // same arithmetic on every row either way, so the same bits).
  void run_elementwise(size_t i, size_t j, RowSet rows) {
    const RowRange mine = rows_of(rows == RowSet::kTokens ? n_tokens_ : n_logits_, ith_, nth_);
    if (observer_ == nullptr) {
      for (int r = mine.begin; r < mine.end; ++r) {
        for (size_t o = i; o < j; ++o) std::visit([&](const auto& op) { row_op(op, r); }, ops_[o]);
      }
      return;
    }
    for (size_t o = i; o < j; ++o) {
      const int64_t t0 = timing_ ? now_ns() : 0;
      for (int r = mine.begin; r < mine.end; ++r) std::visit([&](const auto& op) { row_op(op, r); }, ops_[o]);
      if (timing_) observer_->op_timed(o, kind_of(ops_[o]), now_ns() - t0);
    }
  }

  void run_global(const Op& op) {
    if (const auto* p = std::get_if<ProjectOp>(&op)) {
      project(*p);
    } else if (const auto* a = std::get_if<AttentionOp>(&op)) {
      kernels::AttentionParams ap;
      ap.layout = step_.kv->layout;
      ap.n_head = a->n_head;
      ap.scale = a->scale;
      ap.window = a->window;
      ap.softcap = a->softcap;
      const auto& seqs = st_.seqs[static_cast<size_t>(attention_++ % 2)];
      ks_.attention(ap, std::span<const kernels::AttentionSeq>(seqs.data(), step_.runs.size()), ith_, nth_);
    } else if (const auto* e = std::get_if<EncoderAttentionOp>(&op)) {
      encoder_attention(*e);
    } else if (const auto* m = std::get_if<MoeOp>(&op)) {
      moe(*m);
    } else if (const auto* l = std::get_if<LoraOp>(&op)) {
      lora(*l);
    } else if (const auto* r = std::get_if<AllReduceOp>(&op)) {
      if (ith_ == 0) {
        r->comm->all_reduce_sum({st_.act(r->x), static_cast<size_t>(n_tokens_) * st_.cols(r->x)});
      }
    }
  }

  // Quantizes the input once per distinct dot-partner type, then runs each product of that
  // partner; the products' outputs are written in full before the phase's closing barrier.
  void project(const ProjectOp& p) {
    const int rows = p.rows == RowSet::kTokens ? n_tokens_ : n_logits_;
    const float* src = st_.act(p.src);
    const size_t k = st_.cols(p.src);
    DType done[3];
    int n_done = 0;
    int buf = 0;
    for (int a = 0; a < p.n_out; ++a) {
      const DType type = cpu_matrix(p.w[static_cast<size_t>(a)]).weight.type;
      const DType partner = kernels::traits(type).dot_partner;
      if (std::find(done, done + n_done, partner) != done + n_done) continue;
      if (n_done == 2) pool_.barrier();  // a third partner type reuses buffer 0
      uint8_t* qbuf = st_.qa[static_cast<size_t>(buf++ % 2)].data();
      const kernels::QuantizedActs qa =
          ks_.quantize_acts(type, src, rows, static_cast<int64_t>(k), k, qbuf, ith_, nth_);
      pool_.barrier();
      for (int o = 0; o < p.n_out; ++o) {
        const kernels::Weight& w = cpu_matrix(p.w[static_cast<size_t>(o)]).weight;
        if (kernels::traits(w.type).dot_partner != partner) continue;
        const ActId dst = p.dst[static_cast<size_t>(o)];
        ks_.matmul(w, qa, st_.act(dst), st_.cols(dst), ith_, nth_, &st_.counters[static_cast<size_t>(product_ + o)].next);
      }
      done[n_done++] = partner;
    }
    product_ += p.n_out;
  }

  // A MoeOp in phases, each closed by a barrier: every thread routes its tokens; thread 0
  // groups the choices by expert into slots and cuts each chosen expert's products into
  // pieces; the slots' inputs are gathered and quantized; the gate and up products run,
  // then SwiGLU, quantizing and the down products; each token sums its slots. A piece is a
  // static share of one expert's product (kernels::matmul's ith of nth, no work counter),
  // claimed whole from one counter: a decode step's few rows per expert make each piece a
  // whole matrix streamed by one thread, while an expert with many rows is cut so that no
  // thread is left holding it alone. Every element is computed the same way in any piece.
  void moe(const MoeOp& o) {
    const int k = o.n_used, n_exp = o.experts->size();
    const RowRange mine = rows_of(n_tokens_, ith_, nth_);
    for (int t = mine.begin; t < mine.end; ++t) route(o, t);
    pool_.barrier();
    if (ith_ == 0) {
      group_by_expert(n_exp, k);
      touch_cold_experts(*o.experts, n_exp);
    }
    pool_.barrier();

    const int n_slots = n_tokens_ * k;
    const kernels::Weight& g0 = cpu_matrix(o.experts->gate[0]).weight;
    const kernels::Weight& u0 = cpu_matrix(o.experts->up[0]).weight;
    const kernels::Weight& d0 = cpu_matrix(o.experts->down[0]).weight;
    const size_t n_in = static_cast<size_t>(g0.n_cols), n_ff = static_cast<size_t>(g0.n_rows);
    float* in = st_.act(o.slot_in);
    float* gate = st_.act(o.slot_gate);
    float* up = st_.act(o.slot_up);
    float* out = st_.act(o.slot_out);
    const RowRange slots = rows_of(n_slots, ith_, nth_);
    for (int s = slots.begin; s < slots.end; ++s) {
      const float* x = row(o.src, st_.moe_slot_token[static_cast<size_t>(s)]);
      std::copy(x, x + n_in, in + static_cast<size_t>(s) * n_in);
    }
    pool_.barrier();
    const kernels::QuantizedActs qg =
        ks_.quantize_acts(g0.type, in, n_slots, static_cast<int64_t>(n_in), n_in, st_.qa[0].data(), ith_, nth_);
    const bool own_up = kernels::traits(u0.type).dot_partner != kernels::traits(g0.type).dot_partner;
    const kernels::QuantizedActs qu =
        own_up ? ks_.quantize_acts(u0.type, in, n_slots, static_cast<int64_t>(n_in), n_in, st_.qa[1].data(), ith_, nth_)
               : qg;
    pool_.barrier();
    // Items: each piece of each expert, gate then up.
    const int n_pieces = st_.moe_piece_off[static_cast<size_t>(n_exp)];
    for (;;) {
      const int item = static_cast<int>(st_.moe_counters[0].next.fetch_add(1, std::memory_order_relaxed));
      if (item >= 2 * n_pieces) break;
      const Piece pc = piece(item / 2, n_exp);
      const bool is_up = item % 2 == 1;
      const ExpertSet& x = *o.experts;
      ks_.matmul(cpu_matrix((is_up ? x.up : x.gate)[static_cast<size_t>(pc.expert)]).weight,
                 kernels::acts_rows(is_up ? qu : qg, pc.first, pc.n), (is_up ? up : gate) + static_cast<size_t>(pc.first) * n_ff,
                 n_ff, pc.piece, pc.of, nullptr);
    }
    pool_.barrier();
    for (int s = slots.begin; s < slots.end; ++s) {
      float* g = gate + static_cast<size_t>(s) * n_ff;
      ks_.swiglu(g, up + static_cast<size_t>(s) * n_ff, g, static_cast<int64_t>(n_ff));
    }
    pool_.barrier();
    const kernels::QuantizedActs qd =
        ks_.quantize_acts(d0.type, gate, n_slots, static_cast<int64_t>(n_ff), n_ff, st_.qa[0].data(), ith_, nth_);
    pool_.barrier();
    for (;;) {
      const int item = static_cast<int>(st_.moe_counters[1].next.fetch_add(1, std::memory_order_relaxed));
      if (item >= n_pieces) break;
      const Piece pc = piece(item, n_exp);
      ks_.matmul(cpu_matrix(o.experts->down[static_cast<size_t>(pc.expert)]).weight, kernels::acts_rows(qd, pc.first, pc.n),
                 out + static_cast<size_t>(pc.first) * n_in, n_in, pc.piece, pc.of, nullptr);
    }
    pool_.barrier();
    for (int t = mine.begin; t < mine.end; ++t) {
      float* y = row(o.dst, t);
      for (int j = 0; j < k; ++j) {
        const size_t c = static_cast<size_t>(t * k + j);
        const float w = st_.moe_weight[c];
        const float* x = out + static_cast<size_t>(st_.moe_slot[c]) * n_in;
        if (j == 0) {
          for (size_t i = 0; i < n_in; ++i) y[i] = w * x[i];
        } else {
          for (size_t i = 0; i < n_in; ++i) y[i] += w * x[i];
        }
      }
    }
  }

  // Piece `index` of the step's expert products: its expert, slot rows and share.
  struct Piece {
    int expert;
    int64_t first, n;  // slot rows
    int piece, of;
  };
  Piece piece(int index, int n_exp) const {
    const int32_t* po = st_.moe_piece_off.data();
    const int e = static_cast<int>(std::upper_bound(po, po + n_exp + 1, index) - po) - 1;
    const int32_t* off = st_.moe_offset.data();
    return {e, off[e], off[e + 1] - off[e], index - po[e], po[e + 1] - po[e]};
  }

  // A LoraOp in phases closed by barriers: each adapter's rows (grouped by adapter in
  // execute()) are gathered, unless every adapter's rows already lie together in the row
  // set; each adapter's A products over its rows (static shares: rank rows are few); then
  // every thread takes its own columns of each B product and adds them to the outputs, so
  // the products and the adds need no barrier between them.
  void lora(const LoraOp& o) {
    const LoraGroups& gr = st_.lora_groups[o.rows == RowSet::kTokens ? 0 : 1];
    const int n = gr.off.empty() ? 0 : gr.off.back();
    if (n == 0) return;
    const int n_adapters = static_cast<int>(gr.off.size()) - 1;
    const size_t k = st_.cols(o.src);
    const size_t mid_stride = st_.cols(o.scratch_mid), out_stride = st_.cols(o.scratch_out);
    const size_t max_rank = mid_stride / 3;
    float* mid = st_.act(o.scratch_mid);
    float* out = st_.act(o.scratch_out);
    // Row i of the grouped order: in the source itself when the groups lie together.
    const float* in = st_.act(o.src);
    size_t in_stride = k;
    if (!gr.contiguous) {
      in = st_.act(o.scratch_in);
      in_stride = st_.cols(o.scratch_in);
      const RowRange mine = rows_of(n, ith_, nth_);
      for (int i = mine.begin; i < mine.end; ++i) {
        const float* x = row(o.src, gr.rows[static_cast<size_t>(i)]);
        std::copy(x, x + k, st_.act(o.scratch_in) + static_cast<size_t>(i) * in_stride);
      }
      pool_.barrier();
    }
    const size_t row0 = gr.contiguous ? static_cast<size_t>(gr.rows[0]) : 0;  // the grouped order's first row
    auto f32_acts = [](const float* x, int64_t m, int64_t cols, size_t stride) {
      kernels::QuantizedActs q;
      q.type = DType::kF32;
      q.m = m;
      q.k = cols;
      q.data = reinterpret_cast<const uint8_t*>(x);
      q.row_stride = stride * sizeof(float);
      return q;
    };
    for (int a = 0; a < n_adapters; ++a) {
      const int first = gr.off[static_cast<size_t>(a)], m = gr.off[static_cast<size_t>(a) + 1] - first;
      if (m == 0) continue;
      for (int j = 0; j < o.n_out; ++j) {
        const LoraSet& set = *o.sets[static_cast<size_t>(j)];
        const DeviceMatrix* A = a < set.size() ? set.a[static_cast<size_t>(a)] : nullptr;
        if (A == nullptr) continue;
        ks_.matmul(cpu_matrix(A).weight,
                   f32_acts(in + (row0 + static_cast<size_t>(first)) * in_stride, m, static_cast<int64_t>(k), in_stride),
                   mid + static_cast<size_t>(first) * mid_stride + static_cast<size_t>(j) * max_rank, mid_stride, ith_, nth_);
      }
    }
    pool_.barrier();
    size_t col = 0;
    for (int j = 0; j < o.n_out; ++j) {
      const ActId dst = o.dst[static_cast<size_t>(j)];
      const int64_t width = static_cast<int64_t>(st_.cols(dst));
      // This thread's columns: an equal share in whole 8-row groups of B.
      const int64_t groups = (width + 7) / 8;
      const int64_t c0 = std::min(width, groups * ith_ / nth_ * 8), c1 = std::min(width, groups * (ith_ + 1) / nth_ * 8);
      for (int a = 0; a < n_adapters && c1 > c0; ++a) {
        const int first = gr.off[static_cast<size_t>(a)], m = gr.off[static_cast<size_t>(a) + 1] - first;
        const LoraSet& set = *o.sets[static_cast<size_t>(j)];
        const DeviceMatrix* B = a < set.size() ? set.b[static_cast<size_t>(a)] : nullptr;
        if (m == 0 || B == nullptr) continue;
        kernels::Weight cols = cpu_matrix(B).weight;  // rows [c0, c1) of B: row-major F32
        METRO_CHECK(cols.layout == 0);
        cols.data += static_cast<size_t>(c0) * cols.row_stride;
        cols.n_rows = c1 - c0;
        cols.row_major = nullptr;
        float* y = out + static_cast<size_t>(first) * out_stride + col + static_cast<size_t>(c0);
        ks_.matmul(cols, f32_acts(mid + static_cast<size_t>(first) * mid_stride + static_cast<size_t>(j) * max_rank, m,
                                  B->n_cols(), mid_stride),
                   y, out_stride, 0, 1);
        for (int i = 0; i < m; ++i) {
          float* d = row(dst, gr.rows[static_cast<size_t>(first + i)]) + c0;
          ks_.add(d, y + static_cast<size_t>(i) * out_stride, d, c1 - c0);
        }
      }
      col += static_cast<size_t>(width);
    }
  }

  // Token t's experts and weights into its choices, most probable first; its router row
  // is overwritten with the probabilities.
  void route(const MoeOp& o, int t) {
    float* p = row(o.router, t);
    const int n_exp = o.experts->size(), k = o.n_used;
    if (o.gating == ExpertGating::kSoftmax) {
      float mx = p[0];
      for (int e = 1; e < n_exp; ++e) mx = std::max(mx, p[e]);
      float sum = 0.0f;
      for (int e = 0; e < n_exp; ++e) sum += (p[e] = std::exp(p[e] - mx));
      for (int e = 0; e < n_exp; ++e) p[e] /= sum;
    } else {
      for (int e = 0; e < n_exp; ++e) p[e] = 1.0f / (1.0f + std::exp(-p[e]));
    }
    int32_t* chosen = st_.moe_expert.data() + static_cast<size_t>(t * k);
    float* w = st_.moe_weight.data() + static_cast<size_t>(t * k);
    float total = 0.0f;
    for (int j = 0; j < k; ++j) {
      int best = -1;
      for (int e = 0; e < n_exp; ++e) {
        if (best >= 0 && !(p[e] > p[best])) continue;
        if (std::find(chosen, chosen + j, e) != chosen + j) continue;
        best = e;
      }
      chosen[j] = best;
      total += (w[j] = p[best]);
    }
    if (o.norm_weights) {
      // A floor on the sum keeps weights finite when every chosen probability is ~0.
      const float inv = 1.0f / std::max(total, 6.103515625e-5f);
      for (int j = 0; j < k; ++j) w[j] *= inv;
    }
  }

  // Thread 0: slots grouped by expert (ascending), in choice order within an expert; the
  // experts' pieces; the two phases' item counters zeroed.
  void group_by_expert(int n_exp, int k) {
    const int n_choices = n_tokens_ * k;
    int32_t* off = st_.moe_offset.data();
    std::fill(off, off + n_exp + 1, 0);
    for (int c = 0; c < n_choices; ++c) ++off[st_.moe_expert[static_cast<size_t>(c)] + 1];
    for (int e = 0; e < n_exp; ++e) off[e + 1] += off[e];
    int32_t* cursor = st_.moe_cursor.data();
    std::copy(off, off + n_exp, cursor);
    for (int c = 0; c < n_choices; ++c) {
      const int32_t s = cursor[st_.moe_expert[static_cast<size_t>(c)]]++;
      st_.moe_slot[static_cast<size_t>(c)] = s;
      st_.moe_slot_token[static_cast<size_t>(s)] = c / k;
    }
    // An expert's rows in pieces of about kPieceRows (a whole matrix for a few rows).
    int32_t* po = st_.moe_piece_off.data();
    po[0] = 0;
    for (int e = 0; e < n_exp; ++e) po[e + 1] = po[e] + ceil_div(off[e + 1] - off[e], kPieceRows);
    st_.moe_counters[0].next.store(0, std::memory_order_relaxed);
    st_.moe_counters[1].next.store(0, std::memory_order_relaxed);
  }

  // Tells a cold store which of its experts this op reads (ColdStore::touch), so that it
  // keeps them in and gives back the least recently read ones past its budget.
  void touch_cold_experts(const ExpertSet& x, int n_exp) {
    const CpuMatrix& first = cpu_matrix(x.gate[0]);
    if (!first.cold_store) return;
    std::vector<int>& ids = st_.moe_cold_ids;
    ids.clear();
    const int32_t* off = st_.moe_offset.data();
    for (int e = 0; e < n_exp; ++e) {
      if (off[e + 1] == off[e]) continue;
      for (const auto* set : {&x.gate, &x.up, &x.down}) {
        const CpuMatrix& m = cpu_matrix((*set)[static_cast<size_t>(e)]);
        if (m.cold_store) ids.push_back(m.cold_id);
      }
    }
    first.cold_store->touch(ids);
  }

  // Items (run, head) dealt out round-robin: an encoder step holds whole inputs, so its
  // runs are of similar length and the heads of a run cost the same.
  void encoder_attention(const EncoderAttentionOp& a) {
    const size_t q_cols = st_.cols(a.q), kv_cols = st_.cols(a.k), out_cols = st_.cols(a.out);
    const int hd = static_cast<int>(q_cols) / a.n_head;
    const int group = a.n_head / a.n_head_kv;
    const int items = static_cast<int>(step_.runs.size()) * a.n_head;
    for (int it = ith_; it < items; it += nth_) {
      const SeqRun& run = step_.runs[static_cast<size_t>(it / a.n_head)];
      const int h = it % a.n_head;
      const size_t t0 = static_cast<size_t>(run.start);
      const size_t kv_off = t0 * kv_cols + static_cast<size_t>(h / group * hd);
      kernels::encoder_attention_head(st_.act(a.q) + t0 * q_cols + static_cast<size_t>(h * hd), q_cols,
                                      st_.act(a.k) + kv_off, st_.act(a.v) + kv_off, kv_cols,
                                      st_.act(a.out) + t0 * out_cols + static_cast<size_t>(h * hd), out_cols, run.n,
                                      hd, a.scale);
    }
  }

  // Thread 0 only: the sequence views and this layer's page pointers of the next attention.
  void prepare_attention(const AttentionOp& a) {
    const size_t b = static_cast<size_t>(prepared_++ % 2);
    const KvView& kv = *step_.kv;
    const int bs = kv.layout.block_size;
    float* q = st_.act(a.q);
    float* out = st_.act(a.out);
    const size_t q_cols = st_.cols(a.q), out_cols = st_.cols(a.out);
    size_t off = 0;
    for (size_t r = 0; r < step_.runs.size(); ++r) {
      const SeqRun& run = step_.runs[r];
      kernels::AttentionSeq& s = st_.seqs[b][r];
      s.q = q + static_cast<size_t>(run.start) * q_cols;
      s.out = out + static_cast<size_t>(run.start) * out_cols;
      s.n_q = run.n;
      s.pos0 = run.pos0;
      s.k_pages = st_.k_pages[b].data() + off;
      s.v_pages = st_.v_pages[b].data() + off;
      s.q_stride = q_cols;
      s.out_stride = out_cols;
      const auto& table = kv.tables[static_cast<size_t>(run.seq)];
      const int nb = ceil_div(run.pos0 + run.n, bs);
      for (int j = 0; j < nb; ++j) {
        // A block released behind a window (kNoBlock) is never read: no page.
        const int32_t blk = table[static_cast<size_t>(j)];
        st_.k_pages[b][off + static_cast<size_t>(j)] = blk < 0 ? nullptr : kv.k_page(blk, a.layer);
        st_.v_pages[b][off + static_cast<size_t>(j)] = blk < 0 ? nullptr : kv.v_page(blk, a.layer);
      }
      off += static_cast<size_t>(nb);
    }
  }

  float* row(ActId id, int r) { return st_.act(id) + static_cast<size_t>(r) * st_.cols(id); }

  void row_op(const EmbedOp& o, int t) {
    const kernels::Weight& w = cpu_matrix(o.table).weight;
    const uint8_t* src = w.data + static_cast<size_t>(step_.token[static_cast<size_t>(t)]) * w.row_stride;
    kernels::dequantize_row_ref(w.type, src, row(o.dst, t), w.n_cols);
    if (o.scale != 1.0f) ks_.scale(row(o.dst, t), o.scale, w.n_cols);
  }
  void row_op(const RopeAnglesOp& o, int t) {
    float* cs = row(o.dst, t);
    o.rope->angles(step_.pos[static_cast<size_t>(t)], cs, cs + o.rope->config().n_rot / 2);
  }
  void row_op(const RmsNormOp& o, int r) {
    const int src_row = o.rows == RowSet::kTokens ? r : step_.logit_rows[static_cast<size_t>(r)];
    ks_.rms_norm(row(o.src, src_row), cpu_vector(o.weight), row(o.dst, r),
                 static_cast<int64_t>(st_.cols(o.src)), o.eps);
  }
  void row_op(const AddBiasOp& o, int t) {
    float* x = row(o.x, t);
    ks_.add(x, cpu_vector(o.bias), x, static_cast<int64_t>(st_.cols(o.x)));
  }
  void row_op(const RopeOp& o, int t) {
    const float* cs = row(o.angles, t);
    ks_.rope_rotate(row(o.x, t), o.n_head, o.rope->config(), cs, cs + o.rope->config().n_rot / 2);
  }
  void row_op(const KvStoreOp& o, int t) {
    const KvView& kv = *step_.kv;
    const int64_t pos = step_.pos[static_cast<size_t>(t)];
    const auto& table = kv.tables[static_cast<size_t>(step_.seq[static_cast<size_t>(t)])];
    const int32_t block = table[static_cast<size_t>(pos / kv.layout.block_size)];
    METRO_CHECK_MSG(block >= 0, "a KV write into a block released behind the window");
    const int slot = static_cast<int>(pos % kv.layout.block_size);
    ks_.kv_store(kv.layout, kv.k_page(block, o.layer), slot, row(o.k, t));
    ks_.kv_store(kv.layout, kv.v_page(block, o.layer), slot, row(o.v, t));
  }
  void row_op(const HeadNormOp& o, int t) {
    const int64_t hd = static_cast<int64_t>(st_.cols(o.x)) / o.n_head;
    float* x = row(o.x, t);
    for (int h = 0; h < o.n_head; ++h) ks_.rms_norm(x + h * hd, cpu_vector(o.weight), x + h * hd, hd, o.eps);
  }
  void row_op(const AddOp& o, int t) {
    const auto n = static_cast<int64_t>(st_.cols(o.dst));
    if (o.scale == 1.0f) {
      ks_.add(row(o.a, t), row(o.b, t), row(o.dst, t), n);
      return;
    }
    const float* a = row(o.a, t);
    const float* b = row(o.b, t);
    float* d = row(o.dst, t);
    for (int64_t i = 0; i < n; ++i) d[i] = a[i] + o.scale * b[i];
  }
  void row_op(const SwigluOp& o, int t) {
    if (o.gelu) {
      ks_.geglu(row(o.gate, t), row(o.up, t), row(o.dst, t), static_cast<int64_t>(st_.cols(o.dst)));
    } else {
      ks_.swiglu(row(o.gate, t), row(o.up, t), row(o.dst, t), static_cast<int64_t>(st_.cols(o.dst)));
    }
  }
  void row_op(const PosEmbedOp& o, int t) {
    const kernels::Weight& w = cpu_matrix(o.table).weight;
    const auto* table_row = reinterpret_cast<const float*>(
        w.data + static_cast<size_t>(step_.pos[static_cast<size_t>(t)]) * w.row_stride);
    float* x = row(o.x, t);
    ks_.add(x, table_row, x, w.n_cols);
  }
  void row_op(const LayerNormOp& o, int t) {
    kernels::layer_norm(row(o.src, t), cpu_vector(o.weight), cpu_vector(o.bias), row(o.dst, t),
                        static_cast<int64_t>(st_.cols(o.src)), o.eps);
  }
  void row_op(const GeluOp& o, int t) {
    float* x = row(o.x, t);
    kernels::gelu_erf(x, x, static_cast<int64_t>(st_.cols(o.x)));
  }
  void row_op(const GatedAddOp& o, int t) {
    const size_t n = st_.cols(o.x);
    float g = 1.0f;
    if (o.gate != nullptr) {
      const float* a = row(o.gate_in, t);
      const float* b = cpu_vector(o.gate);
      float d = 0.0f;
      for (size_t i = 0; i < static_cast<size_t>(o.gate->size()); ++i) d += a[i] * b[i];
      g = 1.0f / (1.0f + std::exp(-d));
    }
    float* x = row(o.x, t);
    const float* y = row(o.y, t);
    for (size_t i = 0; i < n; ++i) x[i] += g * y[i];
  }
  // Not elementwise: never reached through run_elementwise.
  void row_op(const ProjectOp&, int) { METRO_CHECK(false); }
  void row_op(const AttentionOp&, int) { METRO_CHECK(false); }
  void row_op(const EncoderAttentionOp&, int) { METRO_CHECK(false); }
  void row_op(const MoeOp&, int) { METRO_CHECK(false); }
  void row_op(const LoraOp&, int) { METRO_CHECK(false); }
  void row_op(const AllReduceOp&, int) { METRO_CHECK(false); }

  const kernels::KernelSet& ks_;
  CpuState& st_;
  const StepDesc& step_;
  std::span<const Op> ops_;
  ThreadPool& pool_;
  StepObserver* observer_;
  const bool timing_;  // thread 0 of an observed step reads clocks
  const int ith_, nth_;
  const int n_tokens_, n_logits_;
  int product_ = 0;    // the first work counter of the next ProjectOp
  int attention_ = 0;  // attention ops run so far (which view buffer the next one reads)
  int prepared_ = 0;   // thread 0: attention ops prepared so far
  int64_t pending_prep_ns_ = 0;  // the preparation time of the op that follows
};

// Each row set's rows that run with an adapter, grouped by adapter (ascending, in row
// order within one), for the step's LoraOps.
void group_lora_rows(std::span<const Op> ops, const StepDesc& step, CpuState& st) {
  int n_adapters = 0;
  for (const Op& op : ops) {
    if (const auto* l = std::get_if<LoraOp>(&op)) {
      for (int j = 0; j < l->n_out; ++j) n_adapters = std::max(n_adapters, l->sets[static_cast<size_t>(j)]->size());
    }
  }
  for (int set = 0; set < 2; ++set) {
    LoraGroups& g = st.lora_groups[static_cast<size_t>(set)];
    g.rows.clear();
    g.off.assign(static_cast<size_t>(n_adapters) + 1, 0);
    if (n_adapters == 0 || step.adapter.empty()) continue;
    const int n = set == 0 ? static_cast<int>(step.token.size()) : static_cast<int>(step.logit_rows.size());
    auto adapter_of = [&](int r) {
      return step.adapter[static_cast<size_t>(set == 0 ? r : step.logit_rows[static_cast<size_t>(r)])];
    };
    // A counting sort: off[a] counts adapter a's rows, then becomes its end.
    for (int r = 0; r < n; ++r) {
      const int a = adapter_of(r);
      if (a > 0 && a <= n_adapters) ++g.off[static_cast<size_t>(a)];
    }
    for (int a = 1; a <= n_adapters; ++a) g.off[static_cast<size_t>(a)] += g.off[static_cast<size_t>(a) - 1];
    g.rows.resize(static_cast<size_t>(g.off.back()));
    g.cursor.assign(g.off.begin(), g.off.end() - 1);
    for (int r = 0; r < n; ++r) {
      const int a = adapter_of(r);
      if (a > 0 && a <= n_adapters) g.rows[static_cast<size_t>(g.cursor[static_cast<size_t>(a) - 1]++)] = r;
    }
    g.contiguous = !g.rows.empty();
    for (size_t i = 1; i < g.rows.size() && g.contiguous; ++i) g.contiguous = g.rows[i] == g.rows[i - 1] + 1;
  }
}

}  // namespace

// An embedding table in a cold store: the pieces holding the step's tokens' rows are
// touched before the step reads them (ColdStore::touch), once for the whole step.
static void touch_cold_rows(std::span<const Op> ops, const StepDesc& step, CpuState& st) {
  for (const Op& op : ops) {
    const auto* e = std::get_if<EmbedOp>(&op);
    if (e == nullptr) continue;
    const CpuMatrix& m = cpu_matrix(e->table);
    if (!m.cold_store || m.cold_unit == 0) continue;
    std::vector<int>& ids = st.embed_cold_ids;
    ids.clear();
    const size_t stride = m.weight.row_stride;
    for (const int32_t tok : step.token) {
      const size_t at = static_cast<size_t>(tok) * stride;
      for (size_t u = at / m.cold_unit; u <= (at + stride - 1) / m.cold_unit; ++u) {
        ids.push_back(m.cold_id + static_cast<int>(u));
      }
    }
    m.cold_store->touch(ids);
  }
}

void CpuBackend::execute(std::span<const Op> ops, const StepDesc& step, ExecState& state,
                         ThreadPool& pool, StepObserver* observer) {
  auto* st = dynamic_cast<CpuState*>(&state);
  METRO_CHECK_MSG(st != nullptr, "the CPU backend runs on states it made");
  validate_step(ops, step, st->spec());
  int products = 0;
  for (const Op& op : ops) {
    if (const auto* p = std::get_if<ProjectOp>(&op)) products += p->n_out;
  }
  for (int i = 0; i < products; ++i) st->counters[static_cast<size_t>(i)].next.store(0, std::memory_order_relaxed);
  group_lora_rows(ops, step, *st);
  touch_cold_rows(ops, step, *st);
  const kernels::KernelSet& set = set_;
  pool.run([&](int ith, int nth) { Executor(set, *st, step, ops, pool, observer, ith, nth).run(); });
}

}  // namespace metro::backends::cpu
