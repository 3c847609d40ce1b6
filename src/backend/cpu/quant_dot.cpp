#include "backend/cpu/quant_dot.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "backend/cpu/arm/neon.h"
#include "backend/cpu/interleaved_simd.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/x86/dot_x86.h"
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

// The float steps of the portable dots of the types the prompt GEMMs take
// (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K). On x86-64, those of its GEMMs and
// group kernels (gemm_step_block and the K-quant bodies below): the scalar
// level gives a row the bits the AVX2 and AVX-512 levels give it in their
// GEMMs and on regrouped weights. On ARM64, ggml's, which its NEON dots
// take too (test_isa_levels.cpp holds them to the portable dots' bits).
#if defined(__x86_64__)
inline constexpr bool kGemmSteps = true;
#else
inline constexpr bool kGemmSteps = false;
#endif

// One 32-element block (Q4_0, Q5_0, Q8_0) added to acc in the x86 GEMMs'
// steps: cvt(sum) times the weight scale, times the activation scale by
// one FMA.
MINFER_INLINE float gemm_step_block(int32_t sum, float dw, float da, float acc) {
    return std::fma(static_cast<float>(sum) * dw, da, acc);
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
// unpack_k4: Q4_K and Q5_K to int8 (the mins kept apart), overloaded so
// that dot_k4_body serves both.
MINFER_INLINE void unpack_k4(const block_q4_K& b, int8_t* a) {
    for (int j = 0; j < 4; ++j) {
        const uint8_t* q = b.qs + 32 * j;
        for (int l = 0; l < 32; ++l) a[64 * j + l] = static_cast<int8_t>(q[l] & 0xF);
        for (int l = 0; l < 32; ++l) a[64 * j + 32 + l] = static_cast<int8_t>(q[l] >> 4);
    }
}
MINFER_INLINE void unpack_k4(const block_q5_K& b, int8_t* a) {
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
        if constexpr (kGemmSteps)
            sumf = gemm_step_block(sumi, h2f(x[ib].d), h2f(y[ib].d), sumf);
        else
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
        if constexpr (kGemmSteps)
            sumf = gemm_step_block(sumi, h2f(x[ib].d), h2f(y[ib].d), sumf);
        else
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
        if constexpr (kGemmSteps)
            sumf = gemm_step_block(sumi, h2f(x[ib].d), h2f(y[ib].d), sumf);
        else
            sumf += static_cast<float>(sumi) * (h2f(x[ib].d) * h2f(y[ib].d));
    }
    return sumf;
}
MINFER_LEVEL_VARIANTS(float, dot_q8_0, (int64_t n, const void* vw, const void* va), (n, vw, va))

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
// x86 steps (kGemmSteps): sub-block by sub-block, cvt(sum) times d *
// scale into a super-block sum; then the mins times the activations' sums,
// summed in integers, times -dmin, added once; the caller multiplies the
// sum by the activation scale.
template <typename Block>
MINFER_INLINE float k4_superblock_gemm_steps(const Block& x, const block_q8_K& y, const int8_t* a) {
    const float d = h2f(x.d), neg_dmin = -h2f(x.dmin);
    float sum = 0;
    int32_t mins = 0;
    for (int j = 0; j < 8; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, x.scales, &sc, &m);
        const int isum = dot_i8<32>(a + 32 * j, y.qs + 32 * j);
        sum = std::fma(static_cast<float>(isum), d * static_cast<float>(sc), sum);
        mins += m * (y.bsums[2 * j] + y.bsums[2 * j + 1]);
    }
    return std::fma(static_cast<float>(mins), neg_dmin, sum);
}
// ggml's steps: the scales and mins summed in integers, then two products.
template <typename Block>
MINFER_INLINE float k4_superblock_ggml(const Block& x, const block_q8_K& y, const int8_t* a) {
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

template <typename Block>
MINFER_INLINE float dot_k4_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const Block*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_k4(x[i], a);
        if constexpr (kGemmSteps)
            sumf = std::fma(k4_superblock_gemm_steps(x[i], y[i], a), y[i].d, sumf);
        else
            sumf += k4_superblock_ggml(x[i], y[i], a);
    }
    return sumf;
}
MINFER_INLINE float dot_q4_K_body(int64_t n, const void* vw, const void* va) {
    return dot_k4_body<block_q4_K>(n, vw, va);
}
MINFER_LEVEL_VARIANTS(float, dot_q4_K, (int64_t n, const void* vw, const void* va), (n, vw, va))
MINFER_INLINE float dot_q5_K_body(int64_t n, const void* vw, const void* va) {
    return dot_k4_body<block_q5_K>(n, vw, va);
}
MINFER_LEVEL_VARIANTS(float, dot_q5_K, (int64_t n, const void* vw, const void* va), (n, vw, va))

