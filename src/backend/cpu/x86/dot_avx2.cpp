#include "backend/cpu/interleaved_simd.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/x86/dot_x86.h"
#include "tensor/blocks.h"

#if defined(__x86_64__) && defined(__GNUC__)

namespace minfer::cpu::x86 {

using namespace tensor;

namespace {

// Q8_0 x Q8_0 with AVX2 (ggml's x86 path): |x| (unsigned) times y with x's
// sign, pairwise to int16 (<= 2*128*127, no overflow), then to int32 lanes;
// per block d_x*d_y times the 8 exact partial sums, accumulated by FMA.
MINFER_TARGET_AVX2 inline __m256 q8_0_block_avx2(const block_q8_0& x, const block_q8_0& y) {
    const __m256i qx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
    const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
    const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(x.d) * _cvtsh_ss(y.d)), p);
}

MINFER_TARGET_AVX2 float dot_q8_0_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q8_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    const int64_t nb = n / QK8_0;
    int64_t ib = 0;
    for (; ib + 2 <= nb; ib += 2) {
        acc0 = _mm256_add_ps(acc0, q8_0_block_avx2(x[ib], y[ib]));
        acc1 = _mm256_add_ps(acc1, q8_0_block_avx2(x[ib + 1], y[ib + 1]));
    }
    if (ib < nb) acc0 = _mm256_add_ps(acc0, q8_0_block_avx2(x[ib], y[ib]));
    return hsum_avx2(_mm256_add_ps(acc0, acc1));
}

// Two int16 scales, one per 128-bit half (a 32-element group that spans two
// 16-element sub-blocks: the low half of maddubs' lanes covers elements 0-15).
MINFER_TARGET_AVX2 inline __m256i scales2_avx2(int a, int b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(a))),
                                   _mm_set1_epi16(static_cast<int16_t>(b)), 1);
}

// Q4_K x Q8_K: nibbles (unsigned) times q8 by maddubs, times the group's
// 6-bit scale by madd -> exact int32 lanes; the mins through the bsums as in
// the generic code. Integer results equal the generic ones exactly.
MINFER_TARGET_AVX2 float dot_q4_K_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q4_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    __m256 acc = _mm256_setzero_ps();
    __m128 acc_m = _mm_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        // The scales and mins unpacked with word operations, the mins'
        // products with the bsum pairs by one madd (per-element scalar
        // unpacking and a scalar loop over the mins took as long as the
        // nibble products: decode was bound by them, not by memory).
        alignas(16) uint8_t sm[16];
        q4k_scales_mins(x[i].scales, sm);
        acc_m = q4k_add_mins(sm, y[i].bsums, _cvtsh_ss(x[i].dmin) * y[i].d, acc_m);
        const uint8_t* q4 = x[i].qs;
        const int8_t* q8 = y[i].qs;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; ++j) {
            const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q4 + 32 * j));
            const __m256i lo = _mm256_and_si256(bits, m4);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
            const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * j));
            const __m256i y1 =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 64 * j + 32));
            const __m256i p0 =
                _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * j]), _mm256_maddubs_epi16(lo, y0));
            const __m256i p1 =
                _mm256_madd_epi16(_mm256_set1_epi16(sm[2 * j + 1]), _mm256_maddubs_epi16(hi, y1));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(p0, p1));
        }
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_avx2(acc) - hsum_sse(acc_m);
}

// Q6_K x Q8_K: the 6-bit values as unsigned 0..63 (maddubs) times the int8
// sub-block scales by madd, minus 32 * q8 once per super-block (its bsums
// times the scales).
MINFER_TARGET_AVX2 float dot_q6_K_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q6_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const uint8_t* ql = x[i].ql;
        const uint8_t* qh = x[i].qh;
        const int8_t* q8 = y[i].qs;
        const int8_t* sc = x[i].scales;
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 2; ++j) {
            const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh));
            const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
            const __m256i l2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(hb, m2), 4));
            q[1] = _mm256_or_si256(
                _mm256_and_si256(l2, m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m2), 4));
            q[2] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m2), 4));
            q[3] = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m2), 4));
            for (int k = 0; k < 4; ++k) {
                const __m256i yk =
                    _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q8 + 32 * k));
                sumi =
                    _mm256_add_epi32(sumi, _mm256_madd_epi16(scales2_avx2(sc[2 * k], sc[2 * k + 1]),
                                                             _mm256_maddubs_epi16(q[k], yk)));
            }
            ql += 64;
            qh += 32;
            q8 += 128;
            sc += 8;
        }
        // minus 32 * sum of scale * q8 over each 16-group: the bsums (the
        // q8 sums per 16) times the 16 scales, one madd per super-block
        const __m256i corr = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x[i].scales))),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums)));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(corr, 5));
        const float d = _cvtsh_ss(x[i].d) * y[i].d;
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return hsum_avx2(acc);
}

// Q5_0 x Q8_0 with AVX2 (ggml's x86 path): nibbles to 32 bytes, the 5th
// bits to a byte mask; a clear 5th bit ORs 0xF0 in, which makes the byte
// (q - 16) as int8 directly. Then |x| * sign(y, x) by maddubs as for Q8_0.
MINFER_TARGET_AVX2 inline __m256i q5_0_bytes_avx2(const block_q5_0& b) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    __m256i q = _mm256_insertf128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0xF));
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                           0x0101010101010101, 0x0000000000000000);
    __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(qh)), shuf);
    bits = _mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
    const __m256i set = _mm256_cmpeq_epi8(bits, _mm256_set1_epi64x(-1));
    return _mm256_or_si256(q, _mm256_andnot_si256(set, _mm256_set1_epi8(static_cast<char>(0xF0))));
}

MINFER_TARGET_AVX2 float dot_q5_0_avx2(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q5_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK5_0; ++ib) {
        const __m256i qx = q5_0_bytes_avx2(x[ib]);
        const __m256i qy = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[ib].qs));
        const __m256i p16 =
            _mm256_maddubs_epi16(_mm256_sign_epi8(qx, qx), _mm256_sign_epi8(qy, qx));
        const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(x[ib].d) * _cvtsh_ss(y[ib].d)), p, acc);
    }
    return hsum_avx2(acc);
}

}  // namespace

VecDotFn vec_dot_avx2(DType w) {
    switch (w) {
        case DType::Q5_0:
            return dot_q5_0_avx2;
        case DType::Q8_0:
            return dot_q8_0_avx2;
        case DType::Q4_K:
            return dot_q4_K_avx2;
        case DType::Q6_K:
            return dot_q6_K_avx2;
        default:
            return nullptr;
    }
}

}  // namespace minfer::cpu::x86

#endif
