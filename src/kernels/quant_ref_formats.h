// Per-format scalar reference rows (internal to kernels/): what quantize_row_ref and
// dequantize_row_ref dispatch to. n is a multiple of the format's block size.
#pragma once

#include <cstdint>

namespace metro::kernels {

// round(v) with halves away from zero (C's roundf), as an int8; |v| must be < 127.5.
int8_t round_half_away_i8(float v);

// The smallest binary16 value >= v (v >= 0 and finite): a super-block scale rounded this
// way never makes a sub-block scale overflow its integer field.
uint16_t fp16_round_up(float v);

void dequant_q4_0_ref(const void* src, float* dst, int64_t n);
void dequant_q4_1_ref(const void* src, float* dst, int64_t n);
void dequant_q5_0_ref(const void* src, float* dst, int64_t n);
void dequant_q5_1_ref(const void* src, float* dst, int64_t n);
void dequant_q8_0_ref(const void* src, float* dst, int64_t n);
void dequant_q8_1_ref(const void* src, float* dst, int64_t n);
void dequant_q2_k_ref(const void* src, float* dst, int64_t n);
void dequant_q3_k_ref(const void* src, float* dst, int64_t n);
void dequant_q4_k_ref(const void* src, float* dst, int64_t n);
void dequant_q5_k_ref(const void* src, float* dst, int64_t n);
void dequant_q6_k_ref(const void* src, float* dst, int64_t n);
void dequant_q8_k_ref(const void* src, float* dst, int64_t n);

void quant_q4_0_ref(const float* src, void* dst, int64_t n);
// Q4_0 with an importance-weighted step search (quantize_row_ref_weighted).
void quant_q4_0_weighted(const float* src, void* dst, int64_t n, const float* importance);
void quant_q4_1_ref(const float* src, void* dst, int64_t n);
void quant_q5_0_ref(const float* src, void* dst, int64_t n);
void quant_q5_1_ref(const float* src, void* dst, int64_t n);
void quant_q8_0_ref(const float* src, void* dst, int64_t n);
void quant_q8_1_ref(const float* src, void* dst, int64_t n);
// importance: n weights of the elements' squared errors in the scale search, or null.
void quant_q2_k_ref(const float* src, void* dst, int64_t n, const float* importance = nullptr);
void quant_q3_k_ref(const float* src, void* dst, int64_t n, const float* importance = nullptr);
void quant_q4_k_ref(const float* src, void* dst, int64_t n);
void quant_q5_k_ref(const float* src, void* dst, int64_t n);
void quant_q6_k_ref(const float* src, void* dst, int64_t n);
void quant_q8_k_ref(const float* src, void* dst, int64_t n);

}  // namespace metro::kernels
