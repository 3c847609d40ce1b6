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
// The sum of v's four lanes: (0 + 2) + (1 + 3).
MINFER_TARGET_AVX2 inline float hsum_sse(__m128 v) {
    v = _mm_add_ps(v, _mm_movehl_ps(v, v));
    v = _mm_add_ss(v, _mm_movehdup_ps(v));
    return _mm_cvtss_f32(v);
}

MINFER_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
    return hsum_sse(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
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

// A Q4_K super-block's mins term added to acc: sum_j m_j * (bsum[2j] +
// bsum[2j + 1]) over its 8 sub-blocks (mins in sm[8..15], q4k_scales_mins)
// in four int32 lanes, one madd of the mins with the bsum pairs, times
// dmin. Every level's Q4_K dot subtracts hsum_sse of it at the end.
MINFER_TARGET_AVX2 inline __m128 q4k_add_mins(const uint8_t* sm, const int16_t* bsums, float dmin,
                                              __m128 acc) {
    const __m128i mins16 =
        _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sm + 8)));
    const __m256i pairs = _mm256_madd_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bsums)), _mm256_set1_epi16(1));
    const __m128i bpair =
        _mm_packs_epi32(_mm256_castsi256_si128(pairs), _mm256_extracti128_si256(pairs, 1));
    return _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins16, bpair)), acc);
}
#endif

}  // namespace minfer::cpu::x86
