// The CUDA backend's elementwise ops. Each computes what the scalar reference of its op
// computes (kernels/ops_ref.cpp, quant_ref.cpp, attention.cpp's page writers): where the
// reference sums or evaluates a transcendental function in double and rounds once, so do
// these; dequantization and the KV page writers give the reference's bits.
#include <cmath>

#include "backends/cuda/cuda_kernels.cuh"
#include "backends/cuda/formats.h"

namespace metro::backends::cuda {

namespace {

constexpr int kThreads = 256;

int grid_for(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }

__global__ void embed_kernel(DType type, const uint8_t* table, int64_t row_bytes, int64_t n_cols,
                             const int32_t* token, float scale, float* dst, int64_t ld) {
  const int t = blockIdx.x;
  const BlockGeom g = block_geom(type);
  const uint8_t* row = table + static_cast<int64_t>(token[t]) * row_bytes;
  for (int64_t i = threadIdx.x; i < n_cols; i += blockDim.x) {
    dst[t * ld + i] = dequant_elem(type, row + i / g.elems * g.bytes, static_cast<int>(i % g.elems)) * scale;
  }
}

__global__ void rope_angles_kernel(const double* inv_freq, int half, double mscale, const int32_t* pos, float* dst,
                                   int64_t ld) {
  const int t = blockIdx.x;
  const double p = static_cast<double>(pos[t]);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(p * inv_freq[i], &s, &c);
    dst[t * ld + i] = static_cast<float>(c * mscale);
    dst[t * ld + half + i] = static_cast<float>(s * mscale);
  }
}

// The sum of every thread's v over the block (blockDim.x a multiple of 32, at most 1024),
// in a fixed order; every thread gets it.
__device__ double block_sum(double v) {
  __shared__ double part[32];
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // part may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  const int n_warps = blockDim.x / 32;
  double total = 0.0;
  for (int w = 0; w < n_warps; ++w) total += part[w];
  return total;
}

__global__ void rms_norm_kernel(const float* src, int64_t ld_src, const int32_t* rows, const float* w, float* dst,
                                int64_t ld_dst, int64_t n, float eps) {
  const int r = blockIdx.x;
  const float* x = src + (rows != nullptr ? rows[r] : r) * ld_src;
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += static_cast<double>(x[i]) * x[i];
  ss = block_sum(ss);
  const double inv = 1.0 / sqrt(ss / static_cast<double>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    dst[r * ld_dst + i] = static_cast<float>(static_cast<double>(x[i]) * inv * static_cast<double>(w[i]));
  }
}

__global__ void add_bias_kernel(float* x, const float* b, int64_t count, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) x[i] = x[i] + b[i % cols];
}

__global__ void rope_kernel(float* x, int64_t ld, const float* cs, int64_t ld_cs, int n_head, int head_dim,
                            int n_rot, bool neox) {
  const int t = blockIdx.x;
  const int half = n_rot / 2;
  const float* co = cs + t * ld_cs;
  const float* si = co + half;
  for (int e = threadIdx.x; e < n_head * half; e += blockDim.x) {
    const int h = e / half, i = e % half;
    float* v = x + t * ld + static_cast<int64_t>(h) * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const double x0 = v[a], x1 = v[b];
    v[a] = static_cast<float>(x0 * co[i] - x1 * si[i]);
    v[b] = static_cast<float>(x0 * si[i] + x1 * co[i]);
  }
}

__global__ void add_kernel(const float* a, const float* b, float* dst, int64_t count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) dst[i] = a[i] + b[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* dst, int64_t count, bool gelu) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) {
    const double g = gate[i];
    // gelu (tanh approximation) as g / (1 + e^(-2z)), z = sqrt(2/pi) (g + 0.044715 g^3).
    const double e = gelu ? -2.0 * 0.7978845608028654 * (g + 0.044715 * g * g * g) : -g;
    dst[i] = static_cast<float>(g / (1.0 + exp(e)) * static_cast<double>(up[i]));
  }
}

