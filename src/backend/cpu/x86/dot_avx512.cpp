#include "backend/cpu/gemm_layout.h"
#include "backend/cpu/interleaved_simd.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/x86/dot_x86.h"
#include "tensor/blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)

namespace minfer::cpu::x86 {

using namespace tensor;

namespace {

// Q5_0 x Q8_0 with AVX-512 VNNI on 256-bit vectors: the 5th bits are a mask
// register (bit i = element i), so (q | 16 where set) - 16 is two masked
// byte ops; |v| * sign(y, v) by one vpdpbusd into exact int32 lanes.
MINFER_TARGET_AVX512_VNNI inline __m256 q5_0_block_vnni(const block_q5_0& x, const block_q8_0& y) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs));
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0xF));
    uint32_t qh;
    std::memcpy(&qh, x.qh, 4);
    q = _mm256_mask_add_epi8(q, static_cast<__mmask32>(qh), q, _mm256_set1_epi8(0x10));
    const __m256i v = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i p =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(v), _mm256_sign_epi8(a, v));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * _cvtsh_ss(y.d)), _mm256_cvtepi32_ps(p));
}

// Two Q5_0 blocks per 512-bit step. The bytes are arranged as
// [x0 lo, x1 lo, x0 hi, x1 hi] (16 each: low nibbles = elements 0-15, high
// = 16-31), the activations permuted to match, the 5th bits gathered into
// one 64-bit mask in that order. Unsigned q5 = q | 16 times signed y by
// vpdpbusd, minus 16 * (sum of y) by a second vpdpbusd: exact int32 lanes;
// lanes 0-3 and 8-11 belong to block 0, 4-7 and 12-15 to block 1.
MINFER_TARGET_AVX512_VNNI inline __m512 q5_0_pair_vnni(const block_q5_0& x0, const block_q5_0& x1,
                                                       const block_q8_0& y0, const block_q8_0& y1) {
    const __m256i t = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x0.qs))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(x1.qs)), 1);
    __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(t), _mm256_srli_epi16(t, 4), 1);
    q = _mm512_and_si512(q, _mm512_set1_epi8(0xF));
    uint32_t h0, h1;
    std::memcpy(&h0, x0.qh, 4);
    std::memcpy(&h1, x1.qh, 4);
    const uint64_t mask = (uint64_t{h0} & 0xFFFF) | ((uint64_t{h1} & 0xFFFF) << 16) |
                          (uint64_t{h0 >> 16} << 32) | (uint64_t{h1 >> 16} << 48);
    q = _mm512_mask_add_epi8(q, static_cast<__mmask64>(mask), q, _mm512_set1_epi8(0x10));
    const __m512i a = _mm512_permutex2var_epi64(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y0.qs))),
        _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0),
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y1.qs))));
    const __m512i p =
        _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), q, a),
                         _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(16), a));
    const float s0 = _cvtsh_ss(x0.d) * _cvtsh_ss(y0.d), s1 = _cvtsh_ss(x1.d) * _cvtsh_ss(y1.d);
    const __m512 sc = _mm512_mask_blend_ps(0xF0F0, _mm512_set1_ps(s0), _mm512_set1_ps(s1));
    return _mm512_mul_ps(sc, _mm512_cvtepi32_ps(p));
}

MINFER_TARGET_AVX512_VNNI float dot_q5_0_vnni512(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q5_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    const int64_t nb = n / QK5_0;
    int64_t ib = 0;
    for (; ib + 4 <= nb; ib += 4) {
        acc0 = _mm512_add_ps(acc0, q5_0_pair_vnni(x[ib], x[ib + 1], y[ib], y[ib + 1]));
        acc1 = _mm512_add_ps(acc1, q5_0_pair_vnni(x[ib + 2], x[ib + 3], y[ib + 2], y[ib + 3]));
    }
    for (; ib + 2 <= nb; ib += 2)
        acc0 = _mm512_add_ps(acc0, q5_0_pair_vnni(x[ib], x[ib + 1], y[ib], y[ib + 1]));
    float sum = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
    if (ib < nb) sum += hsum_avx2(q5_0_block_vnni(x[ib], y[ib]));
    return sum;
}

