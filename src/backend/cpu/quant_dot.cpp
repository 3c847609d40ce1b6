#include "backend/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/arm/neon.h"
#include "backend/cpu/interleaved_simd.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/x86/gemm_avx2.h"
#include "backend/cpu/x86/intrinsics.h"
#include "tensor/blocks.h"
#include "tensor/quants.h"
#include "util/error.h"

// The generic build has no -march flag; the portable loops below are
// written so the compiler vectorizes them, and each is built three times —
// plain x86-64, x86-64-v3 (AVX2) and x86-64-v4 (AVX-512) — and picked by
// the kernel level (at_level), so MINFER_CPU caps them as it caps the
// hand-written kernels and the tests run every variant on a host that has
// them.
// name_body (always inlined) into name_v4, name_v3 and name.
#define MINFER_LEVEL_VARIANTS(ret, name, params, args) \
    MINFER_TARGET_V4 ret name##_v4 params {            \
        return name##_body args;                       \
    }                                                  \
    MINFER_TARGET_V3 ret name##_v3 params {            \
        return name##_body args;                       \
    }                                                  \
    ret name params {                                  \
        return name##_body args;                       \
    }
#define MINFER_INLINE inline __attribute__((always_inline))

namespace minfer::cpu {
namespace {
// The variant of a portable loop for the kernel level in force.
template <class Fn>
Fn at_level(Fn v4, Fn v3, Fn plain) {
    if (isa_at_least(IsaLevel::Avx512)) return v4;
    if (isa_at_least(IsaLevel::Avx2)) return v3;
    return plain;
}
}  // namespace
}  // namespace minfer::cpu

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#define MINFER_X86_SIMD 1
#endif

