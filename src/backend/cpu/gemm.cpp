#include "backend/cpu/gemm.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "tensor/blocks.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12 warns inside its own AVX-512 headers (the _mm512_undefined_*
// placeholders of permutes and conversions) once they are inlined here.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define MINFER_GEMM_X86 1
#endif

namespace minfer::cpu {

using namespace tensor;

namespace {

constexpr int64_t kGroup = 16;  // elements per scale in the common form
#ifndef MINFER_GEMM_R
#define MINFER_GEMM_R 2
#endif
#ifndef MINFER_GEMM_T
#define MINFER_GEMM_T 8
#endif
// The micro-tile: kMR weight rows x kMT tokens of float accumulators. 2 x 8
// measured best on Zen 4 (bench: 95 GOP/s for 4 x 4, ~120 for 2 x 8 and
// 4 x 6, one core, K = 896): 16 accumulators leave room for the operands.
constexpr int kMR = MINFER_GEMM_R, kMT = MINFER_GEMM_T;

struct RowsForm {  // n rows of K in the common form, inside one scratch buffer
    int8_t* v;     // [n][K]
    float* s;      // [n][K/16]  scale of each group of 16
    float* m;      // [n][K/16]  -dmin * min of each group (K-quants with mins), else unused
};

RowsForm rows_form(void* scratch, int64_t K, int64_t n) {
    auto* p = static_cast<uint8_t*>(scratch);
    RowsForm f;
    f.v = reinterpret_cast<int8_t*>(p);
    f.s = reinterpret_cast<float*>(p + n * K);
    f.m = f.s + n * (K / kGroup);
    return f;
}

bool is_k_quant(DType t) {
    return t == DType::Q4_K || t == DType::Q5_K || t == DType::Q6_K;
}

bool has_mins(DType t) {
    return t == DType::Q4_K || t == DType::Q5_K;
}

#ifdef MINFER_GEMM_X86
#define MINFER_VNNI \
    __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")))
#else
#define MINFER_VNNI
#endif

// ---- unpackers: one weight row -> int8 values, scale per 16, min per 16 ----
// Compiled for the GEMM's target so the byte loops vectorize; the Q5_0
// one is written with intrinsics (its bit gather does not).

#ifdef MINFER_GEMM_X86
MINFER_VNNI inline void unpack_q5_0_block(const block_q5_0& b, int8_t* v) {
    const __m128i t = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(t), _mm_srli_epi16(t, 4), 1);
    q = _mm256_and_si256(q, _mm256_set1_epi8(0xF));
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    // Bit i of qh is the 5th bit of element i: as a mask register, directly.
    const __m256i hi = _mm256_maskz_mov_epi8(static_cast<__mmask32>(qh), _mm256_set1_epi8(0x10));
    q = _mm256_sub_epi8(_mm256_or_si256(q, hi), _mm256_set1_epi8(16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(v), q);
}
#endif

MINFER_VNNI void unpack_row(DType t, const uint8_t* row, int64_t K, int8_t* v, float* s, float* m) {
    switch (t) {
        case DType::Q8_0: {
            const auto* x = reinterpret_cast<const block_q8_0*>(row);
            for (int64_t b = 0; b < K / 32; ++b) {
                std::memcpy(v + 32 * b, x[b].qs, 32);
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q4_0: {
            const auto* x = reinterpret_cast<const block_q4_0*>(row);
            for (int64_t b = 0; b < K / 32; ++b) {
                for (int j = 0; j < 16; ++j) {
                    v[32 * b + j] = static_cast<int8_t>((x[b].qs[j] & 0xF) - 8);
                    v[32 * b + j + 16] = static_cast<int8_t>((x[b].qs[j] >> 4) - 8);
                }
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q5_0: {
            const auto* x = reinterpret_cast<const block_q5_0*>(row);
#ifdef MINFER_GEMM_X86
            for (int64_t b = 0; b < K / 32; ++b) {
                unpack_q5_0_block(x[b], v + 32 * b);
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
#endif
            for (int64_t b = 0; b < K / 32; ++b) {
                uint32_t qh;
                std::memcpy(&qh, x[b].qh, 4);
                for (int j = 0; j < 16; ++j) {
                    const int h0 = static_cast<int>(((qh >> j) << 4) & 0x10);
                    const int h1 = static_cast<int>((qh >> (j + 12)) & 0x10);
                    v[32 * b + j] = static_cast<int8_t>(((x[b].qs[j] & 0xF) | h0) - 16);
                    v[32 * b + j + 16] = static_cast<int8_t>(((x[b].qs[j] >> 4) | h1) - 16);
                }
                s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
            }
            return;
        }
        case DType::Q4_K:
        case DType::Q5_K: {
            const bool q5 = t == DType::Q5_K;
            const size_t bsz = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
            for (int64_t b = 0; b < K / QK_K; ++b) {
                const uint8_t* blk = row + static_cast<size_t>(b) * bsz;
                f16_t hd, hm;
                std::memcpy(&hd, blk, 2);
                std::memcpy(&hm, blk + 2, 2);
                const uint8_t* sc = blk + 4;
                const uint8_t* qh = q5 ? blk + 4 + K_SCALE_SIZE : nullptr;
                const uint8_t* qs = blk + 4 + K_SCALE_SIZE + (q5 ? QK_K / 8 : 0);
                const float d = fp16_to_fp32(hd), dmin = fp16_to_fp32(hm);
                int8_t* vb = v + QK_K * b;
                for (int j = 0; j < 4 && !q5; ++j) {
                    const uint8_t* q = qs + 32 * j;
                    for (int l = 0; l < 32; ++l) {
                        vb[64 * j + l] = static_cast<int8_t>(q[l] & 0xF);
                        vb[64 * j + 32 + l] = static_cast<int8_t>(q[l] >> 4);
                    }
                }
                for (int j = 0; j < 4 && q5; ++j) {
                    const uint8_t* q = qs + 32 * j;
                    const uint8_t m1 = static_cast<uint8_t>(1u << (2 * j)),
                                  m2 = static_cast<uint8_t>(2u << (2 * j));
                    for (int l = 0; l < 32; ++l) {
                        int lo = q[l] & 0xF, hi = q[l] >> 4;
                        if (q5) {
                            lo += (qh[l] & m1) ? 16 : 0;
                            hi += (qh[l] & m2) ? 16 : 0;
                        }
                        vb[64 * j + l] = static_cast<int8_t>(lo);
                        vb[64 * j + 32 + l] = static_cast<int8_t>(hi);
                    }
                }
                for (int j = 0; j < 8; ++j) {
                    uint8_t scj, mj;
                    if (j < 4) {
                        scj = sc[j] & 63;
                        mj = sc[j + 4] & 63;
                    } else {
                        scj = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((sc[j - 4] >> 6) << 4));
                        mj = static_cast<uint8_t>((sc[j + 4] >> 4) | ((sc[j] >> 6) << 4));
                    }
                    const int64_t g = 16 * b + 2 * j;
                    s[g] = s[g + 1] = d * static_cast<float>(scj);
                    m[g] = m[g + 1] = -dmin * static_cast<float>(mj);
                }
            }
            return;
        }
        case DType::Q6_K: {
            const auto* x = reinterpret_cast<const block_q6_K*>(row);
            for (int64_t b = 0; b < K / QK_K; ++b) {
                int8_t* a = v + QK_K * b;
                const uint8_t* ql = x[b].ql;
                const uint8_t* qh = x[b].qh;
                for (int half = 0; half < 2; ++half) {
                    for (int l = 0; l < 32; ++l) {
                        a[l] =
                            static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                        a[l + 32] = static_cast<int8_t>(
                            ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                        a[l + 64] =
                            static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                        a[l + 96] = static_cast<int8_t>(
                            ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                    }
                    a += 128;
                    ql += 64;
                    qh += 32;
                }
                const float d = fp16_to_fp32(x[b].d);
                for (int g = 0; g < 16; ++g) s[16 * b + g] = d * static_cast<float>(x[b].scales[g]);
            }
            return;
        }
        default:
            MINFER_ASSERT_MSG(false, "gemm: no unpacker for this type");
    }
}

#ifdef MINFER_GEMM_X86
bool has_vnni() {
    static const bool yes =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vnni");
    return yes;
}

// R weight rows x T tokens over K: 64 elements per step. vpdpbusd takes
// the activations unsigned (q ^ 0x80 = q + 128) and the weights signed; the
// accumulator starts at -128 * (sum of the 4 weights of the lane), so each
// lane ends with the exact signed sum of 4 products. Lane groups of 4 share
// one 16-element group: cvt, times the weight and activation scales, FMA
// into float accumulators (ggml's per-block float step).
template <int R, int T>
MINFER_VNNI void micro(const RowsForm& wf, int64_t r, int64_t K, const uint8_t* act,
                       size_t act_stride, int64_t t, float* out, int64_t out_stride) {
    const int64_t ng = K / kGroup;
    const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[R][T];
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
    const int8_t* wv[R];
    const float* ws[R];
    for (int i = 0; i < R; ++i) {
        wv[i] = wf.v + (r + i) * K;
        ws[i] = wf.s + (r + i) * ng;
    }
    const uint8_t* av[T];
    const float* ad[T];
    for (int j = 0; j < T; ++j) {
        av[j] = act + static_cast<size_t>(t + j) * act_stride;
        ad[j] = reinterpret_cast<const float*>(av[j] + K);
    }
    for (int64_t k = 0; k < K; k += 64) {
        const int64_t g = k / kGroup;
        __m512i w[R], init[R];
        __m512 dw[R];
        for (int i = 0; i < R; ++i) {
            w[i] = _mm512_loadu_si512(wv[i] + k);
            init[i] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                       _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, w[i]));
            dw[i] = _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_loadu_ps(ws[i] + g)));
        }
        for (int j = 0; j < T; ++j) {
            const __m512i a = _mm512_loadu_si512(av[j] + k);
            const __m512 da =
                _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_loadu_ps(ad[j] + g)));
            for (int i = 0; i < R; ++i) {
                const __m512i isum = _mm512_dpbusd_epi32(init[i], a, w[i]);
                acc[i][j] =
                    _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw[i], da), acc[i][j]);
            }
        }
    }
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j)
            out[(t + j) * out_stride + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

// The same for Q8_K activations (K-quant weights), whose scale is one per
// 256 elements: the 4 steps of a block accumulate cvt(isum) * weight scale
// in a block accumulator, which then takes the activation scale once — a
// multiply fewer per step. The mins (-dmin * min_g * d * bsum_g) are a dot
// over the K/16 groups, done after the main loop.
template <int R, int T, bool kMins>
MINFER_VNNI void micro_k(const RowsForm& wf, int64_t r, int64_t K, const uint8_t* act,
                         size_t act_stride, int64_t t, float* out, int64_t out_stride) {
    const int64_t ng = K / kGroup;
    const __m512i idx4 = _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m512i k80 = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512 acc[R][T];
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
    const int8_t* wv[R];
    const float* ws[R];
    for (int i = 0; i < R; ++i) {
        wv[i] = wf.v + (r + i) * K;
        ws[i] = wf.s + (r + i) * ng;
    }
    const uint8_t* av[T];
    const float* ad[T];
    for (int j = 0; j < T; ++j) {
        av[j] = act + static_cast<size_t>(t + j) * act_stride;
        ad[j] = reinterpret_cast<const float*>(av[j] + K);
    }
    for (int64_t kb = 0; kb < K; kb += 256) {
        __m512 blk[R][T];
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < T; ++j) blk[i][j] = _mm512_setzero_ps();
        for (int64_t k = kb; k < kb + 256; k += 64) {
            const int64_t g = k / kGroup;
            __m512i w[R], init[R];
            __m512 dw[R];
            for (int i = 0; i < R; ++i) {
                w[i] = _mm512_loadu_si512(wv[i] + k);
                init[i] = _mm512_sub_epi32(_mm512_setzero_si512(),
                                           _mm512_dpbusd_epi32(_mm512_setzero_si512(), k80, w[i]));
                dw[i] =
                    _mm512_permutexvar_ps(idx4, _mm512_zextps128_ps512(_mm_loadu_ps(ws[i] + g)));
            }
            for (int j = 0; j < T; ++j) {
                const __m512i a = _mm512_loadu_si512(av[j] + k);
                for (int i = 0; i < R; ++i)
                    blk[i][j] =
                        _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_dpbusd_epi32(init[i], a, w[i])),
                                        dw[i], blk[i][j]);
            }
        }
        for (int j = 0; j < T; ++j) {
            const __m512 da = _mm512_set1_ps(ad[j][kb / kGroup]);
            for (int i = 0; i < R; ++i) acc[i][j] = _mm512_fmadd_ps(blk[i][j], da, acc[i][j]);
        }
    }
    if constexpr (kMins) {
        for (int i = 0; i < R; ++i) {
            const float* mr = wf.m + (r + i) * ng;
            for (int j = 0; j < T; ++j) {
                const float* bs = ad[j] + ng;
                __m512 m = acc[i][j];
                for (int64_t g = 0; g < ng; g += 16)
                    m = _mm512_fmadd_ps(_mm512_loadu_ps(mr + g), _mm512_loadu_ps(bs + g), m);
                acc[i][j] = m;
            }
        }
    }
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j)
            out[(t + j) * out_stride + r + i] = _mm512_reduce_add_ps(acc[i][j]);
}