// Q4_K x Q8_K with AVX-512 (BW + VNNI): 64 nibbles per step as [low 32 |
// high 32] = two sub-blocks in q8 order, maddubs to int16 pairs, then
// vpdpwssd by the sub-blocks' scales (permuted into the int16 lanes) into
// int32 lanes; the mins through a madd with the bsums.
MINFER_TARGET_AVX512_VNNI float dot_q4_K_vnni512(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q4_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc = _mm512_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        alignas(16) uint8_t sm[16];
        q4k_scales_mins(x[i].scales, sm);
        const __m256i sm16 =
            _mm256_cvtepu8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(sm)));
        acc_m = q4k_add_mins(sm, y[i].bsums, _cvtsh_ss(x[i].dmin) * y[i].d, acc_m);
        const __m512i sc512 = _mm512_castsi256_si512(sm16);
        __m512i sumi = _mm512_setzero_si512();
        for (int j = 0; j < 4; ++j) {
            const __m256i b =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qs + 32 * j));
            const __m512i q = _mm512_and_si512(
                _mm512_inserti64x4(_mm512_castsi256_si512(b), _mm256_srli_epi16(b, 4), 1), m4);
            const __m512i a = _mm512_loadu_si512(y[i].qs + 64 * j);
            const __m512i p16 = _mm512_maddubs_epi16(q, a);
            // int16 lanes 0-15: scale 2j, 16-31: scale 2j+1
            const __m512i sc = _mm512_permutexvar_epi16(
                _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(2 * j)),
                                   _mm256_set1_epi16(static_cast<int16_t>(2 * j + 1)), 1),
                sc512);
            sumi = _mm512_dpwssd_epi32(sumi, p16, sc);
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc) - hsum_sse(acc_m);
}

// Q6_K x Q8_K with AVX-512 (BW + VNNI): per half-block 128 six-bit values
// as two 64-byte vectors in q8 order ([q0 | q1], [q2 | q3] of the AVX2
// path), maddubs(q, y) - maddubs(32, y) = (q - 32) * y in int16 pairs, then
// vpdpwssd by the 16-element groups' int8 scales (8 int16 lanes each).
MINFER_TARGET_AVX512_VNNI float dot_q6_K_vnni512(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q6_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    const __m512i m2 = _mm512_set1_epi8(3);
    const __m512i m32 = _mm512_set1_epi8(32);
    // int16 lane l (elements 2l, 2l+1) of a 64-element step is in group l / 8
    const __m512i grp = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1,
                                         1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const __m256i sc16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales)));
        const __m512i sc512 = _mm512_castsi256_si512(sc16);
        __m512i sumi = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
            const __m512i l = _mm512_loadu_si512(x[i].ql + 64 * h);
            const __m256i hb =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[i].qh + 32 * h));
            const __m512i hh =
                _mm512_inserti64x4(_mm512_castsi256_si512(hb), _mm256_srli_epi16(hb, 2), 1);
            const __m512i q01 = _mm512_or_si512(_mm512_and_si512(l, m4),
                                                _mm512_slli_epi16(_mm512_and_si512(hh, m2), 4));
            const __m512i q23 = _mm512_or_si512(
                _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hh, 4), m2), 4));
            const __m512i y01 = _mm512_loadu_si512(y[i].qs + 128 * h);
            const __m512i y23 = _mm512_loadu_si512(y[i].qs + 128 * h + 64);
            const __m512i p01 =
                _mm512_sub_epi16(_mm512_maddubs_epi16(q01, y01), _mm512_maddubs_epi16(m32, y01));
            const __m512i p23 =
                _mm512_sub_epi16(_mm512_maddubs_epi16(q23, y23), _mm512_maddubs_epi16(m32, y23));
            // groups 8h + 0..3 for q01, 8h + 4..7 for q23
            const __m512i g01 =
                _mm512_add_epi16(grp, _mm512_set1_epi16(static_cast<int16_t>(8 * h)));
            const __m512i g23 =
                _mm512_add_epi16(grp, _mm512_set1_epi16(static_cast<int16_t>(8 * h + 4)));
            sumi = _mm512_dpwssd_epi32(sumi, p01, _mm512_permutexvar_epi16(g01, sc512));
            sumi = _mm512_dpwssd_epi32(sumi, p23, _mm512_permutexvar_epi16(g23, sc512));
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        acc = _mm512_fmadd_ps(_mm512_set1_ps(d), _mm512_cvtepi32_ps(sumi), acc);
    }
    return _mm512_reduce_add_ps(acc);
}