namespace minfer::cpu {

using namespace tensor;

namespace {

// ---- helpers ---------------------------------------------------------------

MINFER_INLINE float h2f(f16_t h) {
    return fp16_to_fp32(h);
}

// Nearest integer, ties to even: ggml's nearest_int (the magic-number trick).
MINFER_INLINE int nearest_int(float fval) {
    float val = fval + 12582912.f;
    int i;
    std::memcpy(&i, &val, sizeof(int));
    return (i & 0x007fffff) - 0x00400000;
}

template <int N>
MINFER_INLINE int32_t dot_i8(const int8_t* __restrict a, const int8_t* __restrict b) {
    int32_t s = 0;
    for (int i = 0; i < N; ++i) s += static_cast<int32_t>(a[i]) * static_cast<int32_t>(b[i]);
    return s;
}

// The 16 signed 6-bit scales of a Q3_K block, minus 32.
MINFER_INLINE void q3k_scales(const uint8_t* packed, int8_t* out) {
    uint32_t aux[4];
    std::memcpy(aux, packed, 12);
    const uint32_t kmask1 = 0x03030303, kmask2 = 0x0f0f0f0f;
    const uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & kmask2) | (((tmp >> 4) & kmask1) << 4);
    aux[3] = ((aux[1] >> 4) & kmask2) | (((tmp >> 6) & kmask1) << 4);
    aux[0] = (aux[0] & kmask2) | (((tmp >> 0) & kmask1) << 4);
    aux[1] = (aux[1] & kmask2) | (((tmp >> 2) & kmask1) << 4);
    std::memcpy(out, aux, 16);
    for (int i = 0; i < 16; ++i) out[i] = static_cast<int8_t>(out[i] - 32);
}

// Unpacks a K-quant block to signed ints (the ggml generic code does the
// same through aux8), so the dot is a plain int8 dot per sub-block.
MINFER_INLINE void unpack_q3k(const block_q3_K& b, int8_t* a) {
    const uint8_t* q = b.qs;
    uint8_t m = 1;
    for (int half = 0; half < 2; ++half) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int l = 0; l < 32; ++l)
                a[l] = static_cast<int8_t>(((q[l] >> shift) & 3) - ((b.hmask[l] & m) ? 0 : 4));
            a += 32;
            m = static_cast<uint8_t>(m << 1);
        }
        q += 32;
    }
}
MINFER_INLINE void unpack_q2k(const block_q2_K& b, int8_t* a) {
    const uint8_t* q = b.qs;
    for (int half = 0; half < 2; ++half) {
        for (int shift = 0; shift < 8; shift += 2) {
            for (int l = 0; l < 32; ++l) a[l] = static_cast<int8_t>((q[l] >> shift) & 3);
            a += 32;
        }
        q += 32;
    }
}
MINFER_INLINE void unpack_q4k(const block_q4_K& b, int8_t* a) {
    for (int j = 0; j < 4; ++j) {
        const uint8_t* q = b.qs + 32 * j;
        for (int l = 0; l < 32; ++l) a[64 * j + l] = static_cast<int8_t>(q[l] & 0xF);
        for (int l = 0; l < 32; ++l) a[64 * j + 32 + l] = static_cast<int8_t>(q[l] >> 4);
    }
}
MINFER_INLINE void unpack_q5k(const block_q5_K& b, int8_t* a) {
    for (int j = 0; j < 4; ++j) {
        const uint8_t* q = b.qs + 32 * j;
        const uint8_t m1 = static_cast<uint8_t>(1u << (2 * j)),
                      m2 = static_cast<uint8_t>(2u << (2 * j));
        for (int l = 0; l < 32; ++l)
            a[64 * j + l] = static_cast<int8_t>((q[l] & 0xF) + ((b.qh[l] & m1) ? 16 : 0));
        for (int l = 0; l < 32; ++l)
            a[64 * j + 32 + l] = static_cast<int8_t>((q[l] >> 4) + ((b.qh[l] & m2) ? 16 : 0));
    }
}
MINFER_INLINE void unpack_q6k(const block_q6_K& b, int8_t* a) {
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    for (int half = 0; half < 2; ++half) {
        for (int l = 0; l < 32; ++l) {
            a[l + 0] = static_cast<int8_t>(((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            a[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            a[l + 64] = static_cast<int8_t>(((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            a[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
        a += 128;
        ql += 64;
        qh += 32;
    }
}

// ---- dot products ------------------------------------------------------------

MINFER_INLINE float dot_q4_0_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q4_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK4_0; ++ib) {
        int8_t v[32];
        for (int j = 0; j < 16; ++j) {
            v[j] = static_cast<int8_t>((x[ib].qs[j] & 0x0F) - 8);
            v[j + 16] = static_cast<int8_t>((x[ib].qs[j] >> 4) - 8);
        }
        const int sumi = dot_i8<32>(v, y[ib].qs);
        sumf += static_cast<float>(sumi) * h2f(x[ib].d) * h2f(y[ib].d);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q4_0, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q4_1_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q4_1*>(vw);
    const auto* y = static_cast<const block_q8_1*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK4_1; ++ib) {
        int8_t v[32];
        for (int j = 0; j < 16; ++j) {
            v[j] = static_cast<int8_t>(x[ib].qs[j] & 0x0F);
            v[j + 16] = static_cast<int8_t>(x[ib].qs[j] >> 4);
        }
        const int sumi = dot_i8<32>(v, y[ib].qs);
        sumf +=
            (h2f(x[ib].d) * h2f(y[ib].d)) * static_cast<float>(sumi) + h2f(x[ib].m) * h2f(y[ib].s);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q4_1, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q5_0_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q5_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK5_0; ++ib) {
        uint32_t qh;
        std::memcpy(&qh, x[ib].qh, sizeof(qh));
        int8_t v[32];
        for (int j = 0; j < 16; ++j) {
            const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
            const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
            v[j] = static_cast<int8_t>(((x[ib].qs[j] & 0x0F) | xh0) - 16);
            v[j + 16] = static_cast<int8_t>(((x[ib].qs[j] >> 4) | xh1) - 16);
        }
        const int sumi = dot_i8<32>(v, y[ib].qs);
        sumf += (h2f(x[ib].d) * h2f(y[ib].d)) * static_cast<float>(sumi);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q5_0, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q5_1_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q5_1*>(vw);
    const auto* y = static_cast<const block_q8_1*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK5_1; ++ib) {
        uint32_t qh;
        std::memcpy(&qh, x[ib].qh, sizeof(qh));
        int8_t v[32];
        for (int j = 0; j < 16; ++j) {
            const int xh0 = static_cast<int>(((qh >> j) << 4) & 0x10);
            const int xh1 = static_cast<int>((qh >> (j + 12)) & 0x10);
            v[j] = static_cast<int8_t>((x[ib].qs[j] & 0x0F) | xh0);
            v[j + 16] = static_cast<int8_t>((x[ib].qs[j] >> 4) | xh1);
        }
        const int sumi = dot_i8<32>(v, y[ib].qs);
        sumf +=
            (h2f(x[ib].d) * h2f(y[ib].d)) * static_cast<float>(sumi) + h2f(x[ib].m) * h2f(y[ib].s);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q5_1, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q8_0_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q8_0*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK8_0; ++ib) {
        const int sumi = dot_i8<32>(x[ib].qs, y[ib].qs);
        sumf += static_cast<float>(sumi) * (h2f(x[ib].d) * h2f(y[ib].d));
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q8_0, (int64_t n, const void* vw, const void* va), (n, vw, va))

#ifdef MINFER_X86_SIMD
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
    const __m256 acc = _mm256_add_ps(acc0, acc1);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

MINFER_TARGET_AVX2 inline float hsum_avx2(__m256 v) {
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}

// Two int16 scales, one per 128-bit half (a 32-element group that spans two
// 16-element sub-blocks: the low half of maddubs' lanes covers elements 0-15).
MINFER_TARGET_AVX2 inline __m256i scales2_avx2(int a, int b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(static_cast<int16_t>(a))),
                                   _mm_set1_epi16(static_cast<int16_t>(b)), 1);
}

// The 8 six-bit scales (bytes 0-7) and mins (bytes 8-15) of a Q4_K / Q5_K
// block, unpacked with word operations (the same values as get_scale_min_k4).
MINFER_INLINE void q4k_scales_mins(const uint8_t* packed, uint8_t* out16) {
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
        const __m128i sm8 = _mm_load_si128(reinterpret_cast<const __m128i*>(sm));
        const __m128i mins16 = _mm_cvtepu8_epi16(_mm_srli_si128(sm8, 8));
        const __m256i bs =
            _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums)),
                              _mm256_set1_epi16(1));  // bsum[2j] + bsum[2j + 1]
        const __m128i bpair =
            _mm_packs_epi32(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
        const float dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc_m =
            _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(_mm_madd_epi16(mins16, bpair)), acc_m);
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
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return hsum_avx2(acc) - _mm_cvtss_f32(acc_m);
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
        // mins: sum_j m_j * (bsum[2j] + bsum[2j+1]) via madd of pair sums
        const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[i].bsums));
        const __m128i bpair = _mm_packs_epi32(
            _mm256_castsi256_si128(_mm256_madd_epi16(bs, _mm256_set1_epi16(1))),
            _mm256_extracti128_si256(_mm256_madd_epi16(bs, _mm256_set1_epi16(1)), 1));
        const __m128i prod = _mm_madd_epi16(_mm256_extracti128_si256(sm16, 1), bpair);
        const float dmin = _cvtsh_ss(x[i].dmin) * y[i].d;
        acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(prod), acc_m);
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
    acc_m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    acc_m = _mm_add_ss(acc_m, _mm_movehdup_ps(acc_m));
    return _mm512_reduce_add_ps(acc) - _mm_cvtss_f32(acc_m);
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
// (gemm.cpp's micro), so a token's outputs are bitwise the same alone and
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
// GEMM (gemm.cpp's micro_k), sub-block by sub-block: cvt(sum) times d *
// scale, then -dmin * min times the activations' sum, into a block sum
// that takes the activation scale once. So a token's outputs are bitwise
// the same alone (here) and in a batch (the GEMM).
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
        __m512i sc[2], mn[2];  // bytes of each lane: scales 0-3, 4-7; mins 0-3, 4-7
        interleaved::q4_K_scales_mins(blk, sc, mn);
        const __m512 d = interleaved::halves16(blk), dmin = interleaved::halves16(blk + 32);
        __m512 sum[NT];
        for (int t = 0; t < NT; ++t) sum[t] = _mm512_setzero_ps();
        const uint8_t* qs = blk + 256;
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
                const __m512 o = _mm512_sub_ps(
                    _mm512_setzero_ps(),
                    _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(interleaved::byte_of(mn, j))));
                for (int t = 0; t < NT; ++t) {
                    const auto bsum =
                        static_cast<float>(y[t][i].bsums[2 * j] + y[t][i].bsums[2 * j + 1]);
                    sum[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s2[t][h]), s, sum[t]);
                    sum[t] = _mm512_fmadd_ps(o, _mm512_set1_ps(bsum), sum[t]);
                }
            }
        }
        for (int t = 0; t < NT; ++t)
            acc[t] = _mm512_fmadd_ps(sum[t], _mm512_set1_ps(y[t][i].d), acc[t]);
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
        const uint8_t* sc = blk + 3072;
        __m512i gs[16];  // the integer sum of each group
        for (int h = 0; h < 2; ++h)
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
#endif

