// Paged causal attention on the device, flash style and split over keys ("flash decoding").
//
// A warp takes one item: (token t, KV head g, batch of up to kHeads query heads of g's
// group, split s of the token's keys [0, qpos]). The batch's heads share every K and V row
// the warp reads. Keys are taken in chunks of 32 positions counted from 0 (as the CPU
// kernels do), and a token's chunks are dealt to its S splits in contiguous runs. In a
// chunk each lane scores one key against every head of the batch, the warp updates each
// head's running max and sum once per chunk, and each lane accumulates its own dims of each
// head's output over the chunk's values. Scores and sums are F32; the exponentials are
// evaluated in double and rounded once. Q8_0 keys are scored in integers against the query
// rounded to int8 per 32 values (formats.h: quantize_query_block, score_q8_row), with the
// CPU kernels' bits.
//
// S depends only on the launch shape (tokens, query heads, KV heads: all in a CUDA graph's
// key), never on the sequences' lengths, which the kernels read from the step's index
// arrays on the device: a split past a token's last chunk has no keys and leaves an empty
// partial (max -inf, sum 0). With S = 1 each warp writes its heads' outputs. Otherwise it
// writes unnormalized partials (accumulator, max, sum) to the state's scratch, and a second
// kernel combines each (token, head)'s S partials. The scratch has a fixed size: splitting
// is only chosen while the items are fewer than kTargetWarps, which bounds the partials.
#include <algorithm>
#include <cmath>

#include "backends/cuda/cuda_kernels.cuh"
#include "backends/cuda/formats.h"
#include "base/check.h"

namespace metro::backends::cuda {

namespace {

constexpr int kWarps = 4;  // warps per block
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;
constexpr int kHeads = 4;           // query heads per warp, sharing its K / V reads
constexpr int kTargetWarps = 4096;  // split keys while a step has fewer items than this
constexpr int kMaxSplits = 64;
constexpr unsigned kFull = 0xffffffffu;

// The partials' scratch: while S > 1, items * S <= kTargetWarps, so (tokens x query heads
// x S) <= kTargetWarps x kHeads records of head_dim + 2 floats.
constexpr int64_t kMaxRecords = static_cast<int64_t>(kTargetWarps) * kHeads;

struct Plan {
  int batches = 1;          // head batches per KV head
  int heads_per_batch = 1;  // the last batch may hold fewer
  int splits = 1;
};

Plan plan(int n, int n_head, int n_head_kv) {
  Plan p;
  const int group = n_head / n_head_kv;
  p.batches = (group + kHeads - 1) / kHeads;
  p.heads_per_batch = (group + p.batches - 1) / p.batches;
  const int64_t items = static_cast<int64_t>(n) * n_head_kv * p.batches;
  p.splits = items >= kTargetWarps ? 1 : static_cast<int>(std::min<int64_t>(kMaxSplits, kTargetWarps / items));
  return p;
}

struct AttnArgs {
  KvDev kv;
  RunsDev rd;
  const float* q;
  int64_t ld_q;
  float* out;
  int64_t ld_out;
  float* part;  // S > 1: the partials, record (t * n_head + h) * S + s, head_dim + 2 floats each
  int n;
  int n_head;
  int layer;
  Plan plan;
  float scale;
};

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}

// A butterfly: every lane ends with the same bits (each addition is commutative).
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o /= 2) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// F16 key row against the first nh query rows of q, into sc[0 .. nh).
__device__ __forceinline__ void score_f16(const float (*q)[kMaxHeadDim], int nh, const uint8_t* krow, int hd,
                                          float* sc) {
  float dot[kHeads];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) dot[hh] = 0.0f;
  for (int d = 0; d < hd; d += 8) {
    const uint4 w = *reinterpret_cast<const uint4*>(krow + 2 * d);  // rows are 16-byte aligned
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
    float k[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      k[2 * i] = fp16_to_f32(static_cast<uint16_t>(words[i] & 0xffffu));
      k[2 * i + 1] = fp16_to_f32(static_cast<uint16_t>(words[i] >> 16));
    }
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) {
      if (hh >= nh) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) dot[hh] += q[hh][d + e] * k[e];
    }
  }
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) sc[hh] = dot[hh];
}

__device__ __forceinline__ float value_at(const uint8_t* vrow, int d, bool q8) {
  if (!q8) return load_fp16(vrow + 2 * d);
  const uint8_t* blk = vrow + 34 * (d / 32);
  return static_cast<float>(static_cast<int8_t>(blk[2 + d % 32])) * load_fp16(blk);
}