// Sum of the 32 int8 values of an activation block (sad of a ^ 0x80 sums
// a + 128 per 8 bytes).
MINFER_TARGET_AVX512_VNNI inline int32_t sum_q8_32(const int8_t* qs) {
    const __m256i ya = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs));
    const __m256i sad =
        _mm256_sad_epu8(_mm256_xor_si256(ya, _mm256_set1_epi8(char(0x80))), _mm256_setzero_si256());
    const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(sad), _mm256_extracti128_si256(sad, 1));
    return static_cast<int32_t>(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 128 * 32;
}

// Q5_0 x Q8_0 for an interleaved group of 16 rows (AVX-512 VNNI + BITALG;
// tensor/interleave.h: per block the 16 f16 scales, the 16 qh dwords, then
// 4 vectors of one qs dword per row: dword i holds elements 4i..4i+3 in its
// low nibbles and 16+4i.. in its high). vpshufbitqmb picks each byte's 5th
// bit out of its lane's qh as a mask; vpdpbusd multiplies the unsigned q5
// by the activation quad broadcast to every lane, starting from -16 *
// sum(a): exact int32 sums of (q5 - 16) * a per row, then cvt(sum) * d_w,
// times d_a added by one FMA: per row the float steps of the AVX-512 GEMM
// (gemm_avx512.cpp's micro), so a token's outputs are bitwise the same alone and
// in a batch.
MINFER_TARGET_AVX512_BITALG void group_dot_q5_0(int64_t n, const void* vw, const void* va,
                                                float* out) {
    const auto* blk = static_cast<const uint8_t*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / QK5_0; ++b, blk += 16 * sizeof(block_q5_0)) {
        const __m512i qh = _mm512_loadu_si512(blk + 32);
        __m512i isum = _mm512_set1_epi32(-16 * sum_q8_32(y[b].qs));
        int32_t aq[8];
        std::memcpy(aq, y[b].qs, 32);
        for (int i = 0; i < 4; ++i) {
            __m512i lo, hi;
            interleaved::q5_0_quads(_mm512_loadu_si512(blk + 96 + 64 * i), qh, i, lo, hi);
            isum = _mm512_dpbusd_epi32(isum, lo, _mm512_set1_epi32(aq[i]));
            isum = _mm512_dpbusd_epi32(isum, hi, _mm512_set1_epi32(aq[4 + i]));
        }
        const __m512 dw = interleaved::halves16(blk);
        acc = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum), dw),
                              _mm512_set1_ps(_cvtsh_ss(y[b].d)), acc);
    }
    _mm512_storeu_ps(out, acc);
}