using MicroFn = void (*)(const RowsForm&, int64_t, int64_t, const uint8_t*, size_t, int64_t, float*,
                         int64_t);

template <int R, int... Ts>
constexpr std::array<MicroFn, kMT> row_of(std::integer_sequence<int, Ts...>) {
    return {&micro<R, Ts + 1>...};
}
template <int... Rs>
constexpr std::array<std::array<MicroFn, kMT>, kMR> table_of(std::integer_sequence<int, Rs...>) {
    return {row_of<Rs + 1>(std::make_integer_sequence<int, kMT>{})...};
}
constexpr auto kMicro = table_of(std::make_integer_sequence<int, kMR>{});

// Q8_K activations: 2 x 6 tiles (block accumulators double the registers;
// measured on Zen 4, Q4_K K = 4864, one core: 2x4 122, 2x6 131, 4x3 124,
// 3x4 106 GOP/s).
#ifndef MINFER_GEMM_KR
#define MINFER_GEMM_KR 2
#endif
#ifndef MINFER_GEMM_KT
#define MINFER_GEMM_KT 6
#endif
constexpr int kKR = MINFER_GEMM_KR, kKT = MINFER_GEMM_KT;
template <bool kMins, int R, int... Ts>
constexpr std::array<MicroFn, kKT> krow_of(std::integer_sequence<int, Ts...>) {
    return {&micro_k<R, Ts + 1, kMins>...};
}
template <bool kMins, int... Rs>
constexpr std::array<std::array<MicroFn, kKT>, kKR> ktable_of(std::integer_sequence<int, Rs...>) {
    return {krow_of<kMins, Rs + 1>(std::make_integer_sequence<int, kKT>{})...};
}
template <bool kMins>
constexpr std::array<std::array<MicroFn, kKT>, kKR> ktable() {
    return ktable_of<kMins>(std::make_integer_sequence<int, kKR>{});
}
constexpr auto kMicroK = ktable<false>();
constexpr auto kMicroKMins = ktable<true>();
#endif

}  // namespace