MINFER_INLINE float dot_iq4_nl_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_iq4_nl*>(vw);
    const auto* y = static_cast<const block_q8_0*>(va);
    float sumf = 0;
    for (int64_t ib = 0; ib < n / QK4_NL; ++ib) {
        int8_t v[32];
        for (int j = 0; j < 16; ++j) {
            v[j] = kvalues_iq4nl[x[ib].qs[j] & 0xF];
            v[j + 16] = kvalues_iq4nl[x[ib].qs[j] >> 4];
        }
        const float d = h2f(y[ib].d) * h2f(x[ib].d);
        sumf += d * static_cast<float>(dot_i8<32>(v, y[ib].qs));
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_iq4_nl, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q2_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q2_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_q2k(x[i], a);
        int summs = 0;
        for (int j = 0; j < 16; ++j) summs += y[i].bsums[j] * (x[i].scales[j] >> 4);
        int isum = 0;
        for (int j = 0; j < 16; ++j)
            isum += (x[i].scales[j] & 0xF) * dot_i8<16>(a + 16 * j, y[i].qs + 16 * j);
        const float dall = y[i].d * h2f(x[i].d);
        const float dmin = y[i].d * h2f(x[i].dmin);
        sumf += dall * static_cast<float>(isum) - dmin * static_cast<float>(summs);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q2_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q3_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q3_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        int8_t sc[16];
        unpack_q3k(x[i], a);
        q3k_scales(x[i].scales, sc);
        int isum = 0;
        for (int j = 0; j < 16; ++j) isum += sc[j] * dot_i8<16>(a + 16 * j, y[i].qs + 16 * j);
        sumf += h2f(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q3_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

// Q4_K and Q5_K share the super-block arithmetic once unpacked to int8:
// 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min (the min
// times the activations' sums, from Q8_K's bsums).
template <typename Block>
MINFER_INLINE float dot_k4_superblock(const Block& x, const block_q8_K& y, const int8_t* a) {
    int isum = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, x.scales, &sc, &m);
        isum += sc * dot_i8<32>(a + 32 * j, y.qs + 32 * j);
        summ += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
    }
    const float d = h2f(x.d) * y.d;
    const float dmin = h2f(x.dmin) * y.d;
    return d * static_cast<float>(isum) - dmin * static_cast<float>(summ);
}