// Block (t, kv) writes token t's K (kv 0) or V (kv 1) rows: F16 one value per thread,
// Q8_0 one 32-block per thread.
__global__ void kv_store_kernel(KvDev kv, int layer, const float* k, const float* v, int64_t ld, const int32_t* pos,
                                const int32_t* kv_block) {
  const int t = blockIdx.x, which = blockIdx.y;
  const float* x = (which == 0 ? k : v) + t * ld;
  const int slot = pos[t] % kv.block_size;
  uint8_t* page = kv.arena + static_cast<int64_t>(kv_block[t]) * kv.block_bytes +
                  static_cast<int64_t>(2 * layer + which) * kv.page_bytes + slot * kv.row_bytes;
  const int hd = kv.head_dim;
  if (kv.q8) {
    const int per_head = hd / 32;
    for (int e = threadIdx.x; e < kv.n_head_kv * per_head; e += blockDim.x) {
      const int h = e / per_head, b = e % per_head;
      store_q8_0_block(x + h * hd + 32 * b, page + h * kv.head_bytes + 34 * b);
    }
  } else {
    for (int e = threadIdx.x; e < kv.n_head_kv * hd; e += blockDim.x) {
      const int h = e / hd, d = e % hd;
      *reinterpret_cast<uint16_t*>(page + h * kv.head_bytes + 2 * d) = f32_to_fp16(x[e]);
    }
  }
}

}  // namespace

void launch_embed(cudaStream_t s, DType type, const uint8_t* table, int64_t row_bytes, int64_t n_cols, int64_t,
                  const int32_t* token, int n, float scale, float* dst, int64_t ld) {
  if (n == 0) return;
  embed_kernel<<<n, kThreads, 0, s>>>(type, table, row_bytes, n_cols, token, scale, dst, ld);
  METRO_CUDA_LAUNCHED();
}

void launch_rope_angles(cudaStream_t s, const double* inv_freq, int half, double mscale, const int32_t* pos, int n,
                        float* dst, int64_t ld) {
  if (n == 0) return;
  rope_angles_kernel<<<n, 128, 0, s>>>(inv_freq, half, mscale, pos, dst, ld);
  METRO_CUDA_LAUNCHED();
}

void launch_rms_norm(cudaStream_t s, const float* src, int64_t ld_src, const int32_t* rows, int n_rows,
                     const float* w, float* dst, int64_t ld_dst, int64_t n, float eps) {
  if (n_rows == 0) return;
  rms_norm_kernel<<<n_rows, kThreads, 0, s>>>(src, ld_src, rows, w, dst, ld_dst, n, eps);
  METRO_CUDA_LAUNCHED();
}

void launch_add_bias(cudaStream_t s, float* x, const float* b, int n, int64_t cols) {
  const int64_t count = int64_t{n} * cols;
  if (count == 0) return;
  add_bias_kernel<<<grid_for(count), kThreads, 0, s>>>(x, b, count, cols);
  METRO_CUDA_LAUNCHED();
}

void launch_rope(cudaStream_t s, float* x, int64_t ld, const float* cs, int64_t ld_cs, int n, int n_head,
                 int head_dim, int n_rot, bool neox) {
  if (n == 0) return;
  rope_kernel<<<n, 128, 0, s>>>(x, ld, cs, ld_cs, n_head, head_dim, n_rot, neox);
  METRO_CUDA_LAUNCHED();
}

void launch_add(cudaStream_t s, const float* a, const float* b, float* dst, int64_t count) {
  if (count == 0) return;
  add_kernel<<<grid_for(count), kThreads, 0, s>>>(a, b, dst, count);
  METRO_CUDA_LAUNCHED();
}

void launch_swiglu(cudaStream_t s, const float* gate, const float* up, float* dst, int64_t count, bool gelu) {
  if (count == 0) return;
  swiglu_kernel<<<grid_for(count), kThreads, 0, s>>>(gate, up, dst, count, gelu);
  METRO_CUDA_LAUNCHED();
}

void launch_kv_store(cudaStream_t s, const KvDev& kv, int layer, const float* k, const float* v, int64_t ld,
                     const int32_t* pos, const int32_t* kv_block, int n) {
  if (n == 0) return;
  kv_store_kernel<<<dim3(static_cast<unsigned>(n), 2), 128, 0, s>>>(kv, layer, k, v, ld, pos, kv_block);
  METRO_CUDA_LAUNCHED();
}

}  // namespace metro::backends::cuda
