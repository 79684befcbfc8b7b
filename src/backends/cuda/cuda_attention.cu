// Paged causal attention on the device: one warp per (token, query head), flash style.
// Keys are taken in chunks of 32 positions counted from 0 (as the CPU kernels do): each
// lane scores one key of the chunk against the whole query row, the warp updates its
// running max and sum once per chunk, and each lane accumulates its own dims of the output
// over the chunk's values. Scores and sums are F32; the exponentials are evaluated in
// double and rounded once. Q8_0 keys are scored in integers against the query rounded to
// int8 per 32 values, exactly as kernels/attention_impl.h's quantize_query_q8 rounds it.
//
// Simple first: a GQA group's heads each read their KV head's rows (no sharing between the
// warps of a group), and a long sequence is one warp's loop (no split over keys).
#include <cmath>

#include "backends/cuda/cuda_kernels.cuh"
#include "backends/cuda/formats.h"

namespace metro::backends::cuda {

namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ float score_f16(const float* q, const uint8_t* krow, int hd) {
  float dot = 0.0f;
  for (int d = 0; d < hd; d += 8) {
    const uint4 w = *reinterpret_cast<const uint4*>(krow + 2 * d);  // rows are 16-byte aligned
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    for (int i = 0; i < 4; ++i) {
      dot += q[d + 2 * i] * fp16_to_f32(static_cast<uint16_t>(words[i] & 0xffffu));
      dot += q[d + 2 * i + 1] * fp16_to_f32(static_cast<uint16_t>(words[i] >> 16));
    }
  }
  return dot;
}

__device__ float score_q8(const int8_t* qi, const float* qd, const uint8_t* krow, int hd) {
  float dot = 0.0f;
  for (int b = 0; b < hd / 32; ++b) {
    const uint8_t* blk = krow + 34 * b;
    int isum = 0;
    for (int k = 0; k < 8; ++k) {
      isum = dot4(*reinterpret_cast<const uint32_t*>(qi + 32 * b + 4 * k), load_u32_a2(blk + 2 + 4 * k), isum);
    }
    dot = fmaf(static_cast<float>(isum), qd[b] * load_fp16(blk), dot);
  }
  return dot;
}

__device__ float value_at(const uint8_t* vrow, int d, bool q8) {
  if (!q8) return load_fp16(vrow + 2 * d);
  const uint8_t* blk = vrow + 34 * (d / 32);
  return static_cast<float>(static_cast<int8_t>(blk[2 + d % 32])) * load_fp16(blk);
}

__global__ void attention_kernel(KvDev kv, int layer, RunsDev rd, const float* q, int64_t ld_q, float* out,
                                 int64_t ld_out, int n, int n_head, float scale) {
  __shared__ float qs[kWarps][kMaxHeadDim];
  __shared__ __align__(16) int8_t qi[kWarps][kMaxHeadDim];
  __shared__ float qd[kWarps][kMaxHeadDim / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= static_cast<int64_t>(n) * n_head) return;  // the whole warp: no block barrier below
  const int t = static_cast<int>(item / n_head), h = static_cast<int>(item % n_head);
  const int r = rd.tok_run[t];
  const int start = rd.runs[4 * r], pos0 = rd.runs[4 * r + 2];
  const int32_t* table = rd.tables + rd.runs[4 * r + 3];
  const int64_t qpos = static_cast<int64_t>(pos0) + (t - start);
  const int hd = kv.head_dim;
  const int kvh = h / (n_head / kv.n_head_kv);

  float* qw = qs[warp];
  const float* src = q + t * ld_q + static_cast<int64_t>(h) * hd;
  for (int d = lane; d < hd; d += 32) qw[d] = src[d] * scale;
  __syncwarp();
  if (kv.q8) {
    for (int b = lane; b < hd / 32; b += 32) qd[warp][b] = quantize_query_block(qw + 32 * b, qi[warp] + 32 * b);
    __syncwarp();
  }

  const int64_t k_off = static_cast<int64_t>(2 * layer) * kv.page_bytes + static_cast<int64_t>(kvh) * kv.head_bytes;
  const int64_t v_off = k_off + kv.page_bytes;
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerLane];
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;
  for (int64_t kb = 0; kb <= qpos; kb += 32) {
    const int valid = static_cast<int>(min(static_cast<int64_t>(32), qpos + 1 - kb));
    float s = -INFINITY;
    if (lane < valid) {
      const int64_t p = kb + lane;
      const uint8_t* krow = kv.arena + static_cast<int64_t>(table[p / kv.block_size]) * kv.block_bytes + k_off +
                            (p % kv.block_size) * kv.row_bytes;
      s = kv.q8 ? score_q8(qi[warp], qd[warp], krow, hd) : score_f16(qw, krow, hd);
    }
    const float mx = fmaxf(m, warp_max(s));
    const float alpha = static_cast<float>(exp(static_cast<double>(m - mx)));
    const float pj = lane < valid ? static_cast<float>(exp(static_cast<double>(s - mx))) : 0.0f;
    const float sum = warp_sum(pj);
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= alpha;
    for (int j = 0; j < valid; ++j) {
      const float pb = __shfl_sync(0xffffffffu, pj, j);
      const int64_t p = kb + j;
      const uint8_t* vrow = kv.arena + static_cast<int64_t>(table[p / kv.block_size]) * kv.block_bytes + v_off +
                            (p % kv.block_size) * kv.row_bytes;
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) acc[i] += pb * value_at(vrow, d, kv.q8);
      }
    }
    l = l * alpha + sum;
    m = mx;
  }
  float* dst = out + t * ld_out + static_cast<int64_t>(h) * hd;
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) dst[d] = acc[i] / l;
  }
}

}  // namespace

void launch_attention(cudaStream_t s, const KvDev& kv, int layer, const RunsDev& runs, const float* q, int64_t ld_q,
                      float* out, int64_t ld_out, int n, int n_head, float scale) {
  const int64_t items = static_cast<int64_t>(n) * n_head;
  if (items == 0) return;
  const unsigned blocks = static_cast<unsigned>((items + kWarps - 1) / kWarps);
  attention_kernel<<<blocks, kWarps * 32, 0, s>>>(kv, layer, runs, q, ld_q, out, ld_out, n, n_head, scale);
  METRO_CUDA_LAUNCHED();
}

}  // namespace metro::backends::cuda