// Q4_K x Q8_K for an interleaved group of 16 rows. Per super-block: the 16
// rows' d and dmin (f16), their 12 scale bytes as 3 dword vectors (unpacked
// as q4k_scales_mins does, lane-wise), then 32 vectors of one qs dword per
// row: dword 8c + k holds elements 64c + 4k.. (sub-block 2c) in its low
// nibbles and 64c + 32 + 4k.. (sub-block 2c + 1) in its high. The integer
// sum of each sub-block is exact; the float steps are those of the AVX-512
// GEMM (gemm_avx512.cpp's micro_k): sub-block by sub-block cvt(sum) times
// d * scale into a block sum, then the mins times the activations' sums,
// summed in integers, times -dmin, and the block sum takes the activation
// scale once. So a token's outputs are bitwise the same alone (here) and
// in a batch (the GEMM).
// NT tokens at once (the activation rows a + t * a_stride, outputs out + t *
// out_stride): each weight vector is loaded and unpacked once for all of
// them, and the NT chains of vpdpbusd are independent (one token's chain
// waits on the instruction's latency); each token's steps are those of
// NT = 1 in the same order, so its outputs are bitwise the same.
template <int NT>
MINFER_TARGET_AVX512_VNNI void group_dot_q4_K_nt(int64_t n, const void* vw, const uint8_t* va,
                                                 size_t a_stride, float* out, int64_t out_stride) {
    const auto* blk = static_cast<const uint8_t*>(vw);
    const block_q8_K* y[NT];
    for (int t = 0; t < NT; ++t) y[t] = reinterpret_cast<const block_q8_K*>(va + t * a_stride);
    const __m512i m4 = _mm512_set1_epi8(0xF);
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i, blk += 16 * sizeof(block_q4_K)) {
        prefetch_ahead(blk, 16 * sizeof(block_q4_K));
        __m512i sc[2], mn[2];  // bytes of each lane: scales 0-3, 4-7; mins 0-3, 4-7
        interleaved::q4_K_scales_mins(blk, sc, mn);
        const __m512 d = interleaved::halves16(blk), dmin = interleaved::halves16(blk + 32);
        __m512 sum[NT];
        for (int t = 0; t < NT; ++t) sum[t] = _mm512_setzero_ps();
        const uint8_t* qs = blk + 256;
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {  // 64 elements: sub-blocks 2c, 2c + 1
            __m512i s2[NT][2];
            for (int t = 0; t < NT; ++t) s2[t][0] = s2[t][1] = _mm512_setzero_si512();
            for (int k = 0; k < 8; ++k) {
                const __m512i q = _mm512_loadu_si512(qs + 64 * (8 * c + k));
                const __m512i lo = _mm512_and_si512(q, m4);
                const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), m4);
                for (int t = 0; t < NT; ++t) {
                    const int8_t* a = y[t][i].qs + 64 * c;
                    int32_t a_lo, a_hi;
                    std::memcpy(&a_lo, a + 4 * k, 4);
                    std::memcpy(&a_hi, a + 32 + 4 * k, 4);
                    s2[t][0] = _mm512_dpbusd_epi32(s2[t][0], lo, _mm512_set1_epi32(a_lo));
                    s2[t][1] = _mm512_dpbusd_epi32(s2[t][1], hi, _mm512_set1_epi32(a_hi));
                }
            }
            for (int h = 0; h < 2; ++h) {
                const int j = 2 * c + h;  // the sub-block
                const __m512 s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(interleaved::byte_of(sc, j)));
                for (int t = 0; t < NT; ++t)
                    sum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[t][h]), s, sum[t]);
            }
        }
        // The mins: those of sub-blocks 2k, 2k + 1 as an int16 pair per lane
        // against the activations' sums per 32 of those sub-blocks as
        // another (gemm_layout::sum32_pair).
        __m512i mins[NT];
        for (int t = 0; t < NT; ++t) mins[t] = _mm512_setzero_si512();
        for (int k = 0; k < gemm_layout::kMinPairs; ++k) {
            const __m512i m = interleaved::byte_pair_of(mn, k);
            for (int t = 0; t < NT; ++t)
                mins[t] = _mm512_dpwssd_epi32(
                    mins[t], m, _mm512_set1_epi32(gemm_layout::sum32_pair(y[t][i].bsums, k)));
        }
        const __m512 neg_dmin = _mm512_xor_ps(dmin, _mm512_set1_ps(-0.0f));
        for (int t = 0; t < NT; ++t) {
            sum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[t]), neg_dmin, sum[t]);
            acc[t] = _mm512_fmadd_ps(sum[t], _mm512_set1_ps(y[t][i].d), acc[t]);
        }
    }
    for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

MINFER_TARGET_AVX512_VNNI void group_dot_q4_K(int64_t n, const void* vw, const void* va,
                                              float* out) {
    group_dot_q4_K_nt<1>(n, vw, static_cast<const uint8_t*>(va), 0, out, 0);
}

