// Matrix products on the device: y = x · wᵀ for every weight format, F32 accumulation.
//
// A quantized weight multiplies activations quantized to its dot partner (formats.h, as the
// reference quantizer does), so every block term is the reference's integer sum times the
// two scales and a product differs from vec_dot_ref only in how the float terms round and
// combine. Float weights (F32, F16, BF16) multiply the F32 activations directly.
//
// Two kernels per format, both plain (no tensor cores yet):
//  - few tokens (m <= 8): one warp per weight row, each lane taking every 32nd block of the
//    row for all m tokens, then a shuffle sum;
//  - more: a tile of 64 weight rows x 32 tokens per block of 256 threads, the tile's
//    weight and activation blocks staged in shared memory 256 elements at a time, each
//    thread summing one row for 8 tokens.
// Each output is summed in an order fixed by its shape alone: the same bits on every run.
#include "backends/cuda/cuda_kernels.cuh"
#include "backends/cuda/formats.h"

namespace metro::backends::cuda {

// A weight format's geometry as compile-time constants (outside the anonymous namespace:
// nvcc warns of its members that one instantiation leaves unused).
template <DType T>
struct Fmt {
  static constexpr int kElems = T == DType::kF32 || T == DType::kF16 || T == DType::kBF16 ? 1
                                : (T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K) ? 256
                                                                                                 : 32;
  static constexpr bool kFloat = kElems == 1;
  static constexpr int kBytes = T == DType::kF32    ? 4
                                : kFloat            ? 2
                                : T == DType::kQ8_0 ? 36
                                : T == DType::kQ4_0 ? 20
                                : T == DType::kQ4_1 ? 20
                                : T == DType::kQ5_0 ? 24
                                : T == DType::kQ5_1 ? 24
                                : T == DType::kQ4_K ? 144
                                : T == DType::kQ5_K ? 176
                                                    : 212;
  static constexpr DType kPartner = kFloat                                                        ? DType::kF32
                                    : (T == DType::kQ4_1 || T == DType::kQ5_1)                   ? DType::kQ8_1
                                    : (T == DType::kQ4_K || T == DType::kQ5_K || T == DType::kQ6_K) ? DType::kQ8_K
                                                                                                 : DType::kQ8_0;
  static constexpr int kActBytes = kPartner == DType::kQ8_0 ? 36 : kPartner == DType::kQ8_1 ? 40 : 292;
  static constexpr int kStepBlocks = kFloat ? 1 : 256 / kElems;  // blocks per staged step
};

namespace {

constexpr int kGemvWarps = 4;
constexpr int kTileRows = 64;
constexpr int kTileToks = 32;
constexpr int kTileThreads = 256;
constexpr int kToksPerThread = kTileToks / (kTileThreads / kTileRows);  // 8


__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <DType T>
__device__ float float_weight(const uint8_t* row, int64_t i) {
  if constexpr (T == DType::kF32) return load_f32(row + 4 * i);
  if constexpr (T == DType::kF16) return load_fp16(row + 2 * i);
  return bf16_to_f32(load_u16(row + 2 * i));
}

// ---- quantized activations ------------------------------------------------------------

__global__ void quantize_acts_kernel(DType partner, const float* src, int64_t ld, int rows, int64_t blocks_per_row,
                                     uint8_t* dst) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * blocks_per_row) return;
  const int64_t r = i / blocks_per_row, b = i % blocks_per_row;
  const int elems = act_block_elems(partner), bytes = act_block_bytes(partner);
  quantize_act_block(partner, src + r * ld + b * elems, dst + r * blocks_per_row * bytes + b * bytes);
}

// ---- few tokens -------------------------------------------------------------------------

template <DType T, int M>
__global__ void gemv_kernel(const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const void* xv, int64_t ld_x,
                            int m, float* y, int64_t ld_y) {
  using F = Fmt<T>;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + warp;
  if (row >= n) return;
  const uint8_t* wr = w + row * row_bytes;
  float acc[M];
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  if constexpr (F::kFloat) {
    const float* x = static_cast<const float*>(xv);
    for (int64_t e = lane; e < k; e += 32) {
      const float wv = float_weight<T>(wr, e);
      for (int i = 0; i < M; ++i) {
        if (i < m) acc[i] = fmaf(wv, x[i * ld_x + e], acc[i]);
      }
    }
  } else {
    const uint8_t* x = static_cast<const uint8_t*>(xv);
    const int64_t nb = k / F::kElems;
    for (int64_t b = lane; b < nb; b += 32) {
      const uint8_t* wb = wr + b * F::kBytes;
      for (int i = 0; i < M; ++i) {
        if (i < m) acc[i] += block_dot<T>(wb, x + i * ld_x + b * F::kActBytes);
      }
    }
  }
  for (int i = 0; i < M; ++i) {
    const float v = warp_sum(acc[i]);
    if (lane == 0 && i < m) y[i * ld_y + row] = v;
  }
}