__global__ void __launch_bounds__(kWarps * 32) attention_kernel(const AttnArgs a) {
  __shared__ float qs[kWarps][kHeads][kMaxHeadDim];
  __shared__ __align__(16) int8_t qi[kWarps][kHeads][kMaxHeadDim];
  __shared__ float qd[kWarps][kHeads][kMaxHeadDim / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const KvDev& kv = a.kv;
  const int n_kv = kv.n_head_kv;
  int64_t item = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (item >= static_cast<int64_t>(a.n) * n_kv * a.plan.batches * a.plan.splits) return;  // whole warp
  const int s = static_cast<int>(item % a.plan.splits);
  item /= a.plan.splits;
  const int hb = static_cast<int>(item % a.plan.batches);
  item /= a.plan.batches;
  const int g = static_cast<int>(item % n_kv);
  const int t = static_cast<int>(item / n_kv);
  const int group = a.n_head / n_kv;
  const int h0 = g * group + hb * a.plan.heads_per_batch;
  const int nh = min(a.plan.heads_per_batch, group - hb * a.plan.heads_per_batch);
  if (nh <= 0) return;  // whole warp; the plan never makes such a batch
  const int r = a.rd.tok_run[t];
  const int start = a.rd.runs[4 * r], pos0 = a.rd.runs[4 * r + 2];
  const int32_t* table = a.rd.tables + a.rd.runs[4 * r + 3];
  const int64_t qpos = static_cast<int64_t>(pos0) + (t - start);
  const int hd = kv.head_dim;

  const float* src = a.q + t * a.ld_q + static_cast<int64_t>(h0) * hd;
  for (int e = lane; e < nh * hd; e += 32) qs[warp][e / hd][e % hd] = mul_rn(src[e], a.scale);
  __syncwarp();
  if (kv.q8) {
    const int nb = hd / 32;
    for (int e = lane; e < nh * nb; e += 32) {
      const int hh = e / nb, b = e % nb;
      qd[warp][hh][b] = quantize_query_block(&qs[warp][hh][32 * b], &qi[warp][hh][32 * b]);
    }
    __syncwarp();
  }

  const int64_t k_off = static_cast<int64_t>(2 * a.layer) * kv.page_bytes + static_cast<int64_t>(g) * kv.head_bytes;
  const int64_t n_chunks = qpos / 32 + 1;
  const int64_t per = (n_chunks + a.plan.splits - 1) / a.plan.splits;
  const int64_t c0 = s * per, c1 = min(n_chunks, c0 + per);

  float m[kHeads], l[kHeads], acc[kHeads][kDimsPerLane];
#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    m[hh] = -INFINITY;
    l[hh] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[hh][i] = 0.0f;
  }
  for (int64_t c = c0; c < c1; ++c) {
    const int64_t kb = 32 * c;
    const int valid = static_cast<int>(min(static_cast<int64_t>(32), qpos + 1 - kb));  // warp-uniform, >= 1
    long long row = 0;  // this lane's key row in the arena; its value row is page_bytes on
    float sc[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) sc[hh] = -INFINITY;
    if (lane < valid) {
      const int64_t p = kb + lane;
      row = static_cast<int64_t>(table[p / kv.block_size]) * kv.block_bytes + k_off + (p % kv.block_size) * kv.row_bytes;
      const uint8_t* krow = kv.arena + row;
      if (kv.q8) {
#pragma unroll
        for (int hh = 0; hh < kHeads; ++hh) {
          if (hh < nh) sc[hh] = score_q8_row(qi[warp][hh], qd[warp][hh], krow, hd);
        }
      } else {
        score_f16(qs[warp], nh, krow, hd, sc);
      }
    }
    float pj[kHeads];
#pragma unroll
    for (int hh = 0; hh < kHeads; ++hh) {
      pj[hh] = 0.0f;
      if (hh >= nh) continue;  // nh is warp-uniform: the shuffles below see every lane
      const float mx = fmaxf(m[hh], warp_max(sc[hh]));
      const float alpha = static_cast<float>(exp(static_cast<double>(m[hh] - mx)));
      pj[hh] = lane < valid ? static_cast<float>(exp(static_cast<double>(sc[hh] - mx))) : 0.0f;
      l[hh] = l[hh] * alpha + warp_sum(pj[hh]);
      m[hh] = mx;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) acc[hh][i] *= alpha;
    }
#pragma unroll 4
    for (int j = 0; j < valid; ++j) {
      const uint8_t* vrow = kv.arena + __shfl_sync(kFull, row, j) + kv.page_bytes;
      float v[kDimsPerLane];
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        v[i] = d < hd ? value_at(vrow, d, kv.q8) : 0.0f;
      }
#pragma unroll
      for (int hh = 0; hh < kHeads; ++hh) {
        if (hh >= nh) break;
        const float pb = __shfl_sync(kFull, pj[hh], j);
#pragma unroll
        for (int i = 0; i < kDimsPerLane; ++i) acc[hh][i] += pb * v[i];
      }
    }
  }

