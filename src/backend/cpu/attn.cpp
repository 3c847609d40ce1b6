#include "backend/cpu/attn.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cpu/isa.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define MINFER_ATTN_X86 1
#include "backend/cpu/simd_exp.h"
#include "backend/cpu/x86/transpose_avx2.h"
#endif

namespace minfer::cpu {

size_t attn_rows_scratch_floats(int64_t rows, int64_t n_kv_max, int64_t hd) {
    // q^T, scores, key counts, K and V rows as floats (the AVX-512 kernel
    // gathers them all; the AVX2 one converts a block of 32 keys at a time)
    const int64_t lanes = (rows + 15) / 16 * 16, n_kv_pad = (n_kv_max + 3) / 4 * 4;
    return static_cast<size_t>(lanes * hd + n_kv_pad * lanes + lanes +
                               2 * std::max<int64_t>(n_kv_pad, 32) * hd);
}

#ifdef MINFER_ATTN_X86
namespace {

bool has_avx512() {
    return isa_at_least(IsaLevel::Avx512);
}

// The query rows of one many-rows call, transposed for the SIMD kernels:
// qt [n_rows_pad / lanes][hd][lanes], row r = (token r / group, head r %
// group), rounded through f16 for an f16 cache (as ggml), padding rows zero;
// row_kv [n_rows_pad] each row's key count (padding rows see key 0 only: a
// finite softmax, never stored). Shared by the AVX-512 (16 lanes) and AVX2
// (8 lanes) kernels.
__attribute__((target("f16c"))) void transpose_q_rows(const AttnRows& a, int64_t lanes,
                                                      int64_t n_rows_pad, float* qt,
                                                      int32_t* row_kv) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group;
    for (int64_t r = 0; r < n_rows_pad; ++r) {
        row_kv[r] = r < rows ? a.n_kv[r / a.group] : 1;
        for (int64_t d = 0; d < hd; ++d) {
            float x = 0.0f;
            if (r < rows) {
                x = a.q[(r / a.group) * a.q_stride + (r % a.group) * hd + d];
                if (a.f16)
                    x = _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            }
            qt[((r / lanes) * hd + d) * lanes + r % lanes] = x;
        }
    }
}

MINFER_AVX512 inline __m512 load16(bool f16, const void* base, int64_t i) {
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)));
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
}

// q rounded through f16 (what ggml's f16 vec_dot sees).
MINFER_AVX512 inline __m512 round_f16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

constexpr int kMaxVecs = 16;  // head_dim <= 256

MINFER_AVX512 void attn_head_avx512(bool f16, const float* q, const void* k, const void* v,
                                    int64_t kv_row, int64_t off, int64_t n_kv, int64_t hd,
                                    float scale, float* s, float* o) {
    const int nv = static_cast<int>(hd / 16);
    __m512 qv[kMaxVecs];
    for (int i = 0; i < nv; ++i) {
        qv[i] = _mm512_loadu_ps(q + 16 * i);
        if (f16) qv[i] = round_f16(qv[i]);
    }
    // Scores, their maximum.
    __m512 mx = _mm512_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j < n_kv; ++j) {
        const int64_t base = j * kv_row + off;
        __m512 a0 = _mm512_mul_ps(qv[0], load16(f16, k, base));
        __m512 a1 = _mm512_setzero_ps();
        for (int i = 1; i < nv; i += 2) {
            a1 = _mm512_fmadd_ps(qv[i], load16(f16, k, base + 16 * i), a1);
            if (i + 1 < nv) a0 = _mm512_fmadd_ps(qv[i + 1], load16(f16, k, base + 16 * i + 16), a0);
        }
        s[j] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)) * scale;
    }
    j = 0;
    for (; j + 16 <= n_kv; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
    float m = _mm512_reduce_max_ps(mx);
    for (; j < n_kv; ++j) m = std::max(m, s[j]);
    // Softmax: exp(s - max), the sum per 16 in float, then in double.
    double sum = 0;
    const __m512 vm = _mm512_set1_ps(m);
    j = 0;
    for (; j + 16 <= n_kv; j += 16) {
        const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm));
        _mm512_storeu_ps(s + j, e);
        sum += static_cast<double>(_mm512_reduce_add_ps(e));
    }
    if (j < n_kv) {
        const __mmask16 mask = static_cast<__mmask16>((1u << (n_kv - j)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(
            mask, simd::exp_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + j), vm)));
        _mm512_mask_storeu_ps(s + j, mask, e);
        sum += static_cast<double>(_mm512_reduce_add_ps(e));
    }
    const float inv = static_cast<float>(1.0 / sum);
    // out = sum_j p_j v_j.
    __m512 acc[kMaxVecs];
    for (int i = 0; i < nv; ++i) acc[i] = _mm512_setzero_ps();
    for (j = 0; j < n_kv; ++j) {
        float p = s[j] * inv;
        if (f16) p = _cvtsh_ss(_cvtss_sh(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m512 pv = _mm512_set1_ps(p);
        const int64_t base = j * kv_row + off;
        for (int i = 0; i < nv; ++i)
            acc[i] = _mm512_fmadd_ps(pv, load16(f16, v, base + 16 * i), acc[i]);
    }
    for (int i = 0; i < nv; ++i) _mm512_storeu_ps(o + 16 * i, acc[i]);
}

// ---- many query rows at once (prompt chunks) ----
// Rows are (token, head of the group) pairs sharing one KV head; 16 rows
// sit in the lanes of a vector, so a score is a plain FMA chain over the
// head dimension (q transposed once per call, each K element broadcast)
// with no horizontal sum per (row, key), and the softmax runs on 16 rows at
// once. Scores are kept key-major: st[j][row].

constexpr int kKeysPerStep = 4;  // keys sharing one load of q^T[d]
constexpr int64_t kMaxRows = kAttnMaxRows;

// out[r] = sum_j p[j][r] * v_j for the rows of one vector block, R rows at a
// time in registers (NV vectors each).
template <int NV>
MINFER_AVX512 void attn_pv(const float* p, int64_t p_stride, int64_t rows, const int32_t* n_kv_row,
                           const float* v, int64_t v_row, float* const* out) {
    constexpr int R = NV >= 16 ? 1 : 16 / NV > 4 ? 4 : 16 / NV;
    for (int64_t r0 = 0; r0 < rows; r0 += R) {
        const int nr = static_cast<int>(std::min<int64_t>(R, rows - r0));
        int64_t n_kv = 0;
        for (int i = 0; i < nr; ++i) n_kv = std::max<int64_t>(n_kv, n_kv_row[r0 + i]);
        __m512 acc[R][NV];
        for (int i = 0; i < R; ++i)
            for (int u = 0; u < NV; ++u) acc[i][u] = _mm512_setzero_ps();
        for (int64_t j = 0; j < n_kv; ++j) {
            const float* vj = v + j * v_row;
            for (int i = 0; i < R; ++i) {
                if (i >= nr) break;
                const __m512 pj = _mm512_set1_ps(p[j * p_stride + r0 + i]);
                for (int u = 0; u < NV; ++u)
                    acc[i][u] = _mm512_fmadd_ps(pj, _mm512_loadu_ps(vj + 16 * u), acc[i][u]);
            }
        }
        for (int i = 0; i < nr; ++i)
            for (int u = 0; u < NV; ++u) _mm512_storeu_ps(out[r0 + i] + 16 * u, acc[i][u]);
    }
}

using PvFn = void (*)(const float*, int64_t, int64_t, const int32_t*, const float*, int64_t,
                      float* const*);
template <int... NVs>
constexpr std::array<PvFn, kMaxVecs> pv_table(std::integer_sequence<int, NVs...>) {
    return {&attn_pv<NVs + 1>...};
}
constexpr auto kPv = pv_table(std::make_integer_sequence<int, kMaxVecs>{});

// n rows of one contiguous run of cells (element offset `first` of the
// region bases, rows of kv_row elements) as floats: hd elements each into
// kf / vf.
MINFER_AVX512 void gather_rows(bool f16, const void* k, const void* v, int64_t first,
                               int64_t kv_row, int64_t n, int64_t hd, float* kf, float* vf) {
    for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < hd; d += 16) {
            _mm512_storeu_ps(kf + j * hd + d, load16(f16, k, first + j * kv_row + d));
            _mm512_storeu_ps(vf + j * hd + d, load16(f16, v, first + j * kv_row + d));
        }
}

