// Scalar reference implementations of every block format: the definition of what the SIMD
// kernels must compute, used by tests and as the fallback on CPUs without AVX2.
//
// Formats follow the GGUF/ggml block layouts bit for bit, so weights from any GGUF file
// dequantize to the values the reference implementation (llama.cpp) computes.
#pragma once

#include <cstdint>

#include "kernels/dtype.h"

namespace metro::kernels {

// n must be a multiple of traits(t).block_size.
void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n);
void quantize_row_ref(DType t, const float* src, void* dst, int64_t n);
// Whether quantize_row_ref_weighted() uses its weights for format t (Q2_K, Q3_K and Q4_0,
// whose scales it searches); for any other it is quantize_row_ref().
bool quantize_takes_importance(DType t);
// quantize_row_ref() minimizing importance-weighted squared error: importance[i] (>= 0, n of
// them) weighs element i, e.g. the mean square of the activations its column multiplies.
void quantize_row_ref_weighted(DType t, const float* src, void* dst, int64_t n, const float* importance);

// Dot product of a weight row in type `wt` with an activation row already quantized to
// traits(wt).dot_partner; n elements. Accumulates in double: a precise reference.
double vec_dot_ref(DType wt, const void* w, const void* a, int64_t n);

// The same sum with every term (and every integer product) taken by absolute value. Any
// float evaluation of the dot product that combines the per-block terms in some order is
// within (number of blocks + a few) * 2^-24 of this magnitude of vec_dot_ref: tests derive
// their tolerances from it.
double vec_dot_magnitude_ref(DType wt, const void* w, const void* a, int64_t n);

// Worst-case round-trip error bound of quantize+dequantize for one block of values, as a
// multiple of the block's max |x| (derived per format in vec_dot_ref.cpp). Holds while the
// block's scales are normal binary16 numbers (block max |x| above ~1e-3).
double roundtrip_error_bound(DType t);

}  // namespace metro::kernels