// ---- many tokens ------------------------------------------------------------------------

template <DType T>
__global__ void __launch_bounds__(kTileThreads) gemm_quant_kernel(const uint8_t* w, int64_t row_bytes, int64_t n,
                                                                   int64_t k, const uint8_t* x, int64_t ld_x, int m,
                                                                   float* y, int64_t ld_y) {
  using F = Fmt<T>;
  constexpr int kWWords = F::kStepBlocks * F::kBytes / 4;     // one row's staged words
  constexpr int kAWords = F::kStepBlocks * F::kActBytes / 4;  // one token's staged words
  __shared__ uint32_t ws[kTileRows * kWWords];
  __shared__ uint32_t as[kTileToks * kAWords];
  const int tid = threadIdx.x;
  const int tr = tid % kTileRows, tg = tid / kTileRows;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int tok0 = blockIdx.y * kTileToks;
  const int64_t row = row0 + tr;
  const int64_t nb = k / F::kElems;
  float acc[kToksPerThread];
  for (int i = 0; i < kToksPerThread; ++i) acc[i] = 0.0f;
  for (int64_t b0 = 0; b0 < nb; b0 += F::kStepBlocks) {
    const int steps = static_cast<int>(min(static_cast<int64_t>(F::kStepBlocks), nb - b0));
    const int w_words = steps * F::kBytes / 4, a_words = steps * F::kActBytes / 4;
    for (int i = tid; i < kTileRows * w_words; i += kTileThreads) {
      const int rr = i / w_words, wi = i % w_words;
      const int64_t r = row0 + rr;
      ws[rr * kWWords + wi] = r < n ? load_u32(w + r * row_bytes + b0 * F::kBytes + 4 * wi) : 0u;
    }
    for (int i = tid; i < kTileToks * a_words; i += kTileThreads) {
      const int tt = i / a_words, wi = i % a_words;
      const int tok = tok0 + tt;
      as[tt * kAWords + wi] = tok < m ? load_u32(x + tok * ld_x + b0 * F::kActBytes + 4 * wi) : 0u;
    }
    __syncthreads();
    if (row < n) {
      for (int s = 0; s < steps; ++s) {
        const uint8_t* wb = reinterpret_cast<const uint8_t*>(ws + tr * kWWords) + s * F::kBytes;
        for (int i = 0; i < kToksPerThread; ++i) {
          const int tt = tg * kToksPerThread + i;
          acc[i] += block_dot<T>(wb, reinterpret_cast<const uint8_t*>(as + tt * kAWords) + s * F::kActBytes);
        }
      }
    }
    __syncthreads();
  }
  if (row >= n) return;
  for (int i = 0; i < kToksPerThread; ++i) {
    const int tok = tok0 + tg * kToksPerThread + i;
    if (tok < m) y[tok * ld_y + row] = acc[i];
  }
}

template <DType T>
__global__ void __launch_bounds__(kTileThreads) gemm_float_kernel(const uint8_t* w, int64_t row_bytes, int64_t n,
                                                                   int64_t k, const float* x, int64_t ld_x, int m,
                                                                   float* y, int64_t ld_y) {
  constexpr int kK = 32;
  __shared__ float ws[kTileRows][kK + 1];
  __shared__ float xs[kTileToks][kK + 1];
  const int tid = threadIdx.x;
  const int tr = tid % kTileRows, tg = tid / kTileRows;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const int tok0 = blockIdx.y * kTileToks;
  const int64_t row = row0 + tr;
  float acc[kToksPerThread];
  for (int i = 0; i < kToksPerThread; ++i) acc[i] = 0.0f;
  for (int64_t k0 = 0; k0 < k; k0 += kK) {
    for (int i = tid; i < kTileRows * kK; i += kTileThreads) {
      const int rr = i / kK, kk = i % kK;
      const int64_t r = row0 + rr, e = k0 + kk;
      ws[rr][kk] = r < n && e < k ? float_weight<T>(w + r * row_bytes, e) : 0.0f;
    }
    for (int i = tid; i < kTileToks * kK; i += kTileThreads) {
      const int tt = i / kK, kk = i % kK;
      const int64_t e = k0 + kk;
      const int tok = tok0 + tt;
      xs[tt][kk] = tok < m && e < k ? x[tok * ld_x + e] : 0.0f;
    }
    __syncthreads();
    for (int kk = 0; kk < kK; ++kk) {
      const float wv = ws[tr][kk];
      for (int i = 0; i < kToksPerThread; ++i) acc[i] = fmaf(wv, xs[tg * kToksPerThread + i][kk], acc[i]);
    }
    __syncthreads();
  }
  if (row >= n) return;
  for (int i = 0; i < kToksPerThread; ++i) {
    const int tok = tok0 + tg * kToksPerThread + i;
    if (tok < m) y[tok * ld_y + row] = acc[i];
  }
}