MINFER_AVX512 void attn_rows_avx512(const AttnRows& a, float* scratch) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group, nrv = (rows + 15) / 16;
    int64_t n_kv_max = 0;
    for (int64_t i = 0; i < a.n_tokens; ++i) n_kv_max = std::max<int64_t>(n_kv_max, a.n_kv[i]);
    const int64_t n_kv_pad = (n_kv_max + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
    // scratch: q^T [nrv][hd][16] | scores [n_kv_pad][nrv * 16] | row n_kv [nrv * 16]
    // | K and V rows as floats [n_kv_pad][hd] each
    float* qt = scratch;
    float* st = qt + nrv * hd * 16;
    const int64_t st_stride = nrv * 16;
    auto* row_kv = reinterpret_cast<int32_t*>(st + n_kv_pad * st_stride);
    float* kf = reinterpret_cast<float*>(row_kv + st_stride);
    float* vf = kf + n_kv_pad * hd;

    transpose_q_rows(a, 16, st_stride, qt, row_kv);
    // K and V rows as floats, gathered page by page (each page a contiguous
    // run of cells; an f16 cache is converted once per call). Rows past
    // n_kv_max are zero (read only by the masked key steps).
    for_each_kv_run(a, n_kv_max, [&](int64_t j0, int64_t first, int64_t run) {
        gather_rows(a.f16, a.k, a.v, first, a.kv_row, run, hd, kf + j0 * hd, vf + j0 * hd);
    });
    for (int64_t j = n_kv_max; j < n_kv_pad; ++j)
        for (int64_t d = 0; d < hd; d += 16) {
            _mm512_storeu_ps(kf + j * hd + d, _mm512_setzero_ps());
            _mm512_storeu_ps(vf + j * hd + d, _mm512_setzero_ps());
        }
    const float* kr = kf;
    const float* vr = vf;
    const int64_t k_stride = hd;
    const __m512 vscale = _mm512_set1_ps(a.scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t rv = 0; rv < nrv; ++rv) {
        const float* q = qt + rv * hd * 16;
        const __m512i lane_kv = _mm512_loadu_si512(row_kv + rv * 16);
        // Scores, kKeysPerStep keys per pass over q^T; keys at or past a
        // row's n_kv are -inf (and never read from memory past n_kv_max).
        for (int64_t j = 0; j < n_kv_pad; j += kKeysPerStep) {
            __m512 acc[kKeysPerStep];
            const float* kj[kKeysPerStep];
            for (int u = 0; u < kKeysPerStep; ++u) {
                acc[u] = _mm512_setzero_ps();
                kj[u] = kr + std::min(j + u, n_kv_max - 1) * k_stride;
            }
            for (int64_t d = 0; d < hd; ++d) {
                const __m512 qd = _mm512_loadu_ps(q + d * 16);
                for (int u = 0; u < kKeysPerStep; ++u)
                    acc[u] = _mm512_fmadd_ps(qd, _mm512_set1_ps(kj[u][d]), acc[u]);
            }
            for (int u = 0; u < kKeysPerStep; ++u) {
                const __mmask16 live = _mm512_cmpgt_epi32_mask(
                    lane_kv, _mm512_set1_epi32(static_cast<int32_t>(j + u)));
                _mm512_storeu_ps(st + (j + u) * st_stride + rv * 16,
                                 _mm512_mask_mov_ps(ninf, live, _mm512_mul_ps(acc[u], vscale)));
            }
        }
        // Softmax down each lane: the maximum, exp(s - max) with the sum of
        // each 16 keys in float then in double (as attn_head_avx512), and
        // the probabilities (rounded to f16 for an f16 V, as ggml).
        __m512 mx = ninf;
        for (int64_t j = 0; j < n_kv_max; ++j)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + j * st_stride + rv * 16));
        __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
        for (int64_t j0 = 0; j0 < n_kv_max; j0 += 16) {
            __m512 part = _mm512_setzero_ps();
            for (int64_t j = j0; j < std::min(n_kv_max, j0 + 16); ++j) {
                float* sj = st + j * st_stride + rv * 16;
                const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(sj), mx));
                _mm512_storeu_ps(sj, e);
                part = _mm512_add_ps(part, e);
            }
            sum_lo = _mm512_add_pd(sum_lo, _mm512_cvtps_pd(_mm512_castps512_ps256(part)));
            sum_hi = _mm512_add_pd(sum_hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(part, 1)));
        }
        const __m512d one = _mm512_set1_pd(1.0);
        const __m512 inv =
            _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_cvtpd_ps(_mm512_div_pd(one, sum_lo))),
                               _mm512_cvtpd_ps(_mm512_div_pd(one, sum_hi)), 1);
        for (int64_t j = 0; j < n_kv_max; ++j) {
            float* sj = st + j * st_stride + rv * 16;
            __m512 p = _mm512_mul_ps(_mm512_loadu_ps(sj), inv);
            if (a.f16) p = round_f16(p);
            _mm512_storeu_ps(sj, p);
        }
    }
    // out = P V, rows in registers.
    float* outs[kMaxRows];
    for (int64_t r = 0; r < rows; ++r)
        outs[r] = a.out + (r / a.group) * a.out_stride + (r % a.group) * hd;
    kPv[static_cast<size_t>(hd / 16 - 1)](st, st_stride, rows, row_kv, vr, k_stride, outs);
}

