#include "kernels/kernel_set.h"

#include "base/cpu_features.h"
#include "kernels/attention_impl.h"
#include "kernels/kernel_table.h"
#include "kernels/ops_table.h"

namespace metro::kernels {

KernelSet::KernelSet(const KernelTable& matmul, const detail::OpsTable& ops,
                     const detail::AttentionKernels& attention)
    : matmul_(&matmul), ops_(&ops), attention_(&attention) {}

std::string_view KernelSet::isa() const { return matmul_->isa; }

void KernelSet::rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) const {
  ops_->rms_norm(x, weight, y, n, eps);
}

void KernelSet::add(const float* a, const float* b, float* out, int64_t n) const {
  ops_->add(a, b, out, n);
}

void KernelSet::swiglu(const float* gate, const float* up, float* out, int64_t n) const {
  ops_->swiglu(gate, up, out, n);
}

void KernelSet::geglu(const float* gate, const float* up, float* out, int64_t n) const {
  ops_->gelu(gate, out, n);
  ops_->mul(out, up, out, n);
}

void KernelSet::scale(float* x, float s, int64_t n) const { ops_->scale(x, s, n); }

void KernelSet::rope_rotate(float* x, int n_head, const RopeConfig& cfg, const float* cos,
                            const float* sin) const {
  ops_->rope_rotate(x, n_head, cfg.head_dim, cfg.n_rot, cfg.mode, cos, sin);
}

void KernelSet::kv_store(const KvPageLayout& layout, uint8_t* page, int slot, const float* x) const {
  detail::kv_store_with(*attention_, layout, page, slot, x);
}

void KernelSet::attention(const AttentionParams& p, std::span<const AttentionSeq> seqs, int ith,
                          int nth) const {
  detail::attention_with(*attention_, p, seqs, ith, nth);
}

QuantizedActs KernelSet::quantize_acts(DType weight_type, const float* x, int64_t m, int64_t k,
                                       size_t x_stride, uint8_t* out, int ith, int nth) const {
  return quantize_acts_with(*matmul_, weight_type, x, m, k, x_stride, out, ith, nth);
}

void KernelSet::matmul(const Weight& w, const QuantizedActs& x, float* y, size_t y_stride, int ith,
                       int nth, std::atomic<int64_t>* next) const {
  matmul_with(*matmul_, w, x, y, y_stride, ith, nth, next);
}

Weight KernelSet::make_weight(DType type, const void* data, int64_t n_rows, int64_t n_cols,
                              bool allow_repack, const std::shared_ptr<BumpArena>& arena) const {
  return make_weight_with(*matmul_, type, data, n_rows, n_cols, allow_repack, arena);
}

const KernelSet& scalar_kernel_set() {
  static const KernelSet set(scalar_kernels(), detail::kOpsScalar, detail::kAttentionScalar);
  return set;
}

const KernelSet* avx2_kernel_set() {
  if (!cpu_features().has_avx2_level()) return nullptr;
  static const KernelSet set(*avx2_kernels(), detail::kOpsAvx2, detail::kAttentionAvx2);
  return &set;
}

const KernelSet& active_kernel_set() {
  const KernelSet* avx2 = avx2_kernel_set();
  return avx2 ? *avx2 : scalar_kernel_set();
}

std::vector<const KernelSet*> kernel_sets() {
  std::vector<const KernelSet*> sets = {&scalar_kernel_set()};
  if (const KernelSet* avx2 = avx2_kernel_set()) sets.push_back(avx2);
  return sets;
}

}  // namespace metro::kernels