template <DType T>
void matmul_typed(cudaStream_t s, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k, const void* x,
                  int64_t ld_x, int m, float* y, int64_t ld_y) {
  if (m <= 8) {
    const unsigned blocks = static_cast<unsigned>((n + kGemvWarps - 1) / kGemvWarps);
    const int threads = kGemvWarps * 32;
    if (m == 1) {
      gemv_kernel<T, 1><<<blocks, threads, 0, s>>>(w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    } else if (m == 2) {
      gemv_kernel<T, 2><<<blocks, threads, 0, s>>>(w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    } else if (m <= 4) {
      gemv_kernel<T, 4><<<blocks, threads, 0, s>>>(w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    } else {
      gemv_kernel<T, 8><<<blocks, threads, 0, s>>>(w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    }
    METRO_CUDA_LAUNCHED();
    return;
  }
  const dim3 grid(static_cast<unsigned>((n + kTileRows - 1) / kTileRows),
                  static_cast<unsigned>((m + kTileToks - 1) / kTileToks));
  if constexpr (Fmt<T>::kFloat) {
    gemm_float_kernel<T><<<grid, kTileThreads, 0, s>>>(w, row_bytes, n, k, static_cast<const float*>(x), ld_x, m, y,
                                                       ld_y);
  } else {
    gemm_quant_kernel<T><<<grid, kTileThreads, 0, s>>>(w, row_bytes, n, k, static_cast<const uint8_t*>(x), ld_x, m,
                                                       y, ld_y);
  }
  METRO_CUDA_LAUNCHED();
}

}  // namespace

bool matmul_supports(DType type) {
  switch (type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ4_1:
    case DType::kQ5_0:
    case DType::kQ5_1:
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K: return true;
    default: return false;
  }
}

void launch_quantize_acts(cudaStream_t s, DType partner, const float* src, int64_t ld, int rows, int64_t k,
                          uint8_t* dst) {
  const int64_t blocks_per_row = k / act_block_elems(partner);
  const int64_t total = rows * blocks_per_row;
  if (total == 0) return;
  quantize_acts_kernel<<<static_cast<unsigned>((total + 127) / 128), 128, 0, s>>>(partner, src, ld, rows,
                                                                                   blocks_per_row, dst);
  METRO_CUDA_LAUNCHED();
}

void launch_matmul(cudaStream_t s, DType type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                   const void* x, int64_t ld_x, int m, float* y, int64_t ld_y) {
  if (m == 0 || n == 0) return;
  switch (type) {
    case DType::kF32: return matmul_typed<DType::kF32>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kF16: return matmul_typed<DType::kF16>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kBF16: return matmul_typed<DType::kBF16>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ8_0: return matmul_typed<DType::kQ8_0>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ4_0: return matmul_typed<DType::kQ4_0>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ4_1: return matmul_typed<DType::kQ4_1>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ5_0: return matmul_typed<DType::kQ5_0>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ5_1: return matmul_typed<DType::kQ5_1>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ4_K: return matmul_typed<DType::kQ4_K>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ5_K: return matmul_typed<DType::kQ5_K>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    case DType::kQ6_K: return matmul_typed<DType::kQ6_K>(s, w, row_bytes, n, k, x, ld_x, m, y, ld_y);
    default: break;
  }
  cuda_failed("launch_matmul: a weight type the CUDA backend does not multiply", cudaErrorInvalidValue, __FILE__,
              __LINE__);
}

}  // namespace metro::backends::cuda
