#include "backend/cpu/x86/gemm_avx512.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/gemm_layout.h"
#include "backend/cpu/isa.h"
#include "tensor/blocks.h"
#include "tensor/interleave.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/interleaved_simd.h"
#include "backend/cpu/x86/intrinsics.h"
#define MINFER_GEMM_AVX512 1
#endif

namespace minfer::cpu::avx512 {

using namespace tensor;

namespace {

using gemm_layout::kGroup;  // elements per scale in the common form
#ifndef MINFER_GEMM_R
#define MINFER_GEMM_R 2
#endif
#ifndef MINFER_GEMM_T
#define MINFER_GEMM_T 6
#endif
// The micro-tile: kMR weight rows x kMT tokens of float accumulators. The
// kMR * kMT accumulators, the kMR weight vectors and a broadcast activation
// must stay in the 32 zmm registers, or the inner loop spills; 2 x 6 leaves
// room for them. MINFER_GEMM_R / MINFER_GEMM_T (compile definitions) change
// the tile to measure another one (bench/bench_kernels).
constexpr int kMR = MINFER_GEMM_R, kMT = MINFER_GEMM_T;

#ifdef MINFER_GEMM_AVX512
using gemm_layout::has_mins;
using gemm_layout::is_k_quant;
using gemm_layout::rows_form;
using gemm_layout::RowsForm;

// ---- unpackers: one weight row -> int8 values, scale per 16, min per 16 ----
// Compiled for the GEMM's target so the byte loops vectorize; the Q5_0
// one is written with intrinsics (its bit gather does not).

MINFER_TARGET_AVX512_VNNI inline void unpack_q5_0_block(const block_q5_0& b, int8_t* v) {
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

#define MINFER_UNPACK_TARGET MINFER_TARGET_AVX512_VNNI
#include "backend/cpu/gemm_unpack.h"

MINFER_TARGET_AVX512_VNNI void unpack_row(DType t, const uint8_t* row, int64_t K, int8_t* v,
                                          float* s, float* m) {
    if (t == DType::Q5_0) {  // the bit gather does not vectorize: intrinsics
        const auto* x = reinterpret_cast<const block_q5_0*>(row);
        for (int64_t b = 0; b < K / 32; ++b) {
            unpack_q5_0_block(x[b], v + 32 * b);
            s[2 * b] = s[2 * b + 1] = fp16_to_fp32(x[b].d);
        }
        return;
    }
    unpack_row_portable(t, row, K, v, s, m);
}

// One panel: 16 weight rows (the 16 int32 lanes of a vector) in the form
// the micro-kernel reads. Values are interleaved by 4 (quad q of row l at
// v[(q * 16 + l) * 4]), so one 64-byte load gives 4 values of every row and
// one vpdpbusd against 4 activation bytes broadcast to all lanes adds their
// products into each row's own lane: no horizontal sums, and a group's
// integer sum per row is finished before any float work.
// vpdpbusd multiplies unsigned bytes by signed ones. The K-quants' values
// are unsigned (Q4_K 0..15, Q5_K 0..31, Q6_K 0..63: its -32 is taken out
// of the sum through the activations' sums), so they are the unsigned
// operand and the activations (Q8_K) stay signed. Q8_0 / Q4_0 / Q5_0
// values are signed: the activations (Q8_0) are taken unsigned, as q + 128,
// and each group's sum starts at a correction that takes the 128 back out.
struct Panel {
    int8_t* v;   // [K/4][16][4]
    float* s;    // [K/G][16] scale of each group of G elements
    int32_t* c;  // [K/G][16] (Q8_0 activations) -128 * the sum of the group's values
    int32_t* o;  // (Q4_K, Q5_K) per super-block: gemm_layout::min_block
};

using gemm_layout::kMinPairs;
static_assert(kMinPairs + 1 <= QK_K / 32, "a super-block's mins fit panel_bytes' o");
inline int32_t* min_block(const Panel& p, int64_t sb) {
    return gemm_layout::min_block(p.o, sb, 16);
}

size_t panel_bytes(int64_t K, int64_t G) {
    return static_cast<size_t>(16 * K) + 16 * static_cast<size_t>(K / G) * 8 +
           16 * static_cast<size_t>(K / 32) * 4;
}

Panel panel_at(void* p, int64_t K, int64_t G) {
    auto* b = static_cast<uint8_t*>(p);
    Panel f;
    f.v = reinterpret_cast<int8_t*>(b);
    f.s = reinterpret_cast<float*>(b + 16 * K);
    f.c = reinterpret_cast<int32_t*>(f.s + 16 * (K / G));
    f.o = f.c + 16 * (K / G);
    return f;
}

// Transposes 16 x 16 32-bit elements in place (r[i] lane j <-> r[j] lane i).
MINFER_TARGET_AVX512_VNNI inline void transpose16x16(__m512i r[16]) {
    __m512 a[16], b[16];
    for (int i = 0; i < 16; ++i) a[i] = _mm512_castsi512_ps(r[i]);
    for (int i = 0; i < 16; i += 2) {  // pairs of rows interleaved by element
        b[i] = _mm512_unpacklo_ps(a[i], a[i + 1]);
        b[i + 1] = _mm512_unpackhi_ps(a[i], a[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {  // then by pairs of elements
        a[i] = _mm512_shuffle_ps(b[i], b[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        a[i + 1] = _mm512_shuffle_ps(b[i], b[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        a[i + 2] = _mm512_shuffle_ps(b[i + 1], b[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        a[i + 3] = _mm512_shuffle_ps(b[i + 1], b[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int h = 0; h < 16; h += 8)  // then 128-bit lanes, twice
        for (int i = 0; i < 4; ++i) {
            b[h + i] = _mm512_shuffle_f32x4(a[h + i], a[h + i + 4], 0x88);
            b[h + i + 4] = _mm512_shuffle_f32x4(a[h + i], a[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; ++i) {
        a[i] = _mm512_shuffle_f32x4(b[i], b[i + 8], 0x88);
        a[i + 8] = _mm512_shuffle_f32x4(b[i], b[i + 8], 0xdd);
    }
    for (int i = 0; i < 16; ++i) r[i] = _mm512_castps_si512(a[i]);
}

// Per group of a filled panel: -128 * the sum of its values (4 bytes per
// lane summed by vpdpbusd against ones).
MINFER_TARGET_AVX512_VNNI void fill_corrections(const Panel& p, int64_t K, int64_t G) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int64_t g = 0; g < K / G; ++g) {
        __m512i sum = _mm512_setzero_si512();
        for (int64_t q = g * G / 4; q < (g + 1) * G / 4; ++q)
            sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(p.v + q * 64));
        _mm512_storeu_si512(p.c + 16 * g,
                            _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
    }
}

// A whole interleaved group of Q4_K or Q6_K rows straight into a panel: the
// group's quant vectors already hold one quad of every row per lane, so
// each is only unpacked (as the decode kernels of quant_dot.cpp do), and
// the scales come out 16 rows at a time. Fills v, s and (Q4_K) o.
MINFER_TARGET_AVX512_VNNI void fill_panel_group(DType t, const uint8_t* group, int64_t K,
                                                const Panel& p) {
    if (t == DType::Q4_K) {
        const __m512i m4 = _mm512_set1_epi8(0xF);
        for (int64_t sb = 0; sb < K / QK_K; ++sb) {
            const uint8_t* blk = group + sb * 16 * sizeof(block_q4_K);
            __m512i sc[2], mn[2];
            interleaved::q4_K_scales_mins(blk, sc, mn);
            const __m512 d = interleaved::halves16(blk);
            const __m512 dmin = interleaved::halves16(blk + 32);
            for (int j = 0; j < 8; ++j)
                _mm512_storeu_ps(p.s + 16 * (8 * sb + j),
                                 _mm512_mul_ps(d, _mm512_cvtepi32_ps(interleaved::byte_of(sc, j))));
            int32_t* mb = min_block(p, sb);
            for (int k = 0; k < kMinPairs; ++k)
                _mm512_storeu_si512(
                    mb + 16 * k,
                    _mm512_or_si512(interleaved::byte_of(mn, 2 * k),
                                    _mm512_slli_epi32(interleaved::byte_of(mn, 2 * k + 1), 16)));
            _mm512_storeu_ps(mb + 16 * kMinPairs, _mm512_xor_ps(dmin, _mm512_set1_ps(-0.0f)));
            int8_t* v = p.v + sb * QK_K * 16;
            for (int c = 0; c < 4; ++c)
                for (int k = 0; k < 8; ++k) {
                    const __m512i q = _mm512_loadu_si512(blk + 256 + 64 * (8 * c + k));
                    _mm512_storeu_si512(v + 64 * (16 * c + k), _mm512_and_si512(q, m4));
                    _mm512_storeu_si512(v + 64 * (16 * c + 8 + k),
                                        _mm512_and_si512(_mm512_srli_epi16(q, 4), m4));
                }
        }
        return;
    }
    MINFER_ASSERT(t == DType::Q6_K);
    for (int64_t sb = 0; sb < K / QK_K; ++sb) {
        const uint8_t* blk = group + sb * 16 * sizeof(block_q6_K);
        int8_t* v = p.v + sb * QK_K * 16;
        for (int h = 0; h < 2; ++h)
            for (int k = 0; k < 8; ++k) {
                __m512i q[4];
                interleaved::q6_K_quads(blk + 192 * (8 * h + k), q);
                for (int u = 0; u < 4; ++u)  // elements 128h + 32u + 4k: quad 32h + 8u + k
                    _mm512_storeu_si512(v + 64 * (32 * h + 8 * u + k), q[u]);
            }
        const __m512 d = interleaved::halves16(blk + 3328);
        for (int g = 0; g < 16; ++g)
            _mm512_storeu_ps(
                p.s + 16 * (16 * sb + g),
                _mm512_mul_ps(d, _mm512_cvtepi32_ps(interleaved::q6_K_scale(blk + 3072, g))));
    }
}

// The same for whole interleaved groups of Q8_0 (quants stored ^ 0x80) and
// Q5_0 (5th bits picked per byte by vpshufbitqmb, as group_dot_q5_0).
MINFER_TARGET_AVX512_BITALG void fill_panel_group32(DType t, const uint8_t* group, int64_t K,
                                                    const Panel& p) {
    for (int64_t b = 0; b < K / 32; ++b) {
        int8_t* v = p.v + b * 32 * 16;
        if (t == DType::Q8_0) {
            const uint8_t* blk = group + b * 16 * sizeof(block_q8_0);
            _mm512_storeu_ps(p.s + 16 * b, interleaved::halves16(blk));
            for (int q = 0; q < 8; ++q)
                _mm512_storeu_si512(v + 64 * q,
                                    _mm512_xor_si512(_mm512_loadu_si512(blk + 32 + 64 * q),
                                                     _mm512_set1_epi8(static_cast<char>(0x80))));
            continue;
        }
        const uint8_t* blk = group + b * 16 * sizeof(block_q5_0);
        _mm512_storeu_ps(p.s + 16 * b, interleaved::halves16(blk));
        const __m512i qh = _mm512_loadu_si512(blk + 32), b16 = _mm512_set1_epi8(0x10);
        for (int i = 0; i < 4; ++i) {
            __m512i l, h;
            interleaved::q5_0_quads(_mm512_loadu_si512(blk + 96 + 64 * i), qh, i, l, h);
            // elements 4i.. (quad i) and 16 + 4i.. (quad 4 + i), as signed q5 - 16
            _mm512_storeu_si512(v + 64 * i, _mm512_sub_epi8(l, b16));
            _mm512_storeu_si512(v + 64 * (4 + i), _mm512_sub_epi8(h, b16));
        }
    }
}

bool has_bitalg() {
    return cpu_has_avx512_bitalg();
}

// Rows [r0, r1) (at most 16) of w into a panel; lanes past r1 - r0 are
// zero. rows is scratch for 16 rows in the common form of unpack_row.
// An interleaved w has each row taken out to `gguf_row` first.
MINFER_TARGET_AVX512_VNNI void fill_panel(DType t, bool interleaved, const uint8_t* w,
                                          size_t w_row_bytes, int64_t K, int64_t G, int64_t r0,
                                          int64_t r1, const Panel& p, const RowsForm& rows,
                                          uint8_t* gguf_row) {
    const int64_t ng = K / G, n = r1 - r0;
    const bool kquant = is_k_quant(t);
    if (interleaved && n == kInterleaveRows && r0 % kInterleaveRows == 0) {
        const uint8_t* group = w + static_cast<size_t>(r0) * w_row_bytes;
        if (t == DType::Q4_K || t == DType::Q6_K) {
            fill_panel_group(t, group, K, p);
            return;
        }
        if (t == DType::Q8_0 || (t == DType::Q5_0 && has_bitalg())) {
            fill_panel_group32(t, group, K, p);
            fill_corrections(p, K, G);
            return;
        }
    }
    if (has_mins(t)) std::memset(p.o, 0, static_cast<size_t>(K / QK_K) * (kMinPairs + 1) * 64);
    for (int64_t l = 0; l < n; ++l) {
        const uint8_t* src = w + static_cast<size_t>(r0 + l) * w_row_bytes;
        if (interleaved) {
            deinterleave_row(t, w, K, r0 + l, gguf_row);
            src = gguf_row;
        }
        unpack_row(t, src, K, rows.v + l * K, rows.s + l * (K / kGroup), rows.m + l * (K / kGroup));
        if (has_mins(t)) k4_row_mins(t, src, K, l, 16, p.o);
    }
    // Values: 16 quads of each row at a time, transposed into 16 vectors of
    // one quad of every row. Q6_K's common form is q - 32: the panel takes
    // q (see Panel).
    const __m512i offset = _mm512_set1_epi8(t == DType::Q6_K ? 32 : 0);
    for (int64_t q0 = 0; q0 < K / 4; q0 += 16) {
        __m512i r[16];
        for (int l = 0; l < 16; ++l)
            r[l] = l < n ? _mm512_loadu_si512(rows.v + l * K + 4 * q0) : _mm512_setzero_si512();
        transpose16x16(r);
        for (int i = 0; i < 16; ++i)
            _mm512_storeu_si512(p.v + (q0 + i) * 64, _mm512_add_epi8(r[i], offset));
    }
    if (!kquant) fill_corrections(p, K, G);
    for (int64_t g = 0; g < ng; ++g)
        for (int64_t l = 0; l < 16; ++l)
            p.s[g * 16 + l] = l < n ? rows.s[l * (K / kGroup) + g * G / kGroup] : 0.0f;
}

// Tokens t .. t+T-1 of the GEMM-form activations (gemm.h): each row's
// bytes, then its scales, its int16 sums per 32 and its int32 -32 * sums
// per 16 (Q8_K).
template <int T>
struct ActRows {
    const uint8_t* q[T];
    const float* d[T];
    const int16_t* sum32[T];
    const int32_t* off16[T];
    size_t next;  // bytes from a row to the same row of the next T tokens
    ActRows(const uint8_t* act, size_t act_stride, int64_t t, int64_t K) : next(T * act_stride) {
        for (int j = 0; j < T; ++j) {
            q[j] = act + static_cast<size_t>(t + j) * act_stride;
            d[j] = reinterpret_cast<const float*>(q[j] + K);
            sum32[j] = reinterpret_cast<const int16_t*>(d[j] + K / kGroup);
            off16[j] = reinterpret_cast<const int32_t*>(sum32[j] + K / 32);
        }
    }
};

// How a group's integer sum starts: at the panel's correction (Q8_0
// activations taken as q + 128), at zero (Q4_K, Q5_K: unsigned values,
// signed activations) or at the token's -32 * its activations' sum (Q6_K:
// q * a summed for (q - 32) * a).
enum class SumStart { Correction, Zero, Offset };

// The integer sums of group g (G elements) for R panels x T tokens: G/4
// vpdpbusd of an activation quad broadcast to every lane against one
// weight quad per row, the unsigned operand being the activations
// (Correction) or the weights (the K-quants).
// Each cache line of the T rows' bytes is also asked for in the next T
// tokens' rows, which the next call reads: T streams a whole row apart are
// more than the hardware prefetchers keep up with. (A prefetch past the
// last token's row does not fault.)
template <int R, int T, int G, SumStart kStart>
MINFER_TARGET_AVX512_VNNI inline void group_sums(const Panel* p, int64_t g, const ActRows<T>& a,
                                                 __m512i isum[R][T]) {
    if ((g * G) % 64 == 0)
        for (int j = 0; j < T; ++j)
            _mm_prefetch(reinterpret_cast<const char*>(a.q[j] + a.next + g * G), _MM_HINT_T0);
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) {
            if constexpr (kStart == SumStart::Correction)
                isum[i][j] = _mm512_loadu_si512(p[i].c + 16 * g);
            else if constexpr (kStart == SumStart::Offset)
                isum[i][j] = _mm512_set1_epi32(a.off16[j][g]);
            else
                isum[i][j] = _mm512_setzero_si512();
        }
    for (int q = 0; q < G / 4; ++q) {
        __m512i w[R];
        for (int i = 0; i < R; ++i) w[i] = _mm512_loadu_si512(p[i].v + (g * G / 4 + q) * 64);
        for (int j = 0; j < T; ++j) {
            int32_t a4;
            std::memcpy(&a4, a.q[j] + g * G + 4 * q, 4);
            const __m512i x = _mm512_set1_epi32(a4);
            for (int i = 0; i < R; ++i)
                isum[i][j] = kStart == SumStart::Correction
                                 ? _mm512_dpbusd_epi32(isum[i][j], x, w[i])
                                 : _mm512_dpbusd_epi32(isum[i][j], w[i], x);
        }
    }
}

// R panels x T tokens over K (Q8_0 activations: weights in groups of 32).
// Per group of G elements: vpdpbusd of G/4
// activation quads into an integer sum per (row, token) started at the
// panel's correction, then one conversion, the weight scale and the
// activation scale into the float accumulator (ggml's per-block float step,
// here for 16 rows at once).
template <int R, int T>
MINFER_TARGET_AVX512_VNNI void micro(const Panel* p, int64_t K, const uint8_t* act,
                                     size_t act_stride, int64_t t, float* out, int64_t out_stride,
                                     __mmask16 last_lanes) {
    const ActRows<T> a(act, act_stride, t, K);
    constexpr int64_t G = 32;
    __m512 acc[R][T];
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) acc[i][j] = _mm512_setzero_ps();
    for (int64_t g = 0; g < K / G; ++g) {
        __m512i isum[R][T];
        group_sums<R, T, G, SumStart::Correction>(p, g, a, isum);
        for (int i = 0; i < R; ++i) {
            const __m512 s = _mm512_loadu_ps(p[i].s + 16 * g);
            for (int j = 0; j < T; ++j)
                acc[i][j] = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(isum[i][j]), s),
                                            _mm512_set1_ps(a.d[j][g * G / kGroup]), acc[i][j]);
        }
    }
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < T; ++j) {
            float* o = out + (t + j) * out_stride + 16 * i;
            if (i == R - 1)
                _mm512_mask_storeu_ps(o, last_lanes, acc[i][j]);
            else
                _mm512_storeu_ps(o, acc[i][j]);
        }
}

// The same for Q8_K activations (K-quant weights), whose scale is one per
// 256: a super-block's groups gather cvt(sum) * weight scale in a float
// block sum; with mins (G = 32: Q4_K, Q5_K), the mins times the
// activations' sums per 32, summed in integers by vpdpwssd, times -dmin
// are added once; the block sum takes the activation scale once and is
// added into out. Per row the float steps of quant_dot.cpp's
// k4_superblock_gemm_steps (and of the Q6_K dot), in the same order.
template <int R, int T, int G>
MINFER_TARGET_AVX512_VNNI void micro_k(const Panel* p, int64_t K, const uint8_t* act,
                                       size_t act_stride, int64_t t, float* out, int64_t out_stride,
                                       __mmask16 last_lanes) {
    const ActRows<T> a(act, act_stride, t, K);
    constexpr bool kMins = G == 32;        // else Q6_K, whose -32 the sums start with
    constexpr int64_t kGroups = QK_K / G;  // per super-block
    alignas(64) float part[R][T][16];
    for (int64_t sb = 0; sb < K / QK_K; ++sb) {
        __m512 blk[R][T];
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < T; ++j) blk[i][j] = _mm512_setzero_ps();
        for (int64_t g = sb * kGroups; g < (sb + 1) * kGroups; ++g) {
            __m512i isum[R][T];
            group_sums<R, T, G, kMins ? SumStart::Zero : SumStart::Offset>(p, g, a, isum);
            for (int i = 0; i < R; ++i) {
                const __m512 s = _mm512_loadu_ps(p[i].s + 16 * g);
                for (int j = 0; j < T; ++j)
                    blk[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[i][j]), s, blk[i][j]);
            }
        }
        if constexpr (kMins) {
            for (int i = 0; i < R; ++i) {
                const int32_t* mb = min_block(p[i], sb);
                __m512i pairs[kMinPairs];
                for (int k = 0; k < kMinPairs; ++k) pairs[k] = _mm512_loadu_si512(mb + 16 * k);
                const __m512 neg_dmin = _mm512_loadu_ps(mb + 16 * kMinPairs);
                for (int j = 0; j < T; ++j) {
                    __m512i m = _mm512_setzero_si512();
                    for (int k = 0; k < kMinPairs; ++k) {
                        int32_t s2;  // the activations' sums of groups 2k, 2k + 1
                        std::memcpy(&s2, a.sum32[j] + 8 * sb + 2 * k, 4);
                        m = _mm512_dpwssd_epi32(m, pairs[k], _mm512_set1_epi32(s2));
                    }
                    blk[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(m), neg_dmin, blk[i][j]);
                }
            }
        }
        // The running sums stay in `part` until the last super-block: out's
        // rows are often a multiple of 4 KiB apart, and a load of one row's
        // sum right after the store of another's (the same address bits
        // 0-11) waits on that store as if it were the same address.
        for (int i = 0; i < R; ++i)
            for (int j = 0; j < T; ++j) {
                const __m512 da = _mm512_set1_ps(a.d[j][sb * (QK_K / kGroup)]);
                const __m512 prev = sb == 0 ? _mm512_setzero_ps() : _mm512_load_ps(part[i][j]);
                const __m512 sum = _mm512_fmadd_ps(blk[i][j], da, prev);
                if (sb + 1 < K / QK_K)
                    _mm512_store_ps(part[i][j], sum);
                else
                    _mm512_mask_storeu_ps(out + (t + j) * out_stride + 16 * i,
                                          i == R - 1 ? last_lanes : __mmask16(0xFFFF), sum);
            }
    }
}

using MicroFn = void (*)(const Panel*, int64_t, const uint8_t*, size_t, int64_t, float*, int64_t,
                         __mmask16);

// Tables of micro-kernels for 1..kMR panels x 1..kMT tokens.
template <int R, int... Ts>
constexpr std::array<MicroFn, kMT> row_of(std::integer_sequence<int, Ts...>) {
    return {&micro<R, Ts + 1>...};
}
template <int... Rs>
constexpr std::array<std::array<MicroFn, kMT>, kMR> table_of(std::integer_sequence<int, Rs...>) {
    return {row_of<Rs + 1>(std::make_integer_sequence<int, kMT>{})...};
}
constexpr auto kMicro = table_of(std::make_integer_sequence<int, kMR>{});

template <int G, int R, int... Ts>
constexpr std::array<MicroFn, kMT> krow_of(std::integer_sequence<int, Ts...>) {
    return {&micro_k<R, Ts + 1, G>...};
}
template <int G, int... Rs>
constexpr std::array<std::array<MicroFn, kMT>, kMR> ktable_of(std::integer_sequence<int, Rs...>) {
    return {krow_of<G, Rs + 1>(std::make_integer_sequence<int, kMT>{})...};
}
template <int G>
constexpr auto kMicroK = ktable_of<G>(std::make_integer_sequence<int, kMR>{});
#endif

}  // namespace

int64_t gemm_tile_rows() {
    return 16 * kMR;
}

size_t gemm_scratch_bytes(int64_t K) {
#ifdef MINFER_GEMM_AVX512
    // kMR panels (at the smaller group, the larger size), 16 rows in the
    // common form and one GGUF row (< 2 bytes per element for the types here)
    return static_cast<size_t>(kMR) * panel_bytes(K, 16) +
           16 * (static_cast<size_t>(K) + 2 * sizeof(float) * static_cast<size_t>(K / kGroup)) +
           2 * static_cast<size_t>(K);
#else
    (void)K;  // no AVX-512 on this architecture
    return 0;
#endif
}

void gemm_rows(DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes, int64_t K,
               int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride, int64_t n_tokens,
               float* out, int64_t out_stride, void* scratch) {
#ifdef MINFER_GEMM_AVX512
    const int64_t n = r1 - r0;
    MINFER_ASSERT(n >= 1 && n <= 16 * kMR);
    const int64_t G = wtype == DType::Q6_K ? 16 : 32;
    const int R = static_cast<int>((n + 15) / 16);
    Panel p[kMR];
    auto* base = static_cast<uint8_t*>(scratch);
    for (int i = 0; i < kMR; ++i) p[i] = panel_at(base + i * panel_bytes(K, 16), K, G);
    RowsForm rows = rows_form(base + kMR * panel_bytes(K, 16), K, 16);
    auto* gguf_row = reinterpret_cast<uint8_t*>(rows.m + 16 * (K / kGroup));
    MINFER_ASSERT(w_row_bytes <= static_cast<size_t>(2 * K));
    for (int i = 0; i < R; ++i)
        fill_panel(wtype, interleaved, w, w_row_bytes, K, G, r0 + 16 * i,
                   std::min(r1, r0 + 16 * i + 16), p[i], rows, gguf_row);
    const int last = static_cast<int>(n - 16 * (R - 1));
    const auto lanes = static_cast<__mmask16>((1u << last) - 1u);
    const auto& tab = !is_k_quant(wtype) ? kMicro : G == 16 ? kMicroK<16> : kMicroK<32>;
    for (int64_t t = 0; t < n_tokens; t += kMT) {
        const int T = static_cast<int>(std::min<int64_t>(kMT, n_tokens - t));
        tab[R - 1][T - 1](p, K, act, act_stride, t, out, out_stride, lanes);
    }
#else
    (void)wtype, (void)interleaved, (void)w, (void)w_row_bytes, (void)K, (void)r0, (void)r1,
        (void)act, (void)act_stride, (void)n_tokens, (void)out, (void)out_stride, (void)scratch;
    MINFER_ASSERT_MSG(false, "the AVX-512 GEMM on an architecture without it");
#endif
}

}  // namespace minfer::cpu::avx512