MINFER_INLINE float dot_q4_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q4_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_q4k(x[i], a);
        sumf += dot_k4_superblock(x[i], y[i], a);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q4_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q5_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q5_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_q5k(x[i], a);
        sumf += dot_k4_superblock(x[i], y[i], a);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q5_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q6_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q6_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_q6k(x[i], a);
        int isum = 0;
        for (int j = 0; j < 16; ++j)
            isum += x[i].scales[j] * dot_i8<16>(a + 16 * j, y[i].qs + 16 * j);
        sumf += h2f(x[i].d) * y[i].d * static_cast<float>(isum);
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q6_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_iq4_xs_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_iq4_xs*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        const float d4d8 = h2f(x[i].d) * y[i].d;
        for (int ib = 0; ib < 8; ++ib) {
            const int ls = ((x[i].scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) |
                           (((x[i].scales_h >> 2 * ib) & 3) << 4);
            const uint8_t* qs = x[i].qs + 16 * ib;
            int8_t v[32];
            for (int j = 0; j < 16; ++j) {
                v[j] = kvalues_iq4nl[qs[j] & 0xF];
                v[j + 16] = kvalues_iq4nl[qs[j] >> 4];
            }
            sumf += d4d8 * static_cast<float>(ls - 32) *
                    static_cast<float>(dot_i8<32>(v, y[i].qs + 32 * ib));
        }
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_iq4_xs, (int64_t n, const void* vw, const void* va), (n, vw, va))

