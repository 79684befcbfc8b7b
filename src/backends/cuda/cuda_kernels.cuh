// Internal to backends/cuda: the kernels' launchers, one per op (and the products' parts),
// each enqueued on the given stream. Sizes are in elements unless named bytes; `ld` is the
// floats between consecutive rows of a buffer. Launchers check the launch (not the run).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

namespace metro::backends::cuda {

using kernels::DType;

[[noreturn]] void cuda_failed(const char* expr, cudaError_t err, const char* file, int line);

}  // namespace metro::backends::cuda

// Every CUDA runtime call goes through this: a failure aborts with the call, the place and
// the runtime's message (an error here is a broken device or a bug, not bad input).
#define METRO_CUDA_OK(expr)                                                          \
  do {                                                                               \
    const cudaError_t metro_cuda_err_ = (expr);                                      \
    if (metro_cuda_err_ != cudaSuccess)                                              \
      ::metro::backends::cuda::cuda_failed(#expr, metro_cuda_err_, __FILE__, __LINE__); \
  } while (0)

// After each kernel launch: a bad configuration shows here, a fault in the kernel at the
// next synchronising call (or here when METRO_CUDA_SYNC=1 makes every op synchronise).
#define METRO_CUDA_LAUNCHED() METRO_CUDA_OK(cudaGetLastError())

namespace metro::backends::cuda {

// A KV arena's geometry (backends/kv_view.h), in bytes, with the arena's device address.
struct KvDev {
  uint8_t* arena = nullptr;
  int64_t block_bytes = 0;  // one block: every layer's K and V pages
  int64_t page_bytes = 0;
  int64_t head_bytes = 0;   // one KV head's rows in a page
  int64_t row_bytes = 0;    // one token's row of one head
  int block_size = 0;
  int n_head_kv = 0;
  int head_dim = 0;
  bool q8 = false;          // Q8_0 pages (else F16)
  int32_t n_blocks = 0;
};

// A step's sequence runs on the device: run r is runs[4r ..]: batch start, tokens, pos0 and
// the offset of its block ids in `tables`; tok_run[t] is the run of batch token t.
struct RunsDev {
  const int32_t* runs = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* tok_run = nullptr;
};

// ---- elementwise ops (cuda_elementwise.cu) ----------------------------------------------

// dst[t] = row token[t] of a padded-block table of n_cols columns, dequantized, times scale.
void launch_embed(cudaStream_t s, DType type, const uint8_t* table, int64_t row_bytes, int64_t n_cols,
                  int64_t n_rows, const int32_t* token, int n, float scale, float* dst, int64_t ld);
// dst[t] = cos then sin of pos[t] * inv_freq[i], i < half, times mscale.
void launch_rope_angles(cudaStream_t s, const double* inv_freq, int half, double mscale, const int32_t* pos, int n,
                        float* dst, int64_t ld);
// dst[r] = rms_norm(src[rows ? rows[r] : r]) * w over n values.
void launch_rms_norm(cudaStream_t s, const float* src, int64_t ld_src, const int32_t* rows, int n_rows,
                     const float* w, float* dst, int64_t ld_dst, int64_t n, float eps);
// x[t] += b (n rows of cols values).
void launch_add_bias(cudaStream_t s, float* x, const float* b, int n, int64_t cols);
// Rotates n_head heads of x[t] by the angles cs[t] (half cos, then half sin).
void launch_rope(cudaStream_t s, float* x, int64_t ld, const float* cs, int64_t ld_cs, int n, int n_head,
                 int head_dim, int n_rot, bool neox);
// dst = a + b over count values.
void launch_add(cudaStream_t s, const float* a, const float* b, float* dst, int64_t count);
// dst = silu(gate) * up over count values, or gelu(gate) * up (tanh approximation) when gelu.
void launch_swiglu(cudaStream_t s, const float* gate, const float* up, float* dst, int64_t count, bool gelu);
// K and V rows of n tokens (ld floats apart, n_head_kv * head_dim each) into the slot of
// pos[t] in block kv_block[t] of layer `layer`.
void launch_kv_store(cudaStream_t s, const KvDev& kv, int layer, const float* k, const float* v, int64_t ld,
                     const int32_t* pos, const int32_t* kv_block, int n);

// ---- attention (cuda_attention.cu) -----------------------------------------------------

// Causal attention of n tokens' n_head query heads over their sequences' keys of `layer`.
// scratch: attention_scratch_bytes() of device memory for partial results (a step with few
// query tokens splits each token's keys among warps and combines their partials).
void launch_attention(cudaStream_t s, const KvDev& kv, int layer, const RunsDev& runs, const float* q,
                      int64_t ld_q, float* out, int64_t ld_out, int n, int n_head, float scale, float* scratch);
// The partials' scratch launch_attention needs, whatever the step (a few MiB).
size_t attention_scratch_bytes();

// ---- products (cuda_matmul.cu) -----------------------------------------------------------

// rows rows of k floats (ld apart) into the partner's device blocks (act_row_bytes apart).
void launch_quantize_acts(cudaStream_t s, DType partner, const float* src, int64_t ld, int rows, int64_t k,
                          uint8_t* dst);
// y[i][j] = x[i] · w[j] for i < m, j < n: w has n padded rows of k elements (row_bytes
// apart); x is m F32 rows (ld_x apart) for a float weight type, else m rows of partner
// blocks (act_row_bytes(partner, k) apart); y rows are ld_y apart.
void launch_matmul(cudaStream_t s, DType type, const uint8_t* w, int64_t row_bytes, int64_t n, int64_t k,
                   const void* x, int64_t ld_x, int m, float* y, int64_t ld_y);

// Whether launch_matmul multiplies this weight type.
bool matmul_supports(DType type);

}  // namespace metro::backends::cuda