// ---- AVX2 (256-bit, FMA, F16C): the same two kernels, 8 lanes ----
// Same split and arithmetic contract as the AVX-512 pair above: q (and with
// an f16 cache the probabilities) rounded through f16 as ggml; the softmax
// sums each 16 exponentials in float, then in double. The work over keys is
// done by small functions over a contiguous run of rows (a row pointer and
// a count), so a loop over non-contiguous runs (cache pages) can wrap them.

#define MINFER_AVX2 __attribute__((target("avx2,fma,f16c")))

MINFER_AVX2 inline __m256 load8(bool f16, const void* base, int64_t i) {
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
}

MINFER_AVX2 inline __m256 round_f16_8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

MINFER_AVX2 inline float hsum8(__m256 x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

MINFER_AVX2 inline float hmax8(__m256 x) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

constexpr int kMaxVecs8 = 2 * kMaxVecs;  // head_dim <= 256 in 8-float vectors

// Scores of one query against `count` contiguous key rows (k: the first
// row's head slice, rows kv_row elements apart): s[j] = q . k_j * scale.
MINFER_AVX2 void head_scores_run_avx2(bool f16, const __m256* qv, int nv, const void* k,
                                      int64_t kv_row, int64_t count, float scale, float* s) {
    for (int64_t j = 0; j < count; ++j) {
        const int64_t base = j * kv_row;
        __m256 a0 = _mm256_mul_ps(qv[0], load8(f16, k, base));
        __m256 a1 = _mm256_mul_ps(qv[1], load8(f16, k, base + 8));
        for (int i = 2; i < nv; i += 2) {
            a0 = _mm256_fmadd_ps(qv[i], load8(f16, k, base + 8 * i), a0);
            a1 = _mm256_fmadd_ps(qv[i + 1], load8(f16, k, base + 8 * i + 8), a1);
        }
        s[j] = hsum8(_mm256_add_ps(a0, a1)) * scale;
    }
}

// acc[0..nv) += sum_j p_j v_j over `count` contiguous value rows (v: the
// first row's head slice); p already normalized (and f16-rounded).
MINFER_AVX2 void head_pv_run_avx2(bool f16, const float* p, const void* v, int64_t kv_row,
                                  int64_t count, int nv, __m256* acc) {
    for (int64_t j = 0; j < count; ++j) {
        const __m256 pv = _mm256_set1_ps(p[j]);
        const int64_t base = j * kv_row;
        for (int i = 0; i < nv; ++i)
            acc[i] = _mm256_fmadd_ps(pv, load8(f16, v, base + 8 * i), acc[i]);
    }
}

// Element pointer of row `row`, element `off` of a region of f32 or f16.
inline const void* kv_at(bool f16, const void* base, int64_t kv_row, int64_t row, int64_t off) {
    const int64_t e = row * kv_row + off;
    return f16 ? static_cast<const void*>(static_cast<const uint16_t*>(base) + e)
               : static_cast<const void*>(static_cast<const float*>(base) + e);
}

MINFER_AVX2 void attn_head_avx2(bool f16, const float* q, const void* k, const void* v,
                                int64_t kv_row, int64_t off, int64_t n_kv, int64_t hd, float scale,
                                float* s, float* o) {
    const int nv = static_cast<int>(hd / 8);  // even: hd % 16 == 0
    __m256 qv[kMaxVecs8];
    for (int i = 0; i < nv; ++i) {
        qv[i] = _mm256_loadu_ps(q + 8 * i);
        if (f16) qv[i] = round_f16_8(qv[i]);
    }
    // Scores (one contiguous run here), their maximum.
    head_scores_run_avx2(f16, qv, nv, kv_at(f16, k, kv_row, 0, off), kv_row, n_kv, scale, s);
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int64_t j = 0;
    for (; j + 8 <= n_kv; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
    float m = hmax8(mx);
    for (; j < n_kv; ++j) m = std::max(m, s[j]);
    // Softmax: exp(s - max), the sum per 16 in float, then in double.
    double sum = 0;
    const __m256 vm = _mm256_set1_ps(m);
    for (j = 0; j < n_kv; j += 16) {
        __m256 part = _mm256_setzero_ps();
        for (int64_t h = j; h < std::min(n_kv, j + 16); h += 8) {
            const int64_t left = n_kv - h;
            if (left >= 8) {
                const __m256 e = simd::exp8_ps(_mm256_sub_ps(_mm256_loadu_ps(s + h), vm));
                _mm256_storeu_ps(s + h, e);
                part = _mm256_add_ps(part, e);
            } else {
                alignas(32) float t[8];
                for (int u = 0; u < 8; ++u) t[u] = u < left ? s[h + u] : -INFINITY;
                const __m256 e = simd::exp8_ps(_mm256_sub_ps(_mm256_load_ps(t), vm));
                _mm256_store_ps(t, e);
                for (int u = 0; u < left; ++u) s[h + u] = t[u];
                part = _mm256_add_ps(part, e);
            }
        }
        sum += static_cast<double>(hsum8(part));
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (j = 0; j < n_kv; ++j) {
        float p = s[j] * inv;
        if (f16) p = _cvtsh_ss(_cvtss_sh(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        s[j] = p;
    }
    // out = sum_j p_j v_j, at most 8 vectors of the head in registers at a time.
    for (int c0 = 0; c0 < nv; c0 += 8) {
        const int nc = std::min(8, nv - c0);
        __m256 acc[8];
        for (int i = 0; i < nc; ++i) acc[i] = _mm256_setzero_ps();
        head_pv_run_avx2(f16, s, kv_at(f16, v, kv_row, 0, off + 8 * c0), kv_row, n_kv, nc, acc);
        for (int i = 0; i < nc; ++i) _mm256_storeu_ps(o + 8 * (c0 + i), acc[i]);
    }
}

// Asks for the rows of keys [j0, j1) ahead of their use: rows of a head's
// slice lie n_head_kv slices apart, a stride the hardware prefetchers follow
// poorly (without this the K/V reads stalled on memory for a fifth of the
// many-rows kernel's time at depth 4096).
inline void prefetch_rows(const AttnRows& a, const void* base, int64_t j0, int64_t j1) {
    const int64_t es = a.f16 ? 2 : 4, bytes = a.hd * es;
    for (int64_t j = j0; j < j1; ++j) {
        const char* row = static_cast<const char*>(base) + kv_elem(a, j) * es;
        for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(row + b, _MM_HINT_T0);
    }
}

// ---- many query rows at once, 8 rows per vector ----
// Keys go in blocks of kKeyBlock: a block's K rows (and in the second pass
// its V rows) are converted from an f16 cache into a small scratch, or read
// in place from an f32 cache, so each is read from memory once per call and
// stays in L1 while every 8-row vector of the call uses it (the whole run
// converted up front, 2 x 2 MB a KV head at depth 4096, was read back from
// L3 by every vector).
constexpr int64_t kKeyBlock = 32;

// Row pointers (floats) of keys [j0, j0 + n): into the cache (f32) or
// converted into buf [n][hd] (f16); keys past n_kv_max repeat the last key
// (their scores are masked, their probabilities never read).
MINFER_AVX2 void key_block_rows(const AttnRows& a, const void* base, int64_t j0, int64_t n,
                                int64_t n_kv_max, float* buf, const float** rows) {
    prefetch_rows(a, base, j0 + n, std::min(j0 + 2 * n, n_kv_max));
    for (int64_t l = 0; l < n; ++l) {
        const int64_t e = kv_elem(a, std::min(j0 + l, n_kv_max - 1));
        if (!a.f16) {
            rows[l] = static_cast<const float*>(base) + e;
            continue;
        }
        for (int64_t d = 0; d < a.hd; d += 8)
            _mm256_storeu_ps(buf + l * a.hd + d, load8(true, base, e + d));
        rows[l] = buf + l * a.hd;
    }
}

// Scores of one 8-row block against keys [j0, j0 + count) (k[l]: key j0 +
// l's row; count a multiple of kKeysPerStep): st[j][lane] = q_lane . k_j *
// scale (one FMA chain over d), or -inf for keys at or past the lane's n_kv.
MINFER_AVX2 void rows_scores_block_avx2(const float* qt, int64_t hd, const float* const* k,
                                        int64_t j0, int64_t count, __m256i lane_kv, float scale,
                                        float* st, int64_t st_stride) {
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < count; j += kKeysPerStep) {
        __m256 acc[kKeysPerStep];
        const float* kj[kKeysPerStep];
        for (int u = 0; u < kKeysPerStep; ++u) {
            acc[u] = _mm256_setzero_ps();
            kj[u] = k[j + u];
        }
        for (int64_t d = 0; d < hd; ++d) {
            const __m256 qd = _mm256_loadu_ps(qt + d * 8);
            for (int u = 0; u < kKeysPerStep; ++u)
                acc[u] = _mm256_fmadd_ps(qd, _mm256_broadcast_ss(kj[u] + d), acc[u]);
        }
        for (int u = 0; u < kKeysPerStep; ++u) {
            const int64_t key = j0 + j + u;
            const __m256 live = _mm256_castsi256_ps(
                _mm256_cmpgt_epi32(lane_kv, _mm256_set1_epi32(static_cast<int32_t>(key))));
            _mm256_storeu_ps(st + key * st_stride,
                             _mm256_blendv_ps(ninf, _mm256_mul_ps(acc[u], vscale), live));
        }
    }
}

// out[r] (+)= sum_j p[j][r] * v_j over keys [j0, j0 + count) (v[l]: key j0
// + l's row), R rows x 2 vectors of the head in registers at a time; the
// first key block starts from zero, later ones from what out holds (a
// float stored and reloaded: the FMA chain over keys is unchanged).
template <int R>
MINFER_AVX2 void rows_pv_block_avx2(const float* p, int64_t p_stride, const float* const* v,
                                    int64_t j0, int64_t count, int64_t hd, float* const* out) {
    for (int64_t c = 0; c < hd; c += 16) {
        __m256 acc[R][2];
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 2; ++u)
                acc[r][u] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + c + 8 * u);
        for (int64_t j = 0; j < count; ++j) {
            const __m256 v0 = _mm256_loadu_ps(v[j] + c), v1 = _mm256_loadu_ps(v[j] + c + 8);
            const float* pj = p + (j0 + j) * p_stride;
            for (int r = 0; r < R; ++r) {
                const __m256 pr = _mm256_broadcast_ss(pj + r);
                acc[r][0] = _mm256_fmadd_ps(pr, v0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pr, v1, acc[r][1]);
            }
        }
        for (int r = 0; r < R; ++r)
            for (int u = 0; u < 2; ++u) _mm256_storeu_ps(out[r] + c + 8 * u, acc[r][u]);
    }
}
using RowsPvFn = void (*)(const float*, int64_t, const float* const*, int64_t, int64_t, int64_t,
                          float* const*);
constexpr int kPvRows = 4;  // 8 accumulators, 2 V vectors, a broadcast: 11 of 16 registers
constexpr std::array<RowsPvFn, kPvRows> kRowsPv = {&rows_pv_block_avx2<1>, &rows_pv_block_avx2<2>,
                                                   &rows_pv_block_avx2<3>, &rows_pv_block_avx2<4>};

MINFER_AVX2 void attn_rows_avx2(const AttnRows& a, float* scratch) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group, nrv = (rows + 7) / 8;
    int64_t n_kv_max = 0;
    for (int64_t i = 0; i < a.n_tokens; ++i) n_kv_max = std::max<int64_t>(n_kv_max, a.n_kv[i]);
    const int64_t n_kv_pad = (n_kv_max + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
    // scratch (fits attn_rows_scratch_floats, sized for 16 lanes): q^T
    // [nrv][hd][8] | scores [n_kv_pad][nrv * 8] | row n_kv [nrv * 8] | one
    // key block of K or V rows as floats [kKeyBlock][hd]
    float* qt = scratch;
    float* st = qt + nrv * hd * 8;
    const int64_t st_stride = nrv * 8;
    auto* row_kv = reinterpret_cast<int32_t*>(st + n_kv_pad * st_stride);
    float* buf = reinterpret_cast<float*>(row_kv + st_stride);
    const float* kv_rows[kKeyBlock];

    transpose_q_rows(a, 8, st_stride, qt, row_kv);
    for (int64_t j0 = 0; j0 < n_kv_pad; j0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, n_kv_pad - j0);
        key_block_rows(a, a.k, j0, n, n_kv_max, buf, kv_rows);
        for (int64_t rv = 0; rv < nrv; ++rv)
            rows_scores_block_avx2(
                qt + rv * hd * 8, hd, kv_rows, j0, n,
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_kv + rv * 8)), a.scale,
                st + rv * 8, st_stride);
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t rv = 0; rv < nrv; ++rv) {
        float* stv = st + rv * 8;
        // Softmax down each lane, as attn_rows_avx512.
        __m256 mx = ninf;
        for (int64_t j = 0; j < n_kv_max; ++j)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(stv + j * st_stride));
        __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
        for (int64_t j0 = 0; j0 < n_kv_max; j0 += 16) {
            __m256 part = _mm256_setzero_ps();
            for (int64_t j = j0; j < std::min(n_kv_max, j0 + 16); ++j) {
                float* sj = stv + j * st_stride;
                const __m256 e = simd::exp8_ps(_mm256_sub_ps(_mm256_loadu_ps(sj), mx));
                _mm256_storeu_ps(sj, e);
                part = _mm256_add_ps(part, e);
            }
            sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(part)));
            sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(part, 1)));
        }
        const __m256d one = _mm256_set1_pd(1.0);
        const __m256 inv = _mm256_insertf128_ps(
            _mm256_castps128_ps256(_mm256_cvtpd_ps(_mm256_div_pd(one, sum_lo))),
            _mm256_cvtpd_ps(_mm256_div_pd(one, sum_hi)), 1);
        for (int64_t j = 0; j < n_kv_max; ++j) {
            float* sj = stv + j * st_stride;
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(sj), inv);
            if (a.f16) p = round_f16_8(p);
            _mm256_storeu_ps(sj, p);
        }
    }
    // out = P V, key block by key block; a group of rows runs to the largest
    // key count among them (keys a row does not see have p = 0).
    float* outs[kMaxRows];
    for (int64_t r = 0; r < rows; ++r)
        outs[r] = a.out + (r / a.group) * a.out_stride + (r % a.group) * hd;
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, n_kv_max - j0);
        key_block_rows(a, a.v, j0, n, n_kv_max, buf, kv_rows);
        for (int64_t r0 = 0; r0 < rows; r0 += kPvRows) {
            const int nr = static_cast<int>(std::min<int64_t>(kPvRows, rows - r0));
            int64_t n_kv = 0;
            for (int i = 0; i < nr; ++i) n_kv = std::max<int64_t>(n_kv, row_kv[r0 + i]);
            const int64_t count = std::min(n, n_kv - j0);
            if (count > 0)
                kRowsPv[static_cast<size_t>(nr - 1)](st + r0, st_stride, kv_rows, j0, count, hd,
                                                     outs + r0);
        }
    }
}