template <typename Conv>
MINFER_INLINE float dot_halfs(int64_t n, const uint16_t* x, const uint16_t* y, Conv conv) {
    float acc[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += conv(x[i + l]) * conv(y[i + l]);
    float s = 0;
    for (; i < n; ++i) s += conv(x[i]) * conv(y[i]);
    for (int l = 0; l < 16; ++l) s += acc[l];
    return s;
}

MINFER_INLINE float dot_f16_body(int64_t n, const void* vw, const void* va) {
    return dot_halfs(n, static_cast<const uint16_t*>(vw), static_cast<const uint16_t*>(va),
                     [](uint16_t h) { return fp16_to_fp32(h); });
}
MINFER_LEVEL_VARIANTS(float, dot_f16, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_bf16_body(int64_t n, const void* vw, const void* va) {
    return dot_halfs(n, static_cast<const uint16_t*>(vw), static_cast<const uint16_t*>(va),
                     [](uint16_t h) { return bf16_to_fp32(h); });
}
MINFER_LEVEL_VARIANTS(float, dot_bf16, (int64_t n, const void* vw, const void* va), (n, vw, va))

// ---- activation quantizers --------------------------------------------------

// As ggml's x86 quantize_row_q8_0 / q8_1 (the ones llama.cpp runs on this
// machine): d = amax / 127 stored as f16, q = round-to-nearest-even(x * 127 /
// amax). q8_1 also stores s = d * sum(q).
// (A compare instead of fmax, so the max vectorizes; the same for finite x.)
template <bool kWithSum, typename Block>
MINFER_INLINE void quantize_q8_32(const float* x, Block* y, int64_t n) {
    for (int64_t ib = 0; ib < n / 32; ++ib) {
        const float* xb = x + 32 * ib;
        float amax = 0;
        for (int j = 0; j < 32; ++j) {
            const float ax = std::fabs(xb[j]);
            amax = ax > amax ? ax : amax;
        }
        const float d = amax / 127.f;
        const float id = amax != 0.0f ? 127.f / amax : 0.0f;
        y[ib].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < 32; ++j) {
            const int q = nearest_int(xb[j] * id);
            y[ib].qs[j] = static_cast<int8_t>(q);
            sum += q;
        }
        if constexpr (kWithSum) y[ib].s = fp32_to_fp16(d * static_cast<float>(sum));
    }
}

MINFER_INLINE void quantize_q8_0_row_body(const float* x, block_q8_0* y, int64_t n) {
    quantize_q8_32<false>(x, y, n);
}
MINFER_LEVEL_VARIANTS(void, quantize_q8_0_row, (const float* x, block_q8_0* y, int64_t n),
                      (x, y, n))
MINFER_INLINE void quantize_q8_1_row_body(const float* x, block_q8_1* y, int64_t n) {
    quantize_q8_32<true>(x, y, n);
}
MINFER_LEVEL_VARIANTS(void, quantize_q8_1_row, (const float* x, block_q8_1* y, int64_t n),
                      (x, y, n))

// ggml's quantize_row_q8_K_ref (the tensor stage's reference, which the
// tests hold this bit-identical to), written so the compiler vectorizes
// it: the block's largest magnitude, its first element of that magnitude
// (whose sign ggml keeps), then q = min(127, round(x * -127 / max)).
MINFER_INLINE void quantize_q8_K_row_body(const float* x, block_q8_K* y, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ++ib, x += QK_K) {
        float amax = 0;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            amax = ax > amax ? ax : amax;
        }
        if (amax == 0.0f) {
            y[ib].d = 0;
            std::memset(y[ib].qs, 0, QK_K);
            std::memset(y[ib].bsums, 0, sizeof(y[ib].bsums));
            continue;
        }
        int first = 0;
        while (std::fabs(x[first]) != amax) ++first;
        const float iscale = -127.f / x[first];
        for (int j = 0; j < QK_K; ++j)
            y[ib].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
        for (int g = 0; g < QK_K / 16; ++g) {
            int sum = 0;
            for (int j = 0; j < 16; ++j) sum += y[ib].qs[16 * g + j];
            y[ib].bsums[g] = static_cast<int16_t>(sum);
        }
        y[ib].d = 1 / iscale;
    }
}
MINFER_LEVEL_VARIANTS(void, quantize_q8_K_row, (const float* x, block_q8_K* y, int64_t n),
                      (x, y, n))

}  // namespace

