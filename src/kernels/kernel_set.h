// The kernels of one instruction set, bundled: matrix products, elementwise ops and paged
// attention. The free functions of kernels/ call the set chosen once for this CPU; an
// executor that runs a set it was given (the CPU backend, and tests comparing the scalar
// set with the SIMD ones) calls through a KernelSet instead. Both reach the same function
// pointers, so results are the same bits.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace metro {
class BumpArena;
}

namespace metro::kernels {

struct KernelTable;
namespace detail {
struct OpsTable;
struct AttentionKernels;
}  // namespace detail

class KernelSet {
 public:
  KernelSet(const KernelTable& matmul, const detail::OpsTable& ops,
            const detail::AttentionKernels& attention);

  std::string_view isa() const;

  // As the free functions of the same names (ops.h, attention.h, matmul.h).
  void rms_norm(const float* x, const float* weight, float* y, int64_t n, float eps) const;
  void add(const float* a, const float* b, float* out, int64_t n) const;
  void swiglu(const float* gate, const float* up, float* out, int64_t n) const;
  // out = gelu(gate) * up (tanh approximation); out may be gate.
  void geglu(const float* gate, const float* up, float* out, int64_t n) const;
  void scale(float* x, float s, int64_t n) const;
  // Rope::apply with this set: rotates n_head heads of x by the angles cos/sin
  // (cfg.n_rot / 2 values each).
  void rope_rotate(float* x, int n_head, const RopeConfig& cfg, const float* cos,
                   const float* sin) const;
  void kv_store(const KvPageLayout& layout, uint8_t* page, int slot, const float* x) const;
  void attention(const AttentionParams& p, std::span<const AttentionSeq> seqs, int ith,
                 int nth) const;
  QuantizedActs quantize_acts(DType weight_type, const float* x, int64_t m, int64_t k,
                              size_t x_stride, uint8_t* out, int ith, int nth) const;
  void matmul(const Weight& w, const QuantizedActs& x, float* y, size_t y_stride, int ith,
              int nth, std::atomic<int64_t>* next = nullptr) const;
  Weight make_weight(DType type, const void* data, int64_t n_rows, int64_t n_cols,
                     bool allow_repack, const std::shared_ptr<BumpArena>& arena = {}) const;

 private:
  const KernelTable* matmul_;
  const detail::OpsTable* ops_;
  const detail::AttentionKernels* attention_;
};

const KernelSet& scalar_kernel_set();
// Null when the CPU lacks AVX2+FMA+F16C.
const KernelSet* avx2_kernel_set();
// The set the free functions use: the widest one this CPU runs.
const KernelSet& active_kernel_set();
// Every set this CPU runs, the scalar one first.
std::vector<const KernelSet*> kernel_sets();

}  // namespace metro::kernels
