// Internal to src/tensor/quants*.cpp: the per-type row functions behind the
// dispatch in quants.cpp. Each takes n elements (a multiple of the block size).
#pragma once

#include <cstdint>
#include <cstring>

#include "tensor/blocks.h"

namespace minfer::tensor::detail {

// ggml's nearest_int: round to nearest, ties to even, by adding 1.5 * 2^23 and
// reading the mantissa. Valid for |f| <= 4194303; bit tricks instead of
// lrintf so that the result never depends on the current rounding mode.
inline int nearest_int(float f) {
    float v = f + 12582912.f;
    int32_t i;
    std::memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

void quantize_q4_0(const float* x, block_q4_0* y, int64_t n);
void quantize_q4_1(const float* x, block_q4_1* y, int64_t n);
void quantize_q5_0(const float* x, block_q5_0* y, int64_t n);
void quantize_q5_1(const float* x, block_q5_1* y, int64_t n);
void quantize_q8_0(const float* x, block_q8_0* y, int64_t n);
void quantize_q8_1(const float* x, block_q8_1* y, int64_t n);
void quantize_q2_K(const float* x, block_q2_K* y, int64_t n);
void quantize_q3_K(const float* x, block_q3_K* y, int64_t n);
void quantize_q4_K(const float* x, block_q4_K* y, int64_t n);
void quantize_q5_K(const float* x, block_q5_K* y, int64_t n);
void quantize_q6_K(const float* x, block_q6_K* y, int64_t n);
void quantize_q8_K(const float* x, block_q8_K* y, int64_t n);
void quantize_iq4_nl(const float* x, block_iq4_nl* y, int64_t n);
void quantize_iq4_xs(const float* x, block_iq4_xs* y, int64_t n);

}  // namespace minfer::tensor::detail