// ---- few query rows (a decode token): keys in the lanes ----
// A decode token brings `group` rows (2 for qwen3), which would fill 2 of
// the 8 or 16 lanes of the many-rows kernels and make them convert and
// copy the whole K/V run for a few FMAs per key. Here 8 keys (16 at
// AVX-512) share a vector instead: an 8 x 8 block (8 keys, 8 dims) is
// loaded straight from the cache, converted and transposed in registers
// (two such blocks at AVX-512, see load_2x8), and each row's scores
// take one FMA per dim: per (row, key) the same FMA chain as the many-rows
// kernels (d ascending from zero, then times scale), the same softmax sums
// (each 16 keys in float in key order, then in double) and the same P V
// chain per output (keys ascending from zero). So a token's output is
// bitwise the same whichever kernel its pass picks (batch invariance).
// At most kFewRows rows at the AVX2 level (16 registers), kFewRowsWide at
// AVX-512 (32 registers; Qwen2.5's 7-head groups fit).
constexpr int64_t kFewRows = 4, kFewRowsWide = 8;

// st[r][j] (row stride sst) = q_r . k_j * scale for keys [0, n_kv_pad8),
// -inf past row r's key count; qr [rows][hd] already f16-rounded as needed.
template <int R>  // R rows: a constant, so the accumulators stay in registers
MINFER_AVX2 void few_rows_scores_avx2(const AttnRows& a, const float* qr, const int32_t* row_kv,
                                      int64_t n_kv_max, float* st, int64_t sst) {
    const int64_t hd = a.hd;
    const __m256 vscale = _mm256_set1_ps(a.scale), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += 8) {
        prefetch_rows(a, a.k, std::min(j0 + 32, n_kv_max), std::min(j0 + 40, n_kv_max));
        int64_t e[8];  // rows past n_kv_max repeat the last key (masked below)
        for (int l = 0; l < 8; ++l) e[l] = kv_elem(a, std::min(j0 + l, n_kv_max - 1));
        __m256 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
        for (int64_t d0 = 0; d0 < hd; d0 += 8) {
            __m256i kd[8];
            for (int l = 0; l < 8; ++l) kd[l] = _mm256_castps_si256(load8(a.f16, a.k, e[l] + d0));
            simd::transpose8x8(kd);  // kd[i]: dim d0 + i of the 8 keys
            for (int i = 0; i < 8; ++i)
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(qr + r * hd + d0 + i),
                                             _mm256_castsi256_ps(kd[i]), acc[r]);
        }
        const __m256i key = _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(j0)));
        for (int r = 0; r < R; ++r) {
            const __m256 live =
                _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(row_kv[r]), key));
            _mm256_storeu_ps(st + r * sst + j0,
                             _mm256_blendv_ps(ninf, _mm256_mul_ps(acc[r], vscale), live));
        }
    }
}

