// The checks every backend runs on a step before executing it (see validate.h).
#include "backends/validate.h"

#include <variant>

#include "base/check.h"
#include "dist/communicator.h"
#include "kernels/ops.h"

namespace metro::backends {

namespace {

int ceil_div(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }

// Checks the ops against the state and the step before any thread runs them. Cheap
// (no allocation); a failure is a bug in the model that built the ops.
class Validator {
 public:
  Validator(const StepDesc& step, const StateSpec& spec) : step_(step), spec_(spec) {}

  int products() const { return products_; }

  void operator()(const EmbedOp& o) { METRO_CHECK(width(o.dst, kTok) == o.table->n_cols()); }
  void operator()(const RopeAnglesOp& o) { METRO_CHECK(width(o.dst, kTok) >= o.rope->config().n_rot); }
  void operator()(const RmsNormOp& o) {
    const int64_t n = width(o.src, kTok);
    METRO_CHECK(width(o.dst, o.rows) == n && o.weight->size() == n);
  }
  void operator()(const ProjectOp& o) {
    METRO_CHECK(o.n_out >= 1 && o.n_out <= 3);
    const int64_t k = width(o.src, o.rows);
    for (int i = 0; i < o.n_out; ++i) {
      const DeviceMatrix& w = *o.w[static_cast<size_t>(i)];
      METRO_CHECK_MSG(w.n_cols() == k && width(o.dst[static_cast<size_t>(i)], o.rows) == w.n_rows(),
                      "project: buffer widths do not match the weight");
    }
    products_ += o.n_out;
  }
  void operator()(const AddBiasOp& o) { METRO_CHECK(width(o.x, kTok) == o.bias->size()); }
  void operator()(const RopeOp& o) {
    const kernels::RopeConfig& rc = o.rope->config();
    METRO_CHECK(width(o.x, kTok) == int64_t{o.n_head} * rc.head_dim);
    METRO_CHECK(width(o.angles, kTok) >= rc.n_rot);
  }
  void operator()(const KvStoreOp& o) {
    METRO_CHECK(step_.kv != nullptr && o.layer >= 0 && o.layer < step_.kv->n_layer);
    const int64_t n = int64_t{step_.kv->layout.n_head_kv} * step_.kv->layout.head_dim;
    METRO_CHECK(width(o.k, kTok) == n && width(o.v, kTok) == n);
  }
  void operator()(const AttentionOp& o) {
    METRO_CHECK(step_.kv != nullptr && o.layer >= 0 && o.layer < step_.kv->n_layer);
    const int64_t n = int64_t{o.n_head} * step_.kv->layout.head_dim;
    METRO_CHECK(width(o.q, kTok) == n && width(o.out, kTok) == n);
  }
  void operator()(const AddOp& o) {
    const int64_t n = width(o.dst, kTok);
    METRO_CHECK(width(o.a, kTok) == n && width(o.b, kTok) == n);
  }
  void operator()(const SwigluOp& o) {
    const int64_t n = width(o.dst, kTok);
    METRO_CHECK(width(o.gate, kTok) == n && width(o.up, kTok) == n);
  }
  void operator()(const HeadNormOp& o) {
    METRO_CHECK(o.n_head > 0);
    const int64_t n = width(o.x, kTok);
    METRO_CHECK(n % o.n_head == 0 && o.weight->size() == n / o.n_head);
  }
  void operator()(const PosEmbedOp& o) {
    METRO_CHECK(o.table->type() == kernels::DType::kF32 && width(o.x, kTok) == o.table->n_cols());
    for (int32_t p : step_.pos) METRO_CHECK_MSG(p < o.table->n_rows(), "position past the position table");
  }
  void operator()(const LayerNormOp& o) {
    const int64_t n = width(o.src, kTok);
    METRO_CHECK(width(o.dst, kTok) == n && o.weight->size() == n && o.bias->size() == n);
  }
  void operator()(const GeluOp& o) { width(o.x, kTok); }
  void operator()(const EncoderAttentionOp& o) {
    METRO_CHECK(o.n_head > 0 && o.n_head_kv > 0 && o.n_head % o.n_head_kv == 0);
    const int64_t q = width(o.q, kTok);
    METRO_CHECK(q % o.n_head == 0 && width(o.out, kTok) == q);
    const int64_t kv = q / o.n_head * o.n_head_kv;
    METRO_CHECK(width(o.k, kTok) == kv && width(o.v, kTok) == kv);
  }
  void operator()(const MoeOp& o) {
    const ExpertSet& x = *o.experts;
    const int n = x.size();
    METRO_CHECK_MSG(n > 0 && static_cast<int>(x.up.size()) == n && static_cast<int>(x.down.size()) == n,
                    "moe: every expert needs gate, up and down matrices");
    METRO_CHECK_MSG(n <= spec_.max_experts && o.n_used >= 1 && o.n_used <= n && o.n_used <= spec_.max_experts_used,
                    "moe: more experts than the state was made for");
    const DeviceMatrix& g = *x.gate[0];
    const DeviceMatrix& d = *x.down[0];
    for (int e = 0; e < n; ++e) {
      const DeviceMatrix& ge = *x.gate[static_cast<size_t>(e)];
      const DeviceMatrix& ue = *x.up[static_cast<size_t>(e)];
      METRO_CHECK_MSG(ge.n_rows() == g.n_rows() && ge.n_cols() == g.n_cols() && ge.type() == g.type() &&
                          ue.n_rows() == g.n_rows() && ue.n_cols() == g.n_cols() && ue.type() == x.up[0]->type(),
                      "moe: experts' gate and up matrices differ in shape or type");
      const DeviceMatrix& de = *x.down[static_cast<size_t>(e)];
      METRO_CHECK_MSG(de.n_rows() == d.n_rows() && de.n_cols() == g.n_rows() && de.type() == d.type(),
                      "moe: experts' down matrices differ in shape or type");
    }
    METRO_CHECK(width(o.router, kTok) == n && width(o.src, kTok) == g.n_cols() && width(o.dst, kTok) == d.n_rows());
    METRO_CHECK_MSG(width(o.slot_in, kTok) >= o.n_used * g.n_cols() && width(o.slot_gate, kTok) >= o.n_used * g.n_rows() &&
                        width(o.slot_up, kTok) >= o.n_used * g.n_rows() && width(o.slot_out, kTok) >= o.n_used * d.n_rows(),
                    "moe: slot buffers narrower than n_used rows of the products");
  }
  void operator()(const GatedAddOp& o) {
    const int64_t n = width(o.x, kTok);
    METRO_CHECK(width(o.y, kTok) == n);
    if (o.gate != nullptr) METRO_CHECK(width(o.gate_in, kTok) == o.gate->size());
  }
  void operator()(const LoraOp& o) {
    METRO_CHECK(o.n_out >= 1 && o.n_out <= 3);
    const int64_t k = width(o.src, o.rows);
    const int64_t max_rank = width(o.scratch_mid, o.rows) / 3;
    METRO_CHECK_MSG(width(o.scratch_in, o.rows) >= k, "lora: scratch narrower than the input");
    int64_t out = 0;
    for (int j = 0; j < o.n_out; ++j) {
      const LoraSet* set = o.sets[static_cast<size_t>(j)];
      METRO_CHECK(set != nullptr && set->size() <= spec_.max_adapters && set->b.size() == set->a.size());
      const int64_t n = width(o.dst[static_cast<size_t>(j)], o.rows);
      for (int a = 0; a < set->size(); ++a) {
        const DeviceMatrix* A = set->a[static_cast<size_t>(a)];
        const DeviceMatrix* B = set->b[static_cast<size_t>(a)];
        METRO_CHECK((A == nullptr) == (B == nullptr));
        if (A == nullptr) continue;
        METRO_CHECK_MSG(A->type() == kernels::DType::kF32 && B->type() == kernels::DType::kF32 && A->n_cols() == k &&
                            A->n_rows() <= max_rank && B->n_cols() == A->n_rows() && B->n_rows() == n,
                        "lora: adapter factors do not fit the product");
      }
      out += n;
    }
    METRO_CHECK_MSG(width(o.scratch_out, o.rows) >= out, "lora: scratch narrower than the outputs");
    for (int16_t a : step_.adapter) METRO_CHECK_MSG(a >= 0 && a <= spec_.max_adapters, "a token's adapter is not loaded");
  }
  void operator()(const AllReduceOp& o) {
    METRO_CHECK(o.comm != nullptr);
    width(o.x, kTok);
  }

