// An 8 x 8 transpose of 32-bit elements on 256-bit vectors, for the AVX2
// kernels (internal to src/backend/cpu; include only where <immintrin.h> is
// already included on x86-64 GCC/Clang): the GEMM turns 8 weight rows into
// quad-interleaved panels with it, the decode attention 8 key rows into 8
// vectors of one dimension each.
#pragma once

#include "backend/cpu/x86/intrinsics.h"

namespace minfer::cpu::simd {

// r[i] lane j <-> r[j] lane i.
MINFER_TARGET_AVX2 inline void transpose8x8(__m256i r[8]) {
    __m256i t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm256_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm256_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm256_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
        r[i] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2x128_si256(u[i], u[i + 4], 0x31);
    }
}

}  // namespace minfer::cpu::simd