// The AVX-512 level's scores: 16 keys a vector. Row l of a step's 8
// vectors holds 8 dims of two keys (one per 256-bit half), so that the
// 8 x 8 transpose of each half and one 128-bit lane shuffle leave dim d0 + i
// of keys j0 .. j0 + 15 in key order in one vector; per (row, key) the FMA
// chain is the one above (and the many-rows kernels').
MINFER_AVX512 inline __m512 load_2x8(bool f16, const void* base, int64_t ia, int64_t ib) {
    if (f16) {
        const auto* h = static_cast<const uint16_t*>(base);
        const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + ia));
        const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(h + ib));
        return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
    }
    const auto* f = static_cast<const float*>(base);
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(f + ia)),
                              _mm256_loadu_ps(f + ib), 1);
}

template <int R>
MINFER_AVX512 void few_rows_scores_avx512(const AttnRows& a, const float* qr, const int32_t* row_kv,
                                          int64_t n_kv_max, float* st, int64_t sst) {
    const int64_t hd = a.hd;
    const __m512 vscale = _mm512_set1_ps(a.scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += 16) {
        prefetch_rows(a, a.k, std::min(j0 + 32, n_kv_max), std::min(j0 + 48, n_kv_max));
        int64_t e[16];  // rows past n_kv_max repeat the last key (masked below)
        for (int l = 0; l < 16; ++l) e[l] = kv_elem(a, std::min(j0 + l, n_kv_max - 1));
        __m512 acc[R];
        for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
        for (int64_t d0 = 0; d0 < hd; d0 += 8) {
            // vector l: keys (l, l + 4) for l < 4, (l + 4, l + 8) after
            __m512i kd[8];
            for (int l = 0; l < 8; ++l) {
                const int ka = l < 4 ? l : l + 4;
                kd[l] = _mm512_castps_si512(load_2x8(a.f16, a.k, e[ka] + d0, e[ka + 4] + d0));
            }
            __m512i t[8], u[8];
            for (int i = 0; i < 8; i += 2) {
                t[i] = _mm512_unpacklo_epi32(kd[i], kd[i + 1]);
                t[i + 1] = _mm512_unpackhi_epi32(kd[i], kd[i + 1]);
            }
            for (int i = 0; i < 8; i += 4) {
                u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
                u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
                u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
                u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
            }
            for (int i = 0; i < 4; ++i) {  // kd[i]: dim d0 + i of the 16 keys
                kd[i] = _mm512_shuffle_i32x4(u[i], u[i + 4], _MM_SHUFFLE(2, 0, 2, 0));
                kd[i + 4] = _mm512_shuffle_i32x4(u[i], u[i + 4], _MM_SHUFFLE(3, 1, 3, 1));
            }
            for (int i = 0; i < 8; ++i)
                for (int r = 0; r < R; ++r)
                    acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qr[r * hd + d0 + i]),
                                             _mm512_castsi512_ps(kd[i]), acc[r]);
        }
        const __m512i key = _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(j0)));
        for (int r = 0; r < R; ++r) {
            const __mmask16 live = _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(row_kv[r]));
            _mm512_storeu_ps(st + r * sst + j0,
                             _mm512_mask_blend_ps(live, ninf, _mm512_mul_ps(acc[r], vscale)));
        }
    }
}

