// Matrix products Y = X · Wᵀ with weights in any DType and F32 activations.
//
// Threading contract: every function that takes (ith, nth) does thread ith's share of the
// work of nth threads and touches nothing outside it, so a whole model step can run inside
// one ThreadPool::run with a ThreadPool::barrier between dependent ops. Nothing here
// allocates: scratch comes from the caller (the model's Workspace).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "base/aligned.h"
#include "kernels/dtype.h"

namespace metro::kernels {

// A 2-D weight matrix: n_rows output features, each a row of n_cols input features.
// Either the GGUF bytes as they are (row-major, `row_stride` bytes per row) or a copy
// repacked at load into an interleaved layout a kernel prefers (`layout` says which).
struct Weight {
  DType type = DType::kF32;
  int64_t n_rows = 0;
  int64_t n_cols = 0;
  const uint8_t* data = nullptr;
  size_t row_stride = 0;  // bytes per row in the original layout
  int layout = 0;         // 0: GGUF row-major; other values are private to the kernels
  // Keeps a repacked copy's storage alive: the arena it was carved from, or its own buffer.
  std::variant<std::monostate, std::shared_ptr<BumpArena>, std::shared_ptr<AlignedBuffer<uint8_t>>> owned;
  // The GGUF row-major bytes, kept beside a repacked copy when the kernels use both: F16's
  // x8 layout serves GEMV (a few act rows, bandwidth-bound), the row-major bytes serve GEMM
  // (many act rows, FMA-bound). Both give the same bits. Null otherwise.
  const uint8_t* row_major = nullptr;

  // A short description for `metro inspect` ("Q4_1 row-major", "Q4_1 x8 interleaved").
  std::string describe() const;
  // The host bytes the kernels read: the matrix in its layout, and the row-major bytes
  // kept beside a repacked copy.
  std::vector<std::span<const uint8_t>> memory() const;
};

// Wraps GGUF row-major bytes; with `allow_repack`, may build an interleaved copy when the
// chosen kernels run faster on one (the original bytes are then not read again).
// A repacked copy is carved from `arena` when one is given (a model's matrices then share
// huge pages), else it gets a buffer of its own.
Weight make_weight(DType type, const void* data, int64_t n_rows, int64_t n_cols,
                   bool allow_repack, const std::shared_ptr<BumpArena>& arena = {});

// Activations quantized to a weight type's dot partner: m rows of k elements.
struct QuantizedActs {
  DType type = DType::kF32;  // the partner type (F32 when the weight type is a float type)
  int64_t m = 0;
  int64_t k = 0;
  const uint8_t* data = nullptr;
  size_t row_stride = 0;
  // Per-block side data of the 32-block partners (m rows of k/32 values each), which
  // quantize_acts stores in `out` after the rows so kernels need no conversions: every
  // block's d as float (Q8_0, Q8_1), s as float (Q8_1), and the integer sum of the quants
  // (Q8_0: the offset of Q4_0/Q5_0 weights). Null for the other partners.
  const float* block_d = nullptr;
  const float* block_s = nullptr;
  const int32_t* block_sums = nullptr;
};

// Rows [first, first + n) of quantized activations, as quantize_acts would have made them
// from those rows alone (a row's bytes and side data do not depend on the others).
QuantizedActs acts_rows(const QuantizedActs& x, int64_t first, int64_t n);

// Bytes needed to hold m rows of k activations quantized for weights of `weight_type`.
size_t quantized_acts_bytes(DType weight_type, int64_t m, int64_t k);

// Thread ith's share: quantizes rows of x (m rows, k columns, x_stride floats apart) into
// `out` (quantized_acts_bytes(weight_type, m, k) bytes, 64-byte aligned).
QuantizedActs quantize_acts(DType weight_type, const float* x, int64_t m, int64_t k,
                            size_t x_stride, uint8_t* out, int ith, int nth);

// Thread ith's share of Y[i][j] = sum_c X[i][c] * W[j][c] for i < x.m, j < w.n_rows.
// y_stride in floats. x must have been quantized for w.type and x.k == w.n_cols.
// Deterministic: each Y[i][j] is computed the same way whatever nth, m (a row of x gives
// the same result in any batch) and layout (repacked or not) are.
//
// With `next` (one counter shared by the nth threads, zero before any of them enters), the
// threads claim runs of the work as they go instead of taking fixed equal shares: a thread
// whose core is busy with something else (an HTTP thread, another process) does less of
// the product rather than holding the others at the next barrier. Results are identical.
void matmul(const Weight& w, const QuantizedActs& x, float* y, size_t y_stride, int ith, int nth,
            std::atomic<int64_t>* next = nullptr);

// The same, computed by the scalar reference (dequantize + double accumulation). Slow.
void matmul_ref(const Weight& w, const float* x, int64_t m, size_t x_stride, float* y,
                size_t y_stride);

// Which instruction set the matmul and dot kernels use on this machine ("avx2", "scalar").
std::string_view kernel_isa();

}  // namespace metro::kernels
