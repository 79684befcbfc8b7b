// The AVX2 kernels the table in matmul_avx2.cpp is made of (internal to kernels/).
#pragma once

#include <cstdint>

#include "kernels/kernel_table.h"

namespace metro::kernels::avx2 {

// quant_avx2.cpp: F32 -> partner rows, bit-identical to the references.
void quantize_row_q8_0(const float* x, void* dst, int64_t k, const ActSide& side);
void quantize_row_q8_1(const float* x, void* dst, int64_t k, const ActSide& side);
void quantize_row_q8_k(const float* x, void* dst, int64_t k, const ActSide& side);

// matmul_float_avx2.cpp: F32 / F16 / BF16 weights times F32 acts (row-major).
void tile_f32(const MatmulTile& t);
void tile_f16(const MatmulTile& t);
void tile_x8_f16(const MatmulTile& t);
void tile_bf16(const MatmulTile& t);

// matmul_k_avx2.cpp: K-quants times Q8_K (row-major).
void tile_q4_k(const MatmulTile& t);
void tile_x8_q4_k(const MatmulTile& t);
void tile_x8_q5_k(const MatmulTile& t);
void tile_x8_q6_k(const MatmulTile& t);
void tile_q5_k(const MatmulTile& t);
void tile_q6_k(const MatmulTile& t);
void tile_q2_k(const MatmulTile& t);
void tile_q3_k(const MatmulTile& t);

// matmul_k_low_avx2.cpp: Q2_K and Q3_K in the x8 layout.
void tile_x8_q2_k(const MatmulTile& t);
void tile_x8_q3_k(const MatmulTile& t);

}  // namespace metro::kernels::avx2