MINFER_INLINE float dot_q6_K_body(int64_t n, const void* vw, const void* va) {
    const auto* x = static_cast<const block_q6_K*>(vw);
    const auto* y = static_cast<const block_q8_K*>(va);
    float sumf = 0;
    for (int64_t i = 0; i < n / QK_K; ++i) {
        int8_t a[QK_K];
        unpack_q6k(x[i], a);
        if constexpr (kGemmSteps) {
            // group by group, cvt(sum) times d * scale, into a super-block
            // sum times the activation scale
            const float d = h2f(x[i].d);
            float sum = 0;
            for (int j = 0; j < 16; ++j)
                sum = std::fma(static_cast<float>(dot_i8<16>(a + 16 * j, y[i].qs + 16 * j)),
                               d * static_cast<float>(x[i].scales[j]), sum);
            sumf = std::fma(sum, y[i].d, sumf);
        } else {
            int isum = 0;
            for (int j = 0; j < 16; ++j)
                isum += x[i].scales[j] * dot_i8<16>(a + 16 * j, y[i].qs + 16 * j);
            sumf += h2f(x[i].d) * y[i].d * static_cast<float>(isum);
        }
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

// Every half's float, built once by fp16_to_fp32: the dot reads one entry
// per element instead of running the conversion's dozen integer and float
// operations twice per product (the portable loop does not vectorize them),
// and the values, so the sums, are the same bits.
const float* half_to_float_table() {
    static const std::vector<float> table = [] {
        std::vector<float> t(size_t{1} << 16);
        for (uint32_t h = 0; h < t.size(); ++h) t[h] = fp16_to_fp32(static_cast<uint16_t>(h));
        return t;
    }();
    return table.data();
}

MINFER_INLINE float dot_f16_body(int64_t n, const void* vw, const void* va) {
    const float* table = half_to_float_table();
    return dot_halfs(n, static_cast<const uint16_t*>(vw), static_cast<const uint16_t*>(va),
                     [table](uint16_t h) { return table[h]; });
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

// A Q8_K block's largest magnitude and the first element of that magnitude
// (whose sign ggml keeps). ggml scans for them one element at a time, a
// loop the compiler leaves scalar (a float max reduction and an early
// exit); the x86 levels below find the same two per 16 or 8 lanes.
struct BlockPeak {
    float amax;
    int first;
};

MINFER_INLINE BlockPeak block_peak(const float* x) {
    float amax = 0;
    for (int j = 0; j < QK_K; ++j) {
        const float ax = std::fabs(x[j]);
        amax = ax > amax ? ax : amax;
    }
    int first = 0;
    if (amax != 0.0f)
        while (std::fabs(x[first]) != amax) ++first;
    return {amax, first};
}

#ifdef MINFER_X86_SIMD
// max_ps(ax, m) is ax > m ? ax : m per lane, the scalar compare: a NaN is
// skipped as ggml's scan skips it, and the max of the rest does not depend
// on the order, so both are ggml's.
MINFER_TARGET_V4 inline BlockPeak block_peak_v4(const float* x) {
    const __m512 sign = _mm512_set1_ps(-0.0f);
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < QK_K; j += 16)
        m = _mm512_max_ps(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + j)), m);
    const float amax = _mm512_reduce_max_ps(m);
    if (amax == 0.0f) return {0.0f, 0};
    const __m512 target = _mm512_set1_ps(amax);
    for (int j = 0;; j += 16) {
        const __mmask16 eq =
            _mm512_cmp_ps_mask(_mm512_andnot_ps(sign, _mm512_loadu_ps(x + j)), target, _CMP_EQ_OQ);
        if (eq != 0) return {amax, j + __builtin_ctz(eq)};
    }
}