MINFER_INLINE float dot_f32_plain_body(const float* a, const float* b, int64_t n) {
    float acc[16] = {};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; ++l) acc[l] += a[i + l] * b[i + l];
    float s = 0;
    for (; i < n; ++i) s += a[i] * b[i];
    for (int l = 0; l < 16; ++l) s += acc[l];
    return s;
}
MINFER_LEVEL_VARIANTS(float, dot_f32_plain, (const float* a, const float* b, int64_t n), (a, b, n))

float dot_f32(const float* a, const float* b, int64_t n) {
    return at_level(dot_f32_plain_v4, dot_f32_plain_v3, dot_f32_plain)(a, b, n);
}

MINFER_INLINE float dot_f32_fn_body(int64_t n, const void* vw, const void* va) {
    return dot_f32_plain_body(static_cast<const float*>(vw), static_cast<const float*>(va), n);
}
MINFER_LEVEL_VARIANTS(float, dot_f32_fn, (int64_t n, const void* vw, const void* va), (n, vw, va))

// The activation format is the tensor stage's vec_dot_type: one table for
// both, so the kernels and the reference code cannot disagree.
DType act_type(DType w) {
    return tensor::vec_dot_type(w);
}

void quantize_act_row(DType act, const float* x, void* y, int64_t n) {
    switch (act) {
        case DType::Q8_0:
            at_level(quantize_q8_0_row_v4, quantize_q8_0_row_v3, quantize_q8_0_row)(
                x, static_cast<block_q8_0*>(y), n);
            return;
        case DType::Q8_1:
            at_level(quantize_q8_1_row_v4, quantize_q8_1_row_v3, quantize_q8_1_row)(
                x, static_cast<block_q8_1*>(y), n);
            return;
        case DType::Q8_K:
            at_level(quantize_q8_K_row_v4, quantize_q8_K_row_v3, quantize_q8_K_row)(
                x, static_cast<block_q8_K*>(y), n);
            return;
        case DType::F16: {
            auto* h = static_cast<uint16_t*>(y);
            for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_fp16(x[i]);
            return;
        }
        case DType::BF16: {
            auto* h = static_cast<uint16_t*>(y);
            for (int64_t i = 0; i < n; ++i) h[i] = fp32_to_bf16(x[i]);
            return;
        }
        case DType::F32:
            std::memcpy(y, x, static_cast<size_t>(n) * sizeof(float));
            return;
        default:
            MINFER_ASSERT_MSG(false, "not an activation type");
    }
}

// The choices kernel_table.cpp gathers per level. A portable loop's
// variant follows the level (x86-64-v4 / -v3 / plain); the hand-written x86
// kernels are Avx2 and Avx512 ones.
namespace {
template <class Fn>
Fn at(IsaLevel level, Fn v4, Fn v3, Fn plain) {
    if (level == IsaLevel::Avx512) return v4;
    if (level == IsaLevel::Avx2) return v3;
    return plain;
}
}  // namespace

GroupDotFn group_dot_at(IsaLevel level, bool avx_vnni, DType w) {
#ifdef MINFER_X86_SIMD
    const bool vnni512 = level == IsaLevel::Avx512;
    const bool bitalg = vnni512 && cpu_has_avx512_bitalg();
    if (w == DType::Q5_0 && bitalg) return group_dot_q5_0;
    if (w == DType::Q4_K && vnni512) return group_dot_q4_K;
    if (w == DType::Q6_K && vnni512) return group_dot_q6_K;
    if (w == DType::Q8_0 && vnni512) return group_dot_q8_0;
    // Avx2: Q8_0, Q4_K, Q6_K (x86/gemm_avx2.cpp, beside the GEMM it mirrors).
    if (level == IsaLevel::Avx2) return avx2::group_dot(w, avx_vnni);
#endif
    (void)level, (void)avx_vnni, (void)w;
    return nullptr;
}