bool gemm_supported(DType t, int64_t K) {
#ifdef MINFER_GEMM_X86
    if (!has_vnni() || K % 64 != 0) return false;
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::Q5_0:
            return true;
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
            return K % QK_K == 0;
        default:
            return false;
    }
#else
    (void)t;
    (void)K;
    return false;
#endif
}

size_t gemm_act_row_bytes(DType act, int64_t K) {
    // q [K], d per 16, and for Q8_K (mins) d * bsum per 16
    const size_t groups = static_cast<size_t>(K / kGroup) * (act == DType::Q8_K ? 2 : 1);
    return static_cast<size_t>(K) + groups * sizeof(float);
}

void gemm_pack_act(DType act, const void* row, int64_t K, void* out) {
    auto* q = static_cast<uint8_t*>(out);
    auto* d = reinterpret_cast<float*>(q + K);
    float* bs = d + K / kGroup;
    if (act == DType::Q8_0) {
        const auto* x = static_cast<const block_q8_0*>(row);
        for (int64_t b = 0; b < K / 32; ++b) {
            for (int j = 0; j < 32; ++j) q[32 * b + j] = static_cast<uint8_t>(x[b].qs[j]) ^ 0x80;
            d[2 * b] = d[2 * b + 1] = fp16_to_fp32(x[b].d);
        }
    } else {
        MINFER_ASSERT(act == DType::Q8_K);
        const auto* x = static_cast<const block_q8_K*>(row);
        for (int64_t b = 0; b < K / QK_K; ++b) {
            for (int j = 0; j < QK_K; ++j)
                q[QK_K * b + j] = static_cast<uint8_t>(x[b].qs[j]) ^ 0x80;
            for (int g = 0; g < 16; ++g) {
                d[16 * b + g] = x[b].d;
                bs[16 * b + g] = x[b].d * static_cast<float>(x[b].bsums[g]);
            }
        }
    }
}