// Q8_0 x Q8_0 for an interleaved group of 16 rows: per block the 16 f16
// scales, then 8 vectors of one qs dword per row, stored ^ 0x80 (q + 128,
// unsigned for vpdpbusd); the sums start at -128 * sum(a), so they end
// exact: sum of q * a per row. NT tokens at once, as group_dot_q4_K_nt.
template <int NT>
MINFER_TARGET_AVX512_VNNI void group_dot_q8_0_nt(int64_t n, const void* vw, const uint8_t* va,
                                                 size_t a_stride, float* out, int64_t out_stride) {
    const auto* blk = static_cast<const uint8_t*>(vw);
    const block_q8_0* y[NT];
    for (int t = 0; t < NT; ++t) y[t] = reinterpret_cast<const block_q8_0*>(va + t * a_stride);
    __m512 acc[NT];
    for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < n / QK8_0; ++b, blk += 16 * sizeof(block_q8_0)) {
        prefetch_ahead(blk, 16 * sizeof(block_q8_0));
        __m512i isum[NT];
        for (int t = 0; t < NT; ++t) isum[t] = _mm512_set1_epi32(-128 * sum_q8_32(y[t][b].qs));
        for (int q = 0; q < 8; ++q) {
            const __m512i wq = _mm512_loadu_si512(blk + 32 + 64 * q);
            for (int t = 0; t < NT; ++t) {
                int32_t aq;
                std::memcpy(&aq, y[t][b].qs + 4 * q, 4);
                isum[t] = _mm512_dpbusd_epi32(isum[t], wq, _mm512_set1_epi32(aq));
            }
        }
        const __m512 dw = interleaved::halves16(blk);
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum[t]), dw),
                                     _mm512_set1_ps(_cvtsh_ss(y[t][b].d)), acc[t]);
    }
    for (int t = 0; t < NT; ++t) _mm512_storeu_ps(out + t * out_stride, acc[t]);
}

MINFER_TARGET_AVX512_VNNI void group_dot_q8_0(int64_t n, const void* vw, const void* va,
                                              float* out) {
    group_dot_q8_0_nt<1>(n, vw, static_cast<const uint8_t*>(va), 0, out, 0);
}

// n_tok tokens, 4 at a time (4 chains hide vpdpbusd's latency; more would
// spill the zmm registers in the Q4_K kernel), then the rest.
template <template <int> class Kernel>
void group_dot_many(int64_t n, const void* group, const void* va, size_t a_stride, int64_t n_tok,
                    float* out, int64_t out_stride) {
    const auto* a = static_cast<const uint8_t*>(va);
    int64_t t = 0;
    for (; t + 4 <= n_tok; t += 4)
        Kernel<4>::run(n, group, a + t * a_stride, a_stride, out + t * out_stride, out_stride);
    const uint8_t* at = a + t * a_stride;
    float* ot = out + t * out_stride;
    if (n_tok - t == 3) Kernel<3>::run(n, group, at, a_stride, ot, out_stride);
    if (n_tok - t == 2) Kernel<2>::run(n, group, at, a_stride, ot, out_stride);
    if (n_tok - t == 1) Kernel<1>::run(n, group, at, a_stride, ot, out_stride);
}
template <int NT>
struct Q8_0Group {
    static void run(int64_t n, const void* g, const uint8_t* a, size_t as, float* o, int64_t os) {
        group_dot_q8_0_nt<NT>(n, g, a, as, o, os);
    }
};
template <int NT>
struct Q4_KGroup {
    static void run(int64_t n, const void* g, const uint8_t* a, size_t as, float* o, int64_t os) {
        group_dot_q4_K_nt<NT>(n, g, a, as, o, os);
    }
};

