// Unpacking of interleaved 16-row groups (tensor/interleave.h) with AVX-512,
// shared by the decode kernels (quant_dot.cpp) and the prompt GEMM's panel
// fill (x86/gemm_avx512.cpp): each helper turns vectors of one dword per row into
// vectors of one quad (4 values) per row, one row per 32-bit lane.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#include <cstdint>

#include "backend/cpu/x86/intrinsics.h"

namespace minfer::cpu::interleaved {

// The 16 rows' f16 scales stored side by side at p (d, dmin), as floats.
MINFER_TARGET_AVX512 inline __m512 halves16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Q5_0 block quad i (0..3) of 16 rows: q = the qs vector (dword i of each
// row), qh = the rows' qh dwords. lo = elements 4i..4i+3 (low nibbles),
// hi = elements 16+4i.. (high nibbles), both as unsigned q5 in 0..31: the
// 5th bit of byte k comes from bit 4i + k (16 + 4i + k) of its lane's qh,
// picked by vpshufbitqmb (a qword holds two lanes, hence the +32).
MINFER_TARGET_AVX512_BITALG inline void q5_0_quads(__m512i q, __m512i qh, int i, __m512i& lo,
                                                   __m512i& hi) {
    uint64_t sel_lo = 0, sel_hi = 0;
    for (int k = 0; k < 4; ++k) {
        sel_lo |= uint64_t(4 * i + k) << (8 * k) | uint64_t(32 + 4 * i + k) << (8 * k + 32);
        sel_hi |= uint64_t(16 + 4 * i + k) << (8 * k) | uint64_t(48 + 4 * i + k) << (8 * k + 32);
    }
    const __m512i m4 = _mm512_set1_epi8(0xF), b16 = _mm512_set1_epi8(0x10);
    lo = _mm512_and_si512(q, m4);
    hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
    lo = _mm512_mask_add_epi8(
        lo, _mm512_bitshuffle_epi64_mask(qh, _mm512_set1_epi64(static_cast<long long>(sel_lo))), lo,
        b16);
    hi = _mm512_mask_add_epi8(
        hi, _mm512_bitshuffle_epi64_mask(qh, _mm512_set1_epi64(static_cast<long long>(sel_hi))), hi,
        b16);
}

// The 6-bit scales and mins of a Q4_K super-block of 16 rows from its 3
// scale dwords (blk + 64, + 128, + 192), as q4k_scales_mins does per row:
// sc[0] bytes = scales 0-3, sc[1] = scales 4-7, mn[] the same for the mins.
MINFER_TARGET_AVX512 inline void q4_K_scales_mins(const uint8_t* blk, __m512i sc[2],
                                                  __m512i mn[2]) {
    const __m512i m4 = _mm512_set1_epi8(0xF), low6 = _mm512_set1_epi8(0x3F),
                  top2 = _mm512_set1_epi8(0x03);
    const __m512i u0 = _mm512_loadu_si512(blk + 64), u1 = _mm512_loadu_si512(blk + 128),
                  u2 = _mm512_loadu_si512(blk + 192);
    sc[0] = _mm512_and_si512(u0, low6);
    mn[0] = _mm512_and_si512(u1, low6);
    sc[1] = _mm512_or_si512(_mm512_and_si512(u2, m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u0, 6), top2), 4));
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(u2, 4), m4),
                            _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(u1, 6), top2), 4));
}

// Byte j % 4 of v[j / 4] in each lane, as int32 (a Q4_K scale or min).
MINFER_TARGET_AVX512 inline __m512i byte_of(const __m512i v[2], int j) {
    return _mm512_and_si512(_mm512_srli_epi32(v[j / 4], 8 * (j % 4)), _mm512_set1_epi32(0xFF));
}

// Bytes 2k and 2k + 1 (k = 0..3) of v[k / 2]'s lanes as an int16 pair per
// lane, byte 2k in the low half: the Q4_K mins of sub-blocks 2k and 2k + 1
// against the activations' sums per 32 of those sub-blocks (vpdpwssd).
MINFER_TARGET_AVX512 inline __m512i byte_pair_of(const __m512i v[2], int k) {
    const int b = 2 * (k % 2);
    const auto at = [b](int l) {
        return static_cast<int>(0x80008000u | static_cast<unsigned>(4 * l + b) |
                                static_cast<unsigned>(4 * l + b + 1) << 16);
    };
    return _mm512_shuffle_epi8(v[k / 2],
                               _mm512_broadcast_i32x4(_mm_setr_epi32(at(0), at(1), at(2), at(3))));
}

// Q6_K half h, quad k of 16 rows from the three vectors at u3 (ql dwords
// 16h + k and 16h + 8 + k, qh dword 8h + k): q[u] = the quad of elements
// 128h + 32u + 4k, unsigned 6-bit (0..63). Each byte is a select (vpternlogd
// 0xCA: bits 0-3 from the low nibbles' vector, bits 4-7 from the high
// bits' one), so the high bits need only be shifted into bits 4-5 with
// bits 6-7 clear: qh masked to bits 0-1 and 4-5 (for u = 0, 2) or 2-3 and
// 6-7 (u = 1, 3) once, then one shift each; what a 32-bit shift carries
// across bytes lands in bits the select or the mask drops.
MINFER_TARGET_AVX512 inline __m512i nibble_select(__m512i lo, __m512i hi) {
    return _mm512_ternarylogic_epi32(_mm512_set1_epi8(0xF), lo, hi, 0xCA);
}
MINFER_TARGET_AVX512 inline void q6_K_quads(const uint8_t* u3, __m512i q[4]) {
    const __m512i la = _mm512_loadu_si512(u3), lb = _mm512_loadu_si512(u3 + 64),
                  hb = _mm512_loadu_si512(u3 + 128);
    const __m512i ha = _mm512_and_si512(hb, _mm512_set1_epi8(0x33)),
                  hc = _mm512_and_si512(hb, _mm512_set1_epi8(static_cast<char>(0xCC)));
    q[0] = nibble_select(la, _mm512_slli_epi32(ha, 4));
    q[1] = nibble_select(lb, _mm512_slli_epi32(hc, 2));
    q[2] = nibble_select(_mm512_srli_epi32(la, 4), ha);
    q[3] = nibble_select(_mm512_srli_epi32(lb, 4), _mm512_srli_epi32(hc, 2));
}

// The int8 scale of Q6_K group g (0..15) of 16 rows, sign-extended to int32
// (the 4 scale vectors at sc hold scales 4i..4i+3 of each row).
MINFER_TARGET_AVX512 inline __m512i q6_K_scale(const uint8_t* sc, int g) {
    return _mm512_srai_epi32(
        _mm512_slli_epi32(_mm512_loadu_si512(sc + 64 * (g / 4)), 24 - 8 * (g % 4)), 24);
}

}  // namespace minfer::cpu::interleaved

#endif
