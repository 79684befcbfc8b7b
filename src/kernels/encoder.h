// Kernels of encoder (BERT-family) models: layer norm with bias, exact GELU, and
// bidirectional attention of one head over a sequence held in activation rows. They are not
// part of a KernelSet: the attention's dot products and exponentials use the free functions
// of ops.h (the widest set this CPU runs) whichever set the executor runs with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace metro::kernels {

// y = (x - mean) / sqrt(var + eps) * weight + bias (biased variance; y may alias x).
void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps);

// y = x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact form (y may alias x).
void gelu_erf(const float* x, float* y, int64_t n);

// The most tokens encoder_attention_head takes (its score row lives on the stack).
inline constexpr int kMaxEncoderTokens = 8192;

// One query head of bidirectional attention over n tokens: out[i] = sum_j softmax_j(scale *
// q[i] . k[j]) v[j]. q, k, v and out point at the head's first value in token 0's row; rows
// are q_stride / kv_stride / out_stride floats apart. n <= kMaxEncoderTokens.
void encoder_attention_head(const float* q, size_t q_stride, const float* k, const float* v, size_t kv_stride,
                            float* out, size_t out_stride, int n, int head_dim, float scale);

// Double-precision definitions of the same, the reference the tests hold them to.
namespace ref {
void layer_norm(const float* x, const float* weight, const float* bias, float* y, int64_t n, float eps);
void gelu_erf(const float* x, float* y, int64_t n);
void encoder_attention_head(const float* q, size_t q_stride, const float* k, const float* v, size_t kv_stride,
                            float* out, size_t out_stride, int n, int head_dim, float scale);
}  // namespace ref

}  // namespace metro::kernels