// out_r[c0 * 16 ..] (+)= sum_j p_r[j] v_j over keys [j0, j1), NC 16-float
// vectors of the head: per output the chain of few_rows_pv_block_avx2.
template <int NC, int R>
MINFER_AVX512 void few_rows_pv_block_avx512(const AttnRows& a, const float* p, int64_t sp,
                                            const int64_t* e, int64_t j0, int64_t j1, int c0,
                                            float* const* out) {
    __m512 acc[R][NC];
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u)
            acc[r][u] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out[r] + 16 * (c0 + u));
    for (int64_t j = j0; j < j1; ++j) {
        __m512 pj[R];
        for (int r = 0; r < R; ++r) pj[r] = _mm512_set1_ps(p[r * sp + j]);
        for (int u = 0; u < NC; ++u) {
            const __m512 vv = load16(a.f16, a.v, e[j - j0] + 16 * (c0 + u));
            for (int r = 0; r < R; ++r) acc[r][u] = _mm512_fmadd_ps(pj[r], vv, acc[r][u]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u) _mm512_storeu_ps(out[r] + 16 * (c0 + u), acc[r][u]);
}

// s[j] = exp(s[j] - mx) for j < n (n a multiple of 16), with the exp of
// the level's many-rows kernel, so the values are bitwise the same.
MINFER_AVX2 void exp_run_avx2(float* s, int64_t n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    for (int64_t j = 0; j < n; j += 8)
        _mm256_storeu_ps(s + j, simd::exp8_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
}
MINFER_AVX512 void exp_run_avx512(float* s, int64_t n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    for (int64_t j = 0; j < n; j += 16)
        _mm512_storeu_ps(s + j, simd::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
}

// out_r[c0 * 8 ..] (+)= sum_j p_r[j] v_j over keys [j0, j1), NC vectors of
// the head, the rows' accumulators in registers (reloaded from out after
// the first key block: a float store and load change nothing).
template <int NC, int R>
MINFER_AVX2 void few_rows_pv_block_avx2(const AttnRows& a, const float* p, int64_t sp,
                                        const int64_t* e, int64_t j0, int64_t j1, int c0,
                                        float* const* out) {
    __m256 acc[R][NC];
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u)
            acc[r][u] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + 8 * (c0 + u));
    for (int64_t j = j0; j < j1; ++j) {
        __m256 vv[NC];
        for (int u = 0; u < NC; ++u) vv[u] = load8(a.f16, a.v, e[j - j0] + 8 * (c0 + u));
        for (int r = 0; r < R; ++r) {
            const __m256 pj = _mm256_broadcast_ss(p + r * sp + j);
            for (int u = 0; u < NC; ++u) acc[r][u] = _mm256_fmadd_ps(pj, vv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u) _mm256_storeu_ps(out[r] + 8 * (c0 + u), acc[r][u]);
}

// P V for all rows over keys [0, n_kv): key blocks of 64, so a block's V
// rows (16-32 KB of one head) stay in L1 while the column chunks of NC
// vectors of kLanes floats pass over them (Block: NC vectors, One: one).
template <int NC, int64_t kLanes, auto Block, auto One>
void few_rows_pv_run(const AttnRows& a, const float* p, int64_t sp, int64_t n_kv,
                     float* const* out) {
    constexpr int64_t kBlock = 64;
    const int nv = static_cast<int>(a.hd / kLanes);
    int64_t e[kBlock];
    for (int64_t j0 = 0; j0 < n_kv; j0 += kBlock) {
        const int64_t j1 = std::min(n_kv, j0 + kBlock);
        prefetch_rows(a, a.v, j1, std::min(n_kv, j1 + kBlock));
        for (int64_t j = j0; j < j1; ++j) e[j - j0] = kv_elem(a, j);
        int c0 = 0;
        for (; c0 + NC <= nv; c0 += NC) Block(a, p, sp, e, j0, j1, c0, out);
        for (; c0 < nv; ++c0) One(a, p, sp, e, j0, j1, c0, out);
    }
}

// The level's scores and P V kernels for `rows` rows (1 .. kFewRows, or
// kFewRowsWide at AVX-512).
template <int R>
void few_rows_scores_r(bool wide, const AttnRows& a, const float* qr, const int32_t* row_kv,
                       int64_t n_kv_max, float* st, int64_t sst) {
    if constexpr (R <= kFewRows)
        if (!wide) return few_rows_scores_avx2<R>(a, qr, row_kv, n_kv_max, st, sst);
    MINFER_ASSERT(wide);
    few_rows_scores_avx512<R>(a, qr, row_kv, n_kv_max, st, sst);
}
template <int R>
void few_rows_pv_r(bool wide, const AttnRows& a, const float* p, int64_t sp, int64_t n_kv,
                   float* const* out) {
    // Accumulators a row: AVX2 (16 registers) 4 vectors for 1-2 rows, 2 for
    // 3-4; AVX-512 (32) 8 (a 128-dim head), 4 and 2 for 1-2, 3-4, 5-8 rows.
    if constexpr (R <= kFewRows) {
        constexpr int NC = R <= 2 ? 4 : 2;
        if (!wide)
            return few_rows_pv_run<NC, 8, &few_rows_pv_block_avx2<NC, R>,
                                   &few_rows_pv_block_avx2<1, R>>(a, p, sp, n_kv, out);
    }
    MINFER_ASSERT(wide);
    constexpr int NC = R <= 2 ? 8 : R <= 4 ? 4 : 2;
    few_rows_pv_run<NC, 16, &few_rows_pv_block_avx512<NC, R>, &few_rows_pv_block_avx512<1, R>>(
        a, p, sp, n_kv, out);
}
// Both kernels for each row count, kFewRowsKernels[rows - 1].
struct FewRowsKernels {
    decltype(&few_rows_scores_r<1>) scores;
    decltype(&few_rows_pv_r<1>) pv;
};
template <int... Rs>
constexpr auto few_rows_table(std::integer_sequence<int, Rs...>) {
    return std::array{FewRowsKernels{&few_rows_scores_r<Rs + 1>, &few_rows_pv_r<Rs + 1>}...};
}
constexpr auto kFewRowsKernels = few_rows_table(std::make_integer_sequence<int, kFewRowsWide>{});

// The kernel for at most kFewRows rows (kFewRowsWide when `wide`).
// `wide`: the AVX-512 level (16-key scores, 16-float P V, its exp), else
// AVX2. Both give the same bits but for the exp, which is the level's
// many-rows kernel's.
MINFER_AVX2 void attn_few_rows(const AttnRows& a, float* scratch, bool wide) {
    const int64_t hd = a.hd;
    const int rows = static_cast<int>(a.n_tokens * a.group);
    MINFER_ASSERT(rows >= 1 && rows <= (wide ? kFewRowsWide : kFewRows));
    int64_t n_kv_max = 0;
    int32_t row_kv[kFewRowsWide];
    for (int r = 0; r < rows; ++r) {
        row_kv[r] = a.n_kv[r / a.group];
        n_kv_max = std::max<int64_t>(n_kv_max, row_kv[r]);
    }
    // scratch (within attn_rows_scratch_floats): q rows [rows][hd] | scores
    // [rows][sst], each row padded with -inf to a multiple of 16 keys
    const int64_t sst = (n_kv_max + 15) / 16 * 16;
    float* qr = scratch;
    float* st = qr + rows * hd;
    for (int r = 0; r < rows; ++r)
        for (int64_t d = 0; d < hd; ++d) {
            float x = a.q[(r / a.group) * a.q_stride + (r % a.group) * hd + d];
            if (a.f16) x = _cvtsh_ss(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
            qr[r * hd + d] = x;
        }
    kFewRowsKernels[static_cast<size_t>(rows - 1)].scores(wide, a, qr, row_kv, n_kv_max, st, sst);
    for (int r = 0; r < rows; ++r) {
        float* s = st + r * sst;
        std::fill(s + (n_kv_max + 7) / 8 * 8, s + sst, -INFINITY);
        float mx = -INFINITY;
        for (int64_t j = 0; j < n_kv_max; ++j) mx = std::max(mx, s[j]);
        if (wide)
            exp_run_avx512(s, sst, mx);
        else
            exp_run_avx2(s, sst, mx);
        double sum = 0;
        for (int64_t j0 = 0; j0 < n_kv_max; j0 += 16) {
            float part = 0.0f;
            for (int64_t j = j0; j < std::min(n_kv_max, j0 + 16); ++j) part += s[j];
            sum += static_cast<double>(part);
        }
        const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
        for (int64_t j = 0; j < sst; j += 8) {
            __m256 p = _mm256_mul_ps(_mm256_loadu_ps(s + j), inv);
            if (a.f16) p = round_f16_8(p);
            _mm256_storeu_ps(s + j, p);
        }
    }
    float* outs[kFewRowsWide];
    for (int r = 0; r < rows; ++r)
        outs[r] = a.out + (r / a.group) * a.out_stride + (r % a.group) * hd;
    kFewRowsKernels[static_cast<size_t>(rows - 1)].pv(wide, a, st, sst, n_kv_max, outs);
}

}  // namespace

bool attn_simd_supported(int64_t hd) {
    const bool isa =
        (isa_at_least(IsaLevel::Avx512) && has_avx512()) || isa_at_least(IsaLevel::Avx2);
    return isa && hd > 0 && hd % 16 == 0 && hd / 16 <= kMaxVecs;
}

void attn_head_simd(bool f16, const float* q, const void* k, const void* v, int64_t kv_row,
                    int64_t off, int64_t n_kv, int64_t hd, float scale, float* s, float* o) {
    if (isa_at_least(IsaLevel::Avx512) && has_avx512())
        attn_head_avx512(f16, q, k, v, kv_row, off, n_kv, hd, scale, s, o);
    else
        attn_head_avx2(f16, q, k, v, kv_row, off, n_kv, hd, scale, s, o);
}

void attn_rows_simd(const AttnRows& a, float* scratch) {
    MINFER_ASSERT(a.n_tokens * a.group <= kMaxRows);
    const bool avx512 = isa_at_least(IsaLevel::Avx512) && has_avx512();
    if (a.n_tokens * a.group <= (avx512 ? kFewRowsWide : kFewRows))
        attn_few_rows(a, scratch, avx512);
    else if (avx512)
        attn_rows_avx512(a, scratch);
    else
        attn_rows_avx2(a, scratch);
}

#elif !defined(__aarch64__)  // ARM64: arm/attn_neon.cpp

bool attn_simd_supported(int64_t) {
    return false;
}

void attn_head_simd(bool, const float*, const void*, const void*, int64_t, int64_t, int64_t,
                    int64_t, float, float*, float*) {
    MINFER_ASSERT_MSG(false, "attn_head_simd without AVX2");
}

void attn_rows_simd(const AttnRows&, float*) {
    MINFER_ASSERT_MSG(false, "attn_rows_simd without AVX2");
}

#endif

}  // namespace minfer::cpu
