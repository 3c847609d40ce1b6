// The hand-written x86 dot products of quant_dot.h, one file per ISA level
// (isa.h): x86/dot_avx2.cpp (AVX2 + FMA + F16C) and x86/dot_avx512.cpp
// (AVX-512 VNNI on 256- and 512-bit vectors, and the dots of interleaved
// 16-row groups). quant_dot.cpp's portable loops serve the other types and
// levels; kernel_table.cpp picks per level.
#pragma once

#include <cstdint>
#include <cstring>

#include "backend/cpu/quant_dot.h"
#include "backend/cpu/x86/intrinsics.h"
#include "tensor/dtype.h"

namespace minfer::cpu::x86 {

// The Avx2 level's dot product for a weight type, or nullptr (a portable loop).
VecDotFn vec_dot_avx2(tensor::DType weight);
// The Avx512 level's, or nullptr.
VecDotFn vec_dot_avx512(tensor::DType weight);
// The Avx512 level's interleaved group dots (quant_dot.h), or nullptr.
GroupDotFn group_dot_avx512(tensor::DType weight);
GroupDotManyFn group_dot_many_avx512(tensor::DType weight);

#if defined(__x86_64__) && defined(__GNUC__)
MINFER_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// The 8 six-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K / Q5_K
// block, unpacked with word operations (the same values as get_scale_min_k4).
inline __attribute__((always_inline)) void q4k_scales_mins(const uint8_t* packed, uint8_t* out16) {
    uint32_t u[4];
    std::memcpy(u, packed, 12);
    const uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, top2 = 0x03030303;
    const uint32_t mins_lo = u[1] & low6;                       // m0..m3
    u[3] = ((u[2] >> 4) & low4) | (((u[1] >> 6) & top2) << 4);  // m4..m7
    u[1] = (u[2] & low4) | (((u[0] >> 6) & top2) << 4);         // sc4..sc7
    u[2] = mins_lo;
    u[0] &= low6;  // sc0..sc3
    std::memcpy(out16, u, 16);
}
#endif

}  // namespace minfer::cpu::x86