// Q6_K x Q8_K for an interleaved group of 16 rows. Per super-block, for
// half h and quad k (ggml's layout), three vectors of one dword per row:
// ql dwords 16h + k and 16h + 8 + k and qh dword 8h + k, which give the
// quads of elements 128h + 4k, +32, +64, +96 (low nibbles, low nibbles,
// high, high; qh bits 0-1, 2-3, 4-5, 6-7); then 4 vectors of the int8
// scales and the 16 f16 d. Each 16-element group sums unsigned q * a from
// -32 * bsum (so (q - 32) * a exactly); then, group by group in order, the
// AVX-512 GEMM's float steps (micro_k): cvt(sum) times d * scale into a
// block sum, which takes the activation scale once (bitwise the GEMM).
MINFER_TARGET_AVX512_VNNI void group_dot_q6_K(int64_t n, const void* vw, const void* va,
                                              float* out) {
    const auto* blk = static_cast<const uint8_t*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i, blk += 16 * sizeof(block_q6_K)) {
        prefetch_ahead(blk, 16 * sizeof(block_q6_K));
        const uint8_t* sc = blk + 3072;
        __m512i gs[16];  // the integer sum of each group
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 2
            for (int kk = 0; kk < 2; ++kk) {
                // groups 8h + kk + {0, 2, 4, 6}
                __m512i g[4];
                for (int u = 0; u < 4; ++u)
                    g[u] = _mm512_set1_epi32(-32 * y[i].bsums[8 * h + kk + 2 * u]);
                for (int k = 4 * kk; k < 4 * kk + 4; ++k) {
                    __m512i v[4];
                    interleaved::q6_K_quads(blk + 192 * (8 * h + k), v);
                    for (int u = 0; u < 4; ++u) {
                        int32_t a4;
                        std::memcpy(&a4, y[i].qs + 128 * h + 32 * u + 4 * k, 4);
                        g[u] = _mm512_dpbusd_epi32(g[u], v[u], _mm512_set1_epi32(a4));
                    }
                }
                for (int u = 0; u < 4; ++u) gs[8 * h + kk + 2 * u] = g[u];
            }
        const __m512 d = interleaved::halves16(blk + 3328);
        __m512 sum = _mm512_setzero_ps();
        for (int g = 0; g < 16; ++g)
            sum = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(gs[g]),
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(interleaved::q6_K_scale(sc, g))), sum);
        acc = _mm512_fmadd_ps(sum, _mm512_set1_ps(y[i].d), acc);
    }
    _mm512_storeu_ps(out, acc);
}

// Q8_0 x Q8_0 the same way (vpdpbusd for maddubs + madd).
MINFER_TARGET_AVX512_VNNI inline __m256 q8_0_block_vnni(const block_q8_0& x, const block_q8_0& y) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i p =
        _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_abs_epi8(qx), _mm256_sign_epi8(qy, qx));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * _cvtsh_ss(y.d)), _mm256_cvtepi32_ps(p));
}

MINFER_TARGET_AVX512_VNNI float dot_q8_0_vnni(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q8_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK8_0;
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        acc0 = _mm256_add_ps(acc0, q8_0_block_vnni(x[ib], y[ib]));
        acc1 = _mm256_add_ps(acc1, q8_0_block_vnni(x[ib + 1], y[ib + 1]));
    }
    if (ib < nb) acc0 = _mm256_add_ps(acc0, q8_0_block_vnni(x[ib], y[ib]));
    return hsum_avx2(_mm256_add_ps(acc0, acc1));
}

// The AVX-512 VNNI kernels (256- and 512-bit) belong to the Avx512 level,
// the plain AVX2 ones to Avx2: both follow the MINFER_CPU cap (isa.h).

}  // namespace

VecDotFn vec_dot_avx512(DType w) {
    switch (w) {
        case DType::Q5_0:
            return dot_q5_0_vnni512;
        case DType::Q8_0:
            return dot_q8_0_vnni;
        case DType::Q4_K:
            return dot_q4_K_vnni512;
        case DType::Q6_K:
            return dot_q6_K_vnni512;
        default:
            return nullptr;
    }
}

GroupDotFn group_dot_avx512(DType w) {
    if (w == DType::Q5_0 && cpu_has_avx512_bitalg()) return group_dot_q5_0;
    if (w == DType::Q4_K) return group_dot_q4_K;
    if (w == DType::Q6_K) return group_dot_q6_K;
    if (w == DType::Q8_0) return group_dot_q8_0;
    return nullptr;
}

GroupDotManyFn group_dot_many_avx512(DType w) {
    if (w == DType::Q8_0) return group_dot_many<Q8_0Group>;
    if (w == DType::Q4_K) return group_dot_many<Q4_KGroup>;
    return nullptr;
}

}  // namespace minfer::cpu::x86

#endif