GroupDotManyFn group_dot_many_at(IsaLevel level, DType w) {
#ifdef MINFER_X86_SIMD
    if (level == IsaLevel::Avx512 && group_dot_at(level, false, w) != nullptr) {
        if (w == DType::Q8_0) return group_dot_many<Q8_0Group>;
        if (w == DType::Q4_K) return group_dot_many<Q4_KGroup>;
    }
#endif
    (void)level, (void)w;
    return nullptr;
}

VecDotFn vec_dot_at(IsaLevel level, DType w) {
#ifdef MINFER_X86_SIMD
    const bool avx512 = level == IsaLevel::Avx512, avx2 = level == IsaLevel::Avx2;
#endif
    switch (w) {
        case DType::F32:
            return at(level, dot_f32_fn_v4, dot_f32_fn_v3, dot_f32_fn);
        case DType::F16:
            return at(level, dot_f16_v4, dot_f16_v3, dot_f16);
        case DType::BF16:
            return at(level, dot_bf16_v4, dot_bf16_v3, dot_bf16);
        case DType::Q4_0:
            return at(level, dot_q4_0_v4, dot_q4_0_v3, dot_q4_0);
        case DType::Q4_1:
            return at(level, dot_q4_1_v4, dot_q4_1_v3, dot_q4_1);
        case DType::Q5_0:
#ifdef MINFER_X86_SIMD
            if (avx512) return dot_q5_0_vnni512;
            if (avx2) return dot_q5_0_avx2;
#endif
            return at(level, dot_q5_0_v4, dot_q5_0_v3, dot_q5_0);
        case DType::Q5_1:
            return at(level, dot_q5_1_v4, dot_q5_1_v3, dot_q5_1);
        case DType::Q8_0:
#ifdef MINFER_X86_SIMD
            if (avx512) return dot_q8_0_vnni;
            if (avx2) return dot_q8_0_avx2;
#endif
            return at(level, dot_q8_0_v4, dot_q8_0_v3, dot_q8_0);
        case DType::Q2_K:
            return at(level, dot_q2_K_v4, dot_q2_K_v3, dot_q2_K);
        case DType::Q3_K:
            return at(level, dot_q3_K_v4, dot_q3_K_v3, dot_q3_K);
        case DType::Q4_K:
#ifdef MINFER_X86_SIMD
            if (avx512) return dot_q4_K_vnni512;
            if (avx2) return dot_q4_K_avx2;
#endif
            return at(level, dot_q4_K_v4, dot_q4_K_v3, dot_q4_K);
        case DType::Q5_K:
            return at(level, dot_q5_K_v4, dot_q5_K_v3, dot_q5_K);
        case DType::Q6_K:
#ifdef MINFER_X86_SIMD
            if (avx512) return dot_q6_K_vnni512;
            if (avx2) return dot_q6_K_avx2;
#endif
            return at(level, dot_q6_K_v4, dot_q6_K_v3, dot_q6_K);
        case DType::IQ4_NL:
            return at(level, dot_iq4_nl_v4, dot_iq4_nl_v3, dot_iq4_nl);
        case DType::IQ4_XS:
            return at(level, dot_iq4_xs_v4, dot_iq4_xs_v3, dot_iq4_xs);
        default:
            return nullptr;
    }
}

GroupDotFn group_dot_fn(DType w) {
    return kernels().group_dot_of(w);
}

GroupDotManyFn group_dot_many_fn(DType w) {
    return kernels().group_dot_many_of(w);
}

VecDotFn vec_dot_fn(DType w) {
#if defined(__aarch64__)
    // ARM64's kernels pick their level themselves (arm/quant_dot_neon.cpp).
    if (VecDotFn f = arm::vec_dot_neon(w)) return f;
#endif
    return kernels().vec_dot_of(w);
}

// ---- dequantization ---------------------------------------------------------

// Only GetRows (one embedding row per token) dequantizes on the CPU path, so
// the tensor stage's reference dequantizer (ggml's arithmetic) serves as is.
void dequant_row(DType type, const void* vx, float* y, int64_t n) {
    tensor::dequantize_row(type, vx, y, n);
}

}  // namespace minfer::cpu