MINFER_TARGET_V3 inline BlockPeak block_peak_v3(const float* x) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < QK_K; j += 8)
        m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), m);
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_movehdup_ps(h));
    const float amax = _mm_cvtss_f32(h);
    if (amax == 0.0f) return {0.0f, 0};
    const __m256 target = _mm256_set1_ps(amax);
    for (int j = 0;; j += 8) {
        const int eq = _mm256_movemask_ps(
            _mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), target, _CMP_EQ_OQ));
        if (eq != 0) return {amax, j + __builtin_ctz(static_cast<unsigned>(eq))};
    }
}
#else
// No x86 levels on this architecture: their variants search portably.
MINFER_INLINE BlockPeak block_peak_v4(const float* x) {
    return block_peak(x);
}
MINFER_INLINE BlockPeak block_peak_v3(const float* x) {
    return block_peak(x);
}
#endif

// ggml's quantize_row_q8_K_ref (the tensor stage's reference, which the
// tests hold this bit-identical to), written so the compiler vectorizes
// it: with the block's peak, q = min(127, round(x * -127 / x[first])).
template <BlockPeak (*kPeak)(const float*)>
MINFER_INLINE void quantize_q8_K_row_body(const float* x, block_q8_K* y, int64_t n) {
    for (int64_t ib = 0; ib < n / QK_K; ++ib, x += QK_K) {
        const BlockPeak peak = kPeak(x);
        if (peak.amax == 0.0f) {
            y[ib].d = 0;
            std::memset(y[ib].qs, 0, QK_K);
            std::memset(y[ib].bsums, 0, sizeof(y[ib].bsums));
            continue;
        }
        const float iscale = -127.f / x[peak.first];
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
MINFER_TARGET_V4 void quantize_q8_K_row_v4(const float* x, block_q8_K* y, int64_t n) {
    quantize_q8_K_row_body<block_peak_v4>(x, y, n);
}
MINFER_TARGET_V3 void quantize_q8_K_row_v3(const float* x, block_q8_K* y, int64_t n) {
    quantize_q8_K_row_body<block_peak_v3>(x, y, n);
}
void quantize_q8_K_row(const float* x, block_q8_K* y, int64_t n) {
    quantize_q8_K_row_body<block_peak>(x, y, n);
}

#ifdef MINFER_X86_SIMD
// quantize_q8_K_row_body's q, d and bsums written straight into the
// x86-64 GEMM's activation form (gemm.h: q, d per 16, the sum of q per 32
// as int16, -32 times the sum per 16 as int32), 64 elements a step: the
// same float steps per element (x * iscale, rounded to the nearest int,
// ties to even: what the magic number of nearest_int does, here
// vcvtps2dq's rounding, with a NaN as 0 as there), and min(127, q) through
// the saturating packs (q is never below -127: |x| <= |x[first]|), so the
// same bytes as the two steps, without the intermediate row. The sums come from the stored
// bytes: sad_epu8 adds q ^ 0x80 = q + 128 per 8 bytes.
MINFER_TARGET_V4 void quantize_q8_K_row_gemm_v4(const float* x, uint8_t* out, int64_t n) {
    auto* d = reinterpret_cast<float*>(out + n);
    auto* s32 = reinterpret_cast<int16_t*>(d + n / 16);
    auto* off16 = reinterpret_cast<int32_t*>(s32 + n / 32);
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    // packs leave dword 4l + s of the bytes holding elements 4l.. of
    // vector s: this puts each vector's 16 bytes back in order
    const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    // qword 0 of each 128-bit lane of two vectors, in order
    const __m512i even = _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14);
    for (int64_t ib = 0; ib < n / QK_K; ++ib, x += QK_K) {
        uint8_t* q = out + ib * QK_K;
        const BlockPeak peak = block_peak_v4(x);
        if (peak.amax == 0.0f) {
            std::memset(q, 0, QK_K);
            _mm512_storeu_ps(d + ib * 16, _mm512_setzero_ps());
            _mm_storeu_si128(reinterpret_cast<__m128i*>(s32 + ib * 8), _mm_setzero_si128());
            _mm512_storeu_si512(off16 + ib * 16, _mm512_setzero_si512());
            continue;
        }
        const float iscale = -127.f / x[peak.first];
        const __m512 vis = _mm512_set1_ps(iscale);
        __m512i u[4];  // per 64 elements: qword 0 of lane h = the sum of group h of 16, + 16 * 128
        for (int c = 0; c < 4; ++c) {
            __m512i i[4];
            for (int k = 0; k < 4; ++k) {
                const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + 64 * c + 16 * k), vis);
                // a NaN (x * iscale of an infinite x) is 0, as nearest_int makes it
                i[k] =
                    _mm512_maskz_cvt_roundps_epi32(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v,
                                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            }
            const __m512i bytes = _mm512_permutexvar_epi32(
                order,
                _mm512_packs_epi16(_mm512_packs_epi32(i[0], i[1]), _mm512_packs_epi32(i[2], i[3])));
            _mm512_storeu_si512(q + 64 * c, bytes);
            const __m512i s8 =
                _mm512_sad_epu8(_mm512_xor_si512(bytes, flip), _mm512_setzero_si512());
            u[c] = _mm512_add_epi64(s8, _mm512_bsrli_epi128(s8, 8));
        }
        // the 16 sums per 16, then -32 times them and the 8 sums per 32
        const __m512i sum16 = _mm512_sub_epi32(
            _mm512_inserti64x4(
                _mm512_castsi256_si512(
                    _mm512_cvtepi64_epi32(_mm512_permutex2var_epi64(u[0], even, u[1]))),
                _mm512_cvtepi64_epi32(_mm512_permutex2var_epi64(u[2], even, u[3])), 1),
            _mm512_set1_epi32(16 * 128));
        _mm512_storeu_si512(off16 + ib * 16,
                            _mm512_slli_epi32(_mm512_sub_epi32(_mm512_setzero_si512(), sum16), 5));
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(s32 + ib * 8),
            _mm512_cvtepi64_epi16(_mm512_add_epi32(sum16, _mm512_srli_epi64(sum16, 32))));
        _mm512_storeu_ps(d + ib * 16, _mm512_set1_ps(1 / iscale));
    }
}
#endif

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

