// Scalar reference block formats. Layouts are the GGUF/ggml ones:
//   Q8_0: { f16 d; int8 q[32]; }              x = d * q
// (the other formats are added with their kernels)
#include "kernels/quant_ref.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "base/fp16.h"

namespace metro::kernels {

namespace {

void dequant_q8_0(const uint8_t* src, float* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const uint8_t* blk = src + b * 34;
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float d = fp16_to_fp32(dh);
    const auto* q = reinterpret_cast<const int8_t*>(blk + 2);
    for (int i = 0; i < 32; ++i) dst[b * 32 + i] = d * static_cast<float>(q[i]);
  }
}

void quant_q8_0(const float* src, uint8_t* dst, int64_t n) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::fmax(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t* blk = dst + b * 34;
    const uint16_t dh = fp32_to_fp16(d);
    std::memcpy(blk, &dh, 2);
    auto* q = reinterpret_cast<int8_t*>(blk + 2);
    for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(std::lround(x[i] * id));
  }
}

}  // namespace

void dequantize_row_ref(DType t, const void* src, float* dst, int64_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  switch (t) {
    case DType::kF32: std::memcpy(dst, s, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case DType::kQ8_0: dequant_q8_0(s, dst, n); return;
    default: METRO_CHECK_MSG(false, "dequantize_row_ref: format not implemented yet");
  }
}

void quantize_row_ref(DType t, const float* src, void* dst, int64_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  switch (t) {
    case DType::kF32: std::memcpy(d, src, static_cast<size_t>(n) * 4); return;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(d + 2 * i, &h, 2);
      }
      return;
    case DType::kQ8_0: quant_q8_0(src, d, n); return;
    default: METRO_CHECK_MSG(false, "quantize_row_ref: format not implemented yet");
  }
}

}  // namespace metro::kernels