#pragma unroll
  for (int hh = 0; hh < kHeads; ++hh) {
    if (hh >= nh) break;
    float* dst;
    if (a.plan.splits == 1) {
      dst = a.out + t * a.ld_out + static_cast<int64_t>(h0 + hh) * hd;
    } else {
      const int64_t rec = (static_cast<int64_t>(t) * a.n_head + h0 + hh) * a.plan.splits + s;
      dst = a.part + rec * (hd + 2);
      if (lane == 0) {  // m and l are the same on every lane
        dst[hd] = m[hh];
        dst[hd + 1] = l[hh];
      }
    }
    const float scale = a.plan.splits == 1 ? 1.0f / l[hh] : 1.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) dst[d] = a.plan.splits == 1 ? acc[hh][i] * scale : acc[hh][i];
    }
  }
}

// One warp per (token, query head): its S partials rescaled to their common max, summed,
// and normalized. Lanes take the splits' maxima and weights in parallel; the
// weighted sum then reads the splits' accumulators independently of each other.
__global__ void __launch_bounds__(kWarps * 32)
    combine_kernel(const float* part, int splits, int hd, int rows, int n_head, float* out, int64_t ld_out) {
  __shared__ float ws[kWarps][kMaxSplits];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (row >= rows) return;  // whole warp
  const int64_t stride = hd + 2;
  const float* pr = part + row * splits * stride;
  float mx = -INFINITY;
  for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, pr[s * stride + hd]);
  mx = warp_max(mx);
  float ls = 0.0f;
  for (int s = lane; s < splits; s += 32) {
    const float l = pr[s * stride + hd + 1];
    // A split without keys (max -inf, sum 0, accumulator 0) weighs 0.
    const float w = l == 0.0f ? 0.0f : static_cast<float>(exp(static_cast<double>(pr[s * stride + hd] - mx)));
    ws[warp][s] = w;
    ls += l * w;
  }
  const float l = warp_sum(ls);
  __syncwarp();
  float acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;
#pragma unroll 8
  for (int s = 0; s < splits; ++s) {
    const float* ps = pr + s * stride;
    const float w = ws[warp][s];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] += ps[d] * w;
    }
  }
  const int t = static_cast<int>(row / n_head), h = static_cast<int>(row % n_head);
  float* dst = out + t * ld_out + static_cast<int64_t>(h) * hd;
  const float inv = 1.0f / l;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) dst[d] = acc[i] * inv;
  }
}

}  // namespace

size_t attention_scratch_bytes() { return static_cast<size_t>(kMaxRecords) * (kMaxHeadDim + 2) * sizeof(float); }

void launch_attention(cudaStream_t s, const KvDev& kv, int layer, const RunsDev& runs, const float* q, int64_t ld_q,
                      float* out, int64_t ld_out, int n, int n_head, float scale, float* scratch) {
  if (n == 0 || n_head == 0) return;
  METRO_CHECK(kv.head_dim > 0 && kv.head_dim <= kMaxHeadDim && n_head % kv.n_head_kv == 0);
  const Plan p = plan(n, n_head, kv.n_head_kv);
  const int64_t records = static_cast<int64_t>(n) * n_head * p.splits;
  METRO_CHECK(p.splits == 1 || records <= kMaxRecords);
  const AttnArgs a{kv, runs, q, ld_q, out, ld_out, scratch, n, n_head, layer, p, scale};
  const int64_t warps = static_cast<int64_t>(n) * kv.n_head_kv * p.batches * p.splits;
  attention_kernel<<<static_cast<unsigned>((warps + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(a);
  METRO_CUDA_LAUNCHED();
  if (p.splits == 1) return;
  const int rows = n * n_head;
  combine_kernel<<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kWarps * 32, 0, s>>>(scratch, p.splits,
                                                                                            kv.head_dim, rows, n_head,
                                                                                            out, ld_out);
  METRO_CUDA_LAUNCHED();
}

}  // namespace metro::backends::cuda