void quantize_q8_K_row_vnni_gemm(const float* x, void* out, int64_t n) {
#ifdef MINFER_X86_SIMD
    MINFER_ASSERT(n % QK_K == 0 && isa_level() == IsaLevel::Avx512);
    quantize_q8_K_row_gemm_v4(x, static_cast<uint8_t*>(out), n);
#else
    (void)x, (void)out, (void)n;
    MINFER_ASSERT_MSG(false, "the AVX-512 GEMM form on an architecture without it");
#endif
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
    if (level == IsaLevel::Avx512) return x86::group_dot_avx512(w);
    // Avx2: Q8_0, Q5_0, Q4_K, Q6_K (x86/gemm_avx2.cpp, beside the GEMM it mirrors).
    if (level == IsaLevel::Avx2) return avx2::group_dot(w, avx_vnni);
#endif
    (void)level, (void)avx_vnni, (void)w;
    return nullptr;
}

GroupDotManyFn group_dot_many_at(IsaLevel level, DType w) {
#ifdef MINFER_X86_SIMD
    if (level == IsaLevel::Avx512 && group_dot_at(level, false, w) != nullptr)
        return x86::group_dot_many_avx512(w);
#endif
    (void)level, (void)w;
    return nullptr;
}

VecDotFn vec_dot_at(IsaLevel level, DType w) {
#if defined(__aarch64__)
    if (VecDotFn f = arm::vec_dot_neon(level, w)) return f;
#endif
#ifdef MINFER_X86_SIMD
    if (level == IsaLevel::Avx512)
        if (VecDotFn f = x86::vec_dot_avx512(w)) return f;
    if (level == IsaLevel::Avx2)
        if (VecDotFn f = x86::vec_dot_avx2(w)) return f;
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
            return at(level, dot_q5_0_v4, dot_q5_0_v3, dot_q5_0);
        case DType::Q5_1:
            return at(level, dot_q5_1_v4, dot_q5_1_v3, dot_q5_1);
        case DType::Q8_0:
            return at(level, dot_q8_0_v4, dot_q8_0_v3, dot_q8_0);
        case DType::Q2_K:
            return at(level, dot_q2_K_v4, dot_q2_K_v3, dot_q2_K);
        case DType::Q3_K:
            return at(level, dot_q3_K_v4, dot_q3_K_v3, dot_q3_K);
        case DType::Q4_K:
            return at(level, dot_q4_K_v4, dot_q4_K_v3, dot_q4_K);
        case DType::Q5_K:
            return at(level, dot_q5_K_v4, dot_q5_K_v3, dot_q5_K);
        case DType::Q6_K:
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
    return kernels().vec_dot_of(w);
}

// ---- dequantization ---------------------------------------------------------

// Only GetRows (one embedding row per token) dequantizes on the CPU path, so
// the tensor stage's reference dequantizer (ggml's arithmetic) serves as is.
void dequant_row(DType type, const void* vx, float* y, int64_t n) {
    tensor::dequantize_row(type, vx, y, n);
}

}  // namespace minfer::cpu