 private:
  static constexpr RowSet kTok = RowSet::kTokens;

  int64_t width(ActId id, RowSet rows) const {
    METRO_CHECK_MSG(static_cast<size_t>(id) < spec_.acts.size(), "op names a buffer the state lacks");
    METRO_CHECK_MSG(spec_.acts[static_cast<size_t>(id)].rows == rows, "op reads a buffer of other rows");
    return spec_.acts[static_cast<size_t>(id)].cols;
  }

  const StepDesc& step_;
  const StateSpec& spec_;
  int products_ = 0;
};

}  // namespace

void validate_step(std::span<const Op> ops, const StepDesc& step, const StateSpec& spec) {
  METRO_CHECK(static_cast<int>(step.token.size()) <= spec.max_tokens && step.pos.size() == step.token.size() &&
              step.seq.size() == step.token.size());
  METRO_CHECK(static_cast<int>(step.logit_rows.size()) <= spec.max_logits);
  METRO_CHECK(static_cast<int>(step.runs.size()) <= spec.max_seqs);
  METRO_CHECK(step.adapter.empty() || step.adapter.size() == step.token.size());
  Validator v(step, spec);
  for (const Op& op : ops) std::visit(v, op);
  METRO_CHECK_MSG(v.products() <= spec.max_products, "more matrix products than the state was made for");
  if (step.kv != nullptr) {
    const int bs = step.kv->layout.block_size;
    for (const SeqRun& r : step.runs) {
      METRO_CHECK(r.seq >= 0 && static_cast<size_t>(r.seq) < step.kv->tables.size());
      const int need = ceil_div(r.pos0 + r.n, bs);
      METRO_CHECK(need <= spec.max_blocks_per_seq &&
                  static_cast<size_t>(need) <= step.kv->tables[static_cast<size_t>(r.seq)].size());
    }
  }
}

}  // namespace metro::backends