size_t gemm_scratch_bytes(int64_t K, int64_t n_rows) {
    return static_cast<size_t>(n_rows) *
           (static_cast<size_t>(K) + 2 * sizeof(float) * static_cast<size_t>(K / kGroup));
}

void gemm_rows(DType wtype, const uint8_t* w, size_t w_row_bytes, int64_t K, int64_t r0, int64_t r1,
               const uint8_t* act, size_t act_stride, int64_t n_tokens, float* out,
               int64_t out_stride, void* scratch) {
#ifdef MINFER_GEMM_X86
    const int64_t n = r1 - r0;
    RowsForm f = rows_form(scratch, K, n);
    for (int64_t i = 0; i < n; ++i)
        unpack_row(wtype, w + static_cast<size_t>(r0 + i) * w_row_bytes, K, f.v + i * K,
                   f.s + i * (K / kGroup), f.m + i * (K / kGroup));
    if (is_k_quant(wtype)) {
        const auto& tab = has_mins(wtype) ? kMicroKMins : kMicroK;
        for (int64_t t = 0; t < n_tokens; t += kKT) {
            const int T = static_cast<int>(std::min<int64_t>(kKT, n_tokens - t));
            for (int64_t r = 0; r < n; r += kKR) {
                const int R = static_cast<int>(std::min<int64_t>(kKR, n - r));
                tab[R - 1][T - 1](f, r, K, act, act_stride, t, out, out_stride);
            }
        }
        return;
    }
    const auto& tab = kMicro;
    for (int64_t t = 0; t < n_tokens; t += kMT) {
        const int T = static_cast<int>(std::min<int64_t>(kMT, n_tokens - t));
        for (int64_t r = 0; r < n; r += kMR) {
            const int R = static_cast<int>(std::min<int64_t>(kMR, n - r));
            tab[R - 1][T - 1](f, r, K, act, act_stride, t, out, out_stride);
        }
    }
#else
    (void)wtype, (void)w, (void)w_row_bytes, (void)K, (void)r0, (void)r1, (void)act,
        (void)act_stride, (void)n_tokens, (void)out, (void)out_stride, (void)scratch;
    MINFER_ASSERT_MSG(false, "gemm_rows without AVX-512 VNNI");
#endif
}

}  // namespace minfer::cpu
