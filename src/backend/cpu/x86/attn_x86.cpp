// The SIMD attention of attn.h on x86-64: the Avx512 (16 lanes) and Avx2
// (8 lanes) kernels over the query rows of one head group, and the kernels
// for a few rows; attn_rows_at gives kernel_table.cpp each level's entry.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cpu/attn.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/x86/intrinsics.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include "backend/cpu/simd_exp.h"
#include "backend/cpu/x86/transpose_avx2.h"

namespace minfer::cpu {
namespace {

// x rounded through f16, 8 lanes: q (what ggml's f16 vec_dot sees) and,
// for an f16 V, the probabilities (as ggml).
MINFER_TARGET_AVX2 inline __m256 round_f16_8(__m256 x) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// The query rows of one many-rows call, transposed for the SIMD kernels:
// qt [n_rows_pad / lanes][hd][lanes], row r = (token r / group, head r %
// group), rounded through f16 for an f16 cache (as ggml), padding rows zero;
// row_kv [n_rows_pad] each row's key count (padding rows see key 0 only: a
// finite softmax, never stored). Shared by the AVX-512 (16 lanes) and AVX2
// (8 lanes) kernels. Rows go 8 at a time through an 8 x 8 transpose, 8
// dims per step (n_rows_pad is whole vectors of lanes, hd a multiple of 16:
// attn_simd_supported).
MINFER_TARGET_AVX2 void transpose_q_rows(const AttnRows& a, int64_t lanes, int64_t n_rows_pad,
                                         float* qt, int32_t* row_kv) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group;
    MINFER_ASSERT(n_rows_pad % lanes == 0 && lanes % 8 == 0 && hd % 8 == 0);
    for (int64_t r = 0; r < n_rows_pad; ++r) row_kv[r] = r < rows ? a.n_kv[r / a.group] : 1;
    for (int64_t r0 = 0; r0 < n_rows_pad; r0 += 8) {
        const float* src[8];
        for (int i = 0; i < 8; ++i) {
            const int64_t r = r0 + i;
            src[i] = r < rows ? a.q + (r / a.group) * a.q_stride + (r % a.group) * hd : nullptr;
        }
        float* dst = qt + (r0 / lanes) * hd * lanes + r0 % lanes;
        for (int64_t d = 0; d < hd; d += 8) {
            __m256i v[8];
            for (int i = 0; i < 8; ++i) {
                __m256 x = src[i] ? _mm256_loadu_ps(src[i] + d) : _mm256_setzero_ps();
                if (a.f16) x = round_f16_8(x);
                v[i] = _mm256_castps_si256(x);
            }
            simd::transpose8x8(v);
            for (int i = 0; i < 8; ++i)
                _mm256_storeu_ps(dst + (d + i) * lanes, _mm256_castsi256_ps(v[i]));
        }
    }
}

MINFER_TARGET_AVX512 inline __m512 load16(bool f16, const void* base, int64_t i) {
    if (f16)
        return _mm512_cvtph_ps(_mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)));
    return _mm512_loadu_ps(static_cast<const float*>(base) + i);
}

// q rounded through f16 (what ggml's f16 vec_dot sees).
MINFER_TARGET_AVX512 inline __m512 round_f16(__m512 x) {
    return _mm512_cvtph_ps(_mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

constexpr int kMaxVecs = 16;  // head_dim <= 256

MINFER_TARGET_AVX2 inline __m256 load8(bool f16, const void* base, int64_t i) {
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128(
            reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
    return _mm256_loadu_ps(static_cast<const float*>(base) + i);
}

// K of `run` consecutive cells from key j's (one K block) as floats,
// dim-major: dst[d * ld + l] = dim d of key j + l (this head). The cache
// holds K so (ir/kv_layout.h): each dim's run is copied (converted) 8
// at a time.
MINFER_TARGET_AVX2 void gather_k_run(const AttnRows& a, int64_t j, int64_t run, float* dst,
                                     int64_t ld) {
    const int64_t first = k_elem(a, j);
    for (int64_t d = 0; d < a.hd; ++d) {
        const int64_t src = first + d * graph::kKBlockCells;
        float* out = dst + d * ld;
        int64_t l = 0;
        for (; l + 8 <= run; l += 8) _mm256_storeu_ps(out + l, load8(a.f16, a.k, src + l));
        for (; l < run; ++l)
            out[l] = a.f16 ? _cvtsh_ss(static_cast<const uint16_t*>(a.k)[src + l])
                           : static_cast<const float*>(a.k)[src + l];
    }
}
// Keys [j0, j1) so: kt[d * ld + j - j0] = dim d of key j.
void gather_k_dims(const AttnRows& a, int64_t j0, int64_t j1, float* kt, int64_t ld) {
    for_each_kv_run(a, j0, j1,
                    [&](int64_t j, int64_t run) { gather_k_run(a, j, run, kt + (j - j0), ld); });
}

// ---- many query rows at once (prompt chunks) ----
// Rows are (token, head of the group) pairs sharing one KV head; 16 rows
// sit in the lanes of a vector, so a score is a plain FMA chain over the
// head dimension (q transposed once per call, each K element broadcast)
// with no horizontal sum per (row, key), and the softmax runs on 16 rows at
// once. Scores are kept key-major: st[j][row].

constexpr int kKeysPerStep = 4;  // keys sharing one load of q^T[d] (AVX2)
// The same at AVX-512: with two row vectors, 16 independent FMA chains (8
// would leave each FMA waiting on the latency of the one before).
constexpr int kKeysPerStep512 = 8;
static_assert(kAttnMaxKeyStep % kKeysPerStep == 0 && kAttnMaxKeyStep % kKeysPerStep512 == 0,
              "attn_rows_scratch_floats pads the keys to kAttnMaxKeyStep");
// n keys padded to whole AVX-512 score steps.
inline int64_t whole_steps512(int64_t n) {
    return (n + kKeysPerStep512 - 1) / kKeysPerStep512 * kKeysPerStep512;
}
// Row vectors sharing one pass of the score kernels over the keys.
constexpr int kScoreRowVecs = 2;
constexpr int64_t kMaxRows = kAttnMaxRows;

// The most keys any of rows [r0, r1) sees. A prompt block's first rows see
// fewer keys than its last: the kernels neither compute nor read the
// scores of keys no row of a vector sees.
inline int64_t rows_kv(const int32_t* row_kv, int64_t r0, int64_t r1) {
    int32_t n = 0;
    for (int64_t r = r0; r < r1; ++r) n = std::max(n, row_kv[r]);
    return n;
}

// out[r] = sum_j p[j][r] * v_j for the rows of one vector block, R rows at a
// time in registers (NV vectors each). Keys go kPvKeys at a time through
// every row, so that block of V rows is read from L1 by all of them (the
// whole of V, read per R rows, would stream from L2 at the rate of the
// FMAs); a row's sums wait in out between blocks, the same chain of FMAs.
constexpr int64_t kPvKeys = 32;
template <int NV>
MINFER_TARGET_AVX512 void attn_pv(const float* p, int64_t p_stride, int64_t rows,
                                  const int32_t* n_kv_row, const float* v, int64_t v_row,
                                  float* const* out) {
    constexpr int R = NV >= 16 ? 1 : 16 / NV > 4 ? 4 : 16 / NV;
    int64_t n_kv_all = 0;
    for (int64_t r = 0; r < rows; ++r) n_kv_all = std::max<int64_t>(n_kv_all, n_kv_row[r]);
    for (int64_t j0 = 0; j0 < n_kv_all; j0 += kPvKeys)
        for (int64_t r0 = 0; r0 < rows; r0 += R) {
            const int nr = static_cast<int>(std::min<int64_t>(R, rows - r0));
            int64_t n_kv = 0;
            for (int i = 0; i < nr; ++i) n_kv = std::max<int64_t>(n_kv, n_kv_row[r0 + i]);
            if (j0 >= n_kv) continue;
            __m512 acc[R][NV];
            for (int i = 0; i < R; ++i)
                for (int u = 0; u < NV; ++u)
                    acc[i][u] = j0 == 0 || i >= nr ? _mm512_setzero_ps()
                                                   : _mm512_loadu_ps(out[r0 + i] + 16 * u);
            for (int64_t j = j0; j < std::min(n_kv, j0 + kPvKeys); ++j) {
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

// V rows of keys [j, j + run), consecutive cells of one page, as floats:
// hd elements each into vf.
MINFER_TARGET_AVX512 void gather_v_rows(const AttnRows& a, int64_t j, int64_t run, float* vf) {
    const int64_t first = v_elem(a, j);
    for (int64_t l = 0; l < run; ++l)
        for (int64_t d = 0; d < a.hd; d += 16)
            _mm512_storeu_ps(vf + l * a.hd + d, load16(a.f16, a.v, first + l * a.kv_row + d));
}

// Scores of NR row vectors (16 rows each; qt: the first's q^T, the next
// hd * 16 floats on; row_kv, st: from the first's rows) against keys
// [0, n_kv_pad) (a multiple of kKeysPerStep512), kKeysPerStep512 keys per
// pass over q^T: NR x kKeysPerStep512 independent FMA chains, enough to
// cover the FMA latency with two row vectors. Keys at or past a
// row's n_kv are -inf (and never read from memory past n_kv_max). Each
// score is the same FMA chain over the head dimension whatever NR is.
template <int NR>
MINFER_TARGET_AVX512 void score_rows(const float* qt, int64_t hd, const float* kt,
                                     const int32_t* row_kv, int64_t n_kv_pad, float scale,
                                     float* st, int64_t st_stride) {
    constexpr int64_t B = graph::kKBlockCells;
    const __m512 vscale = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t j = 0; j < n_kv_pad; j += kKeysPerStep512) {
        __m512 acc[NR][kKeysPerStep512];
        for (int r = 0; r < NR; ++r)
            for (int u = 0; u < kKeysPerStep512; ++u) acc[r][u] = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; ++d) {
            __m512 qd[NR];
            for (int r = 0; r < NR; ++r) qd[r] = _mm512_loadu_ps(qt + (r * hd + d) * 16);
            const float* kd = kt + (j / B * hd + d) * B + j % B;  // 8 keys of one block
            for (int u = 0; u < kKeysPerStep512; ++u) {
                const __m512 k = _mm512_set1_ps(kd[u]);
                for (int r = 0; r < NR; ++r) acc[r][u] = _mm512_fmadd_ps(qd[r], k, acc[r][u]);
            }
        }
        for (int r = 0; r < NR; ++r) {
            const __m512i lane_kv = _mm512_loadu_si512(row_kv + r * 16);
            for (int u = 0; u < kKeysPerStep512; ++u) {
                const __mmask16 live = _mm512_cmpgt_epi32_mask(
                    lane_kv, _mm512_set1_epi32(static_cast<int32_t>(j + u)));
                _mm512_storeu_ps(st + (j + u) * st_stride + r * 16,
                                 _mm512_mask_mov_ps(ninf, live, _mm512_mul_ps(acc[r][u], vscale)));
            }
        }
    }
}

MINFER_TARGET_AVX512 void attn_rows_avx512(const AttnRows& a, float* scratch) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group, nrv = (rows + 15) / 16;
    int64_t n_kv_max = 0;
    for (int64_t i = 0; i < a.n_tokens; ++i) n_kv_max = std::max<int64_t>(n_kv_max, a.n_kv[i]);
    const int64_t n_kv_pad = whole_steps512(n_kv_max);
    // scratch: q^T [nrv][hd][16] | scores [n_kv_pad][nrv * 16] | row n_kv [nrv * 16]
    // | K as floats in blocks of 32 keys, each dim-major [hd][32] (as the
    // cache holds them) | V rows as floats [n_kv_pad][hd]
    constexpr int64_t B = graph::kKBlockCells;
    float* qt = scratch;
    float* st = qt + nrv * hd * 16;
    const int64_t st_stride = nrv * 16;
    auto* row_kv = reinterpret_cast<int32_t*>(st + n_kv_pad * st_stride);
    float* kt = reinterpret_cast<float*>(row_kv + st_stride);
    float* vf = kt + (n_kv_pad + B - 1) / B * B * hd;

    transpose_q_rows(a, 16, st_stride, qt, row_kv);
    // K and V as floats, gathered run by run of consecutive cells (an f16
    // cache is converted once per call). Keys past n_kv_max are zero (read
    // only by the masked key steps).
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += B)
        gather_k_dims(a, j0, std::min(j0 + B, n_kv_max), kt + j0 * hd, B);
    for_each_kv_run(a, 0, n_kv_max,
                    [&](int64_t j, int64_t run) { gather_v_rows(a, j, run, vf + j * hd); });
    for (int64_t j = n_kv_max; j < n_kv_pad; ++j) {
        for (int64_t d = 0; d < hd; ++d) kt[(j / B * hd + d) * B + j % B] = 0.0f;
        for (int64_t d = 0; d < hd; d += 16) _mm512_storeu_ps(vf + j * hd + d, _mm512_setzero_ps());
    }
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t rv = 0; rv < nrv; rv += kScoreRowVecs) {
        const int64_t nv = std::min<int64_t>(kScoreRowVecs, nrv - rv);
        const auto scores = nv == kScoreRowVecs ? &score_rows<kScoreRowVecs> : &score_rows<1>;
        const int64_t n_pad = whole_steps512(rows_kv(row_kv, rv * 16, (rv + nv) * 16));
        scores(qt + rv * hd * 16, hd, kt, row_kv + rv * 16, n_pad, a.scale, st + rv * 16,
               st_stride);
    }
    for (int64_t rv = 0; rv < nrv; ++rv) {
        const int64_t n_kv_rv = rows_kv(row_kv, rv * 16, rv * 16 + 16);
        // Softmax down each lane: the maximum, exp(s - max) with the sum of
        // each 16 keys in float then in double (as ggml's softmax), and
        // the probabilities (rounded to f16 for an f16 V, as ggml).
        __m512 mx = ninf;
        for (int64_t j = 0; j < n_kv_rv; ++j)
            mx = _mm512_max_ps(mx, _mm512_loadu_ps(st + j * st_stride + rv * 16));
        __m512d sum_lo = _mm512_setzero_pd(), sum_hi = _mm512_setzero_pd();
        for (int64_t j0 = 0; j0 < n_kv_rv; j0 += 16) {
            __m512 part = _mm512_setzero_ps();
            for (int64_t j = j0; j < std::min(n_kv_rv, j0 + 16); ++j) {
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
        for (int64_t j = 0; j < n_kv_rv; ++j) {
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
    kPv[static_cast<size_t>(hd / 16 - 1)](st, st_stride, rows, row_kv, vf, hd, outs);
}

// ---- AVX2 (256-bit, FMA, F16C): the same two kernels, 8 lanes ----
// Same split and arithmetic contract as the AVX-512 pair above: q (and with
// an f16 cache the probabilities) rounded through f16 as ggml; the softmax
// sums each 16 exponentials in float, then in double.

// Bytes of one cache element (f16 or f32).
inline int64_t kv_elem_bytes(const AttnRows& a) {
    return a.f16 ? 2 : 4;
}
// Asks for the cache lines of [p, p + bytes) ahead of their use.
inline void prefetch_lines(const char* p, int64_t bytes) {
    for (int64_t b = 0; b < bytes; b += 64) _mm_prefetch(p + b, _MM_HINT_T0);
}
// Asks for the V rows of keys [j0, j1) ahead of their use: rows of a
// head's slice lie n_head_kv slices apart, a stride the hardware
// prefetchers follow poorly (without this the K/V reads stalled on memory
// for a fifth of the many-rows kernel's time at depth 4096).
inline void prefetch_v_rows(const AttnRows& a, int64_t j0, int64_t j1) {
    const int64_t es = kv_elem_bytes(a);
    for (int64_t j = j0; j < j1; ++j)
        prefetch_lines(static_cast<const char*>(a.v) + v_elem(a, j) * es, a.hd * es);
}
// The same for K: key j's block of this head (hd x kKBlockCells elements,
// contiguous), so it is in cache when the scores reach it.
inline void prefetch_k_block(const AttnRows& a, int64_t j) {
    const int64_t es = kv_elem_bytes(a);
    const int64_t cell0 = kv_cell(a, j) / graph::kKBlockCells * graph::kKBlockCells;
    prefetch_lines(static_cast<const char*>(a.k) + graph::k_index(cell0, a.off, a.kv_row) * es,
                   a.hd * graph::kKBlockCells * es);
}

// ---- many query rows at once, 8 rows per vector ----
// Keys go in blocks of kKeyBlock (one K block of the cache): a block's K
// (and in the second pass its V rows) is converted from an f16 cache into a
// small scratch, or read in place from an f32 cache, so each is read from
// memory once per call and
// stays in L1 while every 8-row vector of the call uses it (the whole run
// converted up front, 2 x 2 MB a KV head at depth 4096, was read back from
// L3 by every vector).
constexpr int64_t kKeyBlock = 32;

// K of keys [j0, j0 + n) (j0 a multiple of kKeyBlock) as floats,
// dim-major [hd][kKeyBlock]: in place when the cache is f32 and the keys
// are one K block of it, else converted into buf. Keys past n_kv_max (their
// scores are masked) hold what the block holds, or zero in buf.
static_assert(kKeyBlock == graph::kKBlockCells);
MINFER_TARGET_AVX2 const float* key_block_dims(const AttnRows& a, int64_t j0, int64_t n,
                                               int64_t n_kv_max, float* buf) {
    if (j0 + kKeyBlock < n_kv_max) prefetch_k_block(a, j0 + kKeyBlock);
    if (!a.f16 && kv_cell(a, j0) % kKeyBlock == 0 && (!a.pages || a.page_cells % kKeyBlock == 0))
        return static_cast<const float*>(a.k) + k_elem(a, j0);
    const int64_t live = std::min(j0 + n, n_kv_max);
    gather_k_dims(a, j0, live, buf, kKeyBlock);
    for (int64_t d = 0; d < a.hd; ++d)
        std::fill(buf + d * kKeyBlock + (live - j0), buf + d * kKeyBlock + n, 0.0f);
    return buf;
}

// Row pointers (floats) of the V rows of keys [j0, j0 + n): into the cache
// (f32) or converted into buf [n][hd] (f16).
MINFER_TARGET_AVX2 void value_block_rows(const AttnRows& a, int64_t j0, int64_t n, int64_t n_kv_max,
                                         float* buf, const float** rows) {
    prefetch_v_rows(a, j0 + n, std::min(j0 + 2 * n, n_kv_max));
    for (int64_t l = 0; l < n; ++l) {
        const int64_t e = v_elem(a, j0 + l);
        if (!a.f16) {
            rows[l] = static_cast<const float*>(a.v) + e;
            continue;
        }
        for (int64_t d = 0; d < a.hd; d += 8)
            _mm256_storeu_ps(buf + l * a.hd + d, load8(true, a.v, e + d));
        rows[l] = buf + l * a.hd;
    }
}

// Scores of NR 8-row blocks (qt: the first's q^T, the next hd * 8 floats
// on; row_kv, st: from the first's rows) against keys [j0, j0 + count) (kt:
// their K, dim-major [hd][kKeyBlock]; count a multiple of kKeysPerStep):
// st[j][lane] = q_lane . k_j * scale (one FMA chain over d), or -inf for
// keys at or past the lane's n_kv. Two blocks give 8 independent chains,
// enough to cover the FMA latency (4 leave half the FMA slots idle); a
// score's chain is the same whatever NR is.
template <int NR>
MINFER_TARGET_AVX2 void rows_scores_block_avx2(const float* qt, int64_t hd, const float* kt,
                                               int64_t j0, int64_t count, const int32_t* row_kv,
                                               float scale, float* st, int64_t st_stride) {
    const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t j = 0; j < count; j += kKeysPerStep) {
        __m256 acc[NR][kKeysPerStep];
        for (int r = 0; r < NR; ++r)
            for (int u = 0; u < kKeysPerStep; ++u) acc[r][u] = _mm256_setzero_ps();
        for (int64_t d = 0; d < hd; ++d) {
            __m256 qd[NR];
            for (int r = 0; r < NR; ++r) qd[r] = _mm256_loadu_ps(qt + (r * hd + d) * 8);
            const float* kd = kt + d * kKeyBlock + j;
            for (int u = 0; u < kKeysPerStep; ++u) {
                const __m256 k = _mm256_broadcast_ss(kd + u);
                for (int r = 0; r < NR; ++r) acc[r][u] = _mm256_fmadd_ps(qd[r], k, acc[r][u]);
            }
        }
        for (int r = 0; r < NR; ++r) {
            const __m256i lane_kv =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row_kv + 8 * r));
            for (int u = 0; u < kKeysPerStep; ++u) {
                const int64_t key = j0 + j + u;
                const __m256 live = _mm256_castsi256_ps(
                    _mm256_cmpgt_epi32(lane_kv, _mm256_set1_epi32(static_cast<int32_t>(key))));
                _mm256_storeu_ps(st + key * st_stride + 8 * r,
                                 _mm256_blendv_ps(ninf, _mm256_mul_ps(acc[r][u], vscale), live));
            }
        }
    }
}

// out[r] (+)= sum_j p[j][r] * v_j over keys [j0, j0 + count) (v[l]: key j0
// + l's row), R rows x 2 vectors of the head in registers at a time; the
// first key block starts from zero, later ones from what out holds (a
// float stored and reloaded: the FMA chain over keys is unchanged).
template <int R>
MINFER_TARGET_AVX2 void rows_pv_block_avx2(const float* p, int64_t p_stride, const float* const* v,
                                           int64_t j0, int64_t count, int64_t hd,
                                           float* const* out) {
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

MINFER_TARGET_AVX2 void attn_rows_avx2(const AttnRows& a, float* scratch) {
    const int64_t hd = a.hd, rows = a.n_tokens * a.group, nrv = (rows + 7) / 8;
    int64_t n_kv_max = 0;
    for (int64_t i = 0; i < a.n_tokens; ++i) n_kv_max = std::max<int64_t>(n_kv_max, a.n_kv[i]);
    const int64_t n_kv_pad = (n_kv_max + kKeysPerStep - 1) / kKeysPerStep * kKeysPerStep;
    // scratch (fits attn_rows_scratch_floats, sized for 16 lanes): q^T
    // [nrv][hd][8] | scores [n_kv_pad][nrv * 8] | row n_kv [nrv * 8] | one
    // key block of K or V as floats ([hd][kKeyBlock] or [kKeyBlock][hd])
    float* qt = scratch;
    float* st = qt + nrv * hd * 8;
    const int64_t st_stride = nrv * 8;
    auto* row_kv = reinterpret_cast<int32_t*>(st + n_kv_pad * st_stride);
    float* buf = reinterpret_cast<float*>(row_kv + st_stride);
    const float* v_rows[kKeyBlock];

    transpose_q_rows(a, 8, st_stride, qt, row_kv);
    for (int64_t j0 = 0; j0 < n_kv_pad; j0 += kKeyBlock) {
        const int64_t n = std::min(kKeyBlock, n_kv_pad - j0);
        const float* kt = key_block_dims(a, j0, n, n_kv_max, buf);
        for (int64_t rv = 0; rv < nrv; rv += kScoreRowVecs) {
            const int64_t nv = std::min<int64_t>(kScoreRowVecs, nrv - rv);
            if (j0 >= rows_kv(row_kv, rv * 8, (rv + nv) * 8)) continue;
            const auto scores = nv == kScoreRowVecs ? &rows_scores_block_avx2<kScoreRowVecs>
                                                    : &rows_scores_block_avx2<1>;
            scores(qt + rv * hd * 8, hd, kt, j0, n, row_kv + rv * 8, a.scale, st + rv * 8,
                   st_stride);
        }
    }
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t rv = 0; rv < nrv; ++rv) {
        float* stv = st + rv * 8;
        const int64_t n_kv_rv = rows_kv(row_kv, rv * 8, rv * 8 + 8);
        // Softmax down each lane, as attn_rows_avx512.
        __m256 mx = ninf;
        for (int64_t j = 0; j < n_kv_rv; ++j)
            mx = _mm256_max_ps(mx, _mm256_loadu_ps(stv + j * st_stride));
        __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
        for (int64_t j0 = 0; j0 < n_kv_rv; j0 += 16) {
            __m256 part = _mm256_setzero_ps();
            for (int64_t j = j0; j < std::min(n_kv_rv, j0 + 16); ++j) {
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
        for (int64_t j = 0; j < n_kv_rv; ++j) {
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
        value_block_rows(a, j0, n, n_kv_max, buf, v_rows);
        for (int64_t r0 = 0; r0 < rows; r0 += kPvRows) {
            const int nr = static_cast<int>(std::min<int64_t>(kPvRows, rows - r0));
            int64_t n_kv = 0;
            for (int i = 0; i < nr; ++i) n_kv = std::max<int64_t>(n_kv, row_kv[r0 + i]);
            const int64_t count = std::min(n, n_kv - j0);
            if (count > 0)
                kRowsPv[static_cast<size_t>(nr - 1)](st + r0, st_stride, v_rows, j0, count, hd,
                                                     outs + r0);
        }
    }
}

// ---- few query rows (a decode token): keys in the lanes ----
// A decode token brings `group` rows (2 for qwen3), which would fill 2 of
// the 8 or 16 lanes of the many-rows kernels and make them convert and
// copy the whole K/V run for a few FMAs per key. Here 8 keys (16 at
// AVX-512) share a vector instead: the cache holds one dim of a head over
// consecutive cells side by side (ir/kv_layout.h), so a vector of keys
// is one load (and conversion) per dim, and each row's scores take one FMA
// per dim: per (row, key) the same FMA chain as the many-rows kernels (d
// ascending from zero, then times scale), the same softmax sums (each 16
// keys in float in key order, then in double) and the same P V chain per
// output (keys ascending from zero). So a token's output is bitwise the
// same whichever kernel its pass picks (batch invariance).
// At most kFewRows rows (Qwen2.5's 7-head groups fit): R accumulators a
// vector of keys, a vector of K and a broadcast q fit AVX2's 16 registers.
constexpr int64_t kFewRows = 8;

// st[r][j] (row stride sst) = q_r . k_j * scale for keys [0, n_kv_max)
// rounded up to a K block, -inf past row r's key count; qr [rows][hd]
// already f16-rounded as needed. A step takes NB vectors of 8 keys (j0 a
// multiple of 8 * NB: consecutive cells of one K block, as pages hold whole
// blocks), so 2R..4R independent FMA chains keep the FMA units busy (R
// chains alone would wait on each FMA's latency). Keys past n_kv_max read
// whatever their cells hold and are masked.
template <int R>  // R rows: a constant, so the accumulators stay in registers
MINFER_TARGET_AVX2 void few_rows_scores_avx2(const AttnRows& a, const float* qr,
                                             const int32_t* row_kv, int64_t n_kv_max, float* st,
                                             int64_t sst) {
    constexpr int NB = R <= 2   ? 4
                       : R <= 4 ? 2
                                : 1;  // NB * R accumulators, NB keys: <= 13 registers
    constexpr int64_t B = graph::kKBlockCells;
    static_assert(B % (8 * NB) == 0);
    const int64_t hd = a.hd;
    const __m256 vscale = _mm256_set1_ps(a.scale), ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t es = kv_elem_bytes(a);
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += 8 * NB) {
        const int64_t first = k_elem(a, j0);
        const int64_t jn = j0 / B * B + B;  // the next block, fetched a line per dim
        const char* next =
            jn < n_kv_max ? static_cast<const char*>(a.k) + (k_elem(a, jn) + j0 % B) * es : nullptr;
        __m256 acc[NB][R];
        for (int b = 0; b < NB; ++b)
            for (int r = 0; r < R; ++r) acc[b][r] = _mm256_setzero_ps();
        for (int64_t d = 0; d < hd; ++d) {
            if (next) prefetch_lines(next + d * B * es, 8 * NB * es);
            __m256 kd[NB];
            for (int b = 0; b < NB; ++b) kd[b] = load8(a.f16, a.k, first + d * B + 8 * b);
            for (int r = 0; r < R; ++r) {
                const __m256 qd = _mm256_broadcast_ss(qr + r * hd + d);
                for (int b = 0; b < NB; ++b) acc[b][r] = _mm256_fmadd_ps(qd, kd[b], acc[b][r]);
            }
        }
        for (int b = 0; b < NB; ++b) {
            const __m256i key =
                _mm256_add_epi32(lane, _mm256_set1_epi32(static_cast<int32_t>(j0 + 8 * b)));
            for (int r = 0; r < R; ++r) {
                const __m256 live =
                    _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(row_kv[r]), key));
                _mm256_storeu_ps(st + r * sst + j0 + 8 * b,
                                 _mm256_blendv_ps(ninf, _mm256_mul_ps(acc[b][r], vscale), live));
            }
        }
    }
}

// The AVX-512 level's scores: a whole K block a step (2 vectors of 16
// keys, 2R chains), the same FMA chain per (row, key).
template <int R>
MINFER_TARGET_AVX512 void few_rows_scores_avx512(const AttnRows& a, const float* qr,
                                                 const int32_t* row_kv, int64_t n_kv_max, float* st,
                                                 int64_t sst) {
    constexpr int NB = 2;
    constexpr int64_t B = graph::kKBlockCells;
    static_assert(B == 16 * NB);
    const int64_t hd = a.hd;
    const __m512 vscale = _mm512_set1_ps(a.scale), ninf = _mm512_set1_ps(-INFINITY);
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int64_t es = kv_elem_bytes(a);
    for (int64_t j0 = 0; j0 < n_kv_max; j0 += B) {
        const int64_t first = k_elem(a, j0);
        const char* next =
            j0 + B < n_kv_max ? static_cast<const char*>(a.k) + k_elem(a, j0 + B) * es : nullptr;
        __m512 acc[NB][R];
        for (int b = 0; b < NB; ++b)
            for (int r = 0; r < R; ++r) acc[b][r] = _mm512_setzero_ps();
        for (int64_t d = 0; d < hd; ++d) {
            if (next) prefetch_lines(next + d * B * es, B * es);
            __m512 kd[NB];
            for (int b = 0; b < NB; ++b) kd[b] = load16(a.f16, a.k, first + d * B + 16 * b);
            for (int r = 0; r < R; ++r) {
                const __m512 qd = _mm512_set1_ps(qr[r * hd + d]);
                for (int b = 0; b < NB; ++b) acc[b][r] = _mm512_fmadd_ps(qd, kd[b], acc[b][r]);
            }
        }
        for (int b = 0; b < NB; ++b) {
            const __m512i key =
                _mm512_add_epi32(lane, _mm512_set1_epi32(static_cast<int32_t>(j0 + 16 * b)));
            for (int r = 0; r < R; ++r) {
                const __mmask16 live = _mm512_cmplt_epi32_mask(key, _mm512_set1_epi32(row_kv[r]));
                _mm512_storeu_ps(
                    st + r * sst + j0 + 16 * b,
                    _mm512_mask_blend_ps(live, ninf, _mm512_mul_ps(acc[b][r], vscale)));
            }
        }
    }
}

// out_r[c0 * 16 ..] (+)= sum_j p_r[j] v_j over keys [j0, j1), NC 16-float
// vectors of the head: per output the chain of few_rows_pv_block_avx2.
template <int NC, int R>
MINFER_TARGET_AVX512 void few_rows_pv_block_avx512(const AttnRows& a, const float* p, int64_t sp,
                                                   const int64_t* e, const int64_t* en,
                                                   int64_t n_next, int64_t j0, int64_t j1, int c0,
                                                   float* const* out) {
    const int64_t es = kv_elem_bytes(a);
    const char* vb = static_cast<const char*>(a.v);
    __m512 acc[R][NC];
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u)
            acc[r][u] = j0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(out[r] + 16 * (c0 + u));
    for (int64_t j = j0; j < j1; ++j) {
        if (j - j0 < n_next) prefetch_lines(vb + (en[j - j0] + 16 * c0) * es, NC * 16 * es);
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
MINFER_TARGET_AVX2 void exp_run_avx2(float* s, int64_t n, float mx) {
    const __m256 vm = _mm256_set1_ps(mx);
    for (int64_t j = 0; j < n; j += 8)
        _mm256_storeu_ps(s + j, simd::exp8_ps(_mm256_sub_ps(_mm256_loadu_ps(s + j), vm)));
}
MINFER_TARGET_AVX512 void exp_run_avx512(float* s, int64_t n, float mx) {
    const __m512 vm = _mm512_set1_ps(mx);
    for (int64_t j = 0; j < n; j += 16)
        _mm512_storeu_ps(s + j, simd::exp_ps(_mm512_sub_ps(_mm512_loadu_ps(s + j), vm)));
}

// out_r[c0 * 8 ..] (+)= sum_j p_r[j] v_j over keys [j0, j1), NC vectors of
// the head, the rows' accumulators in registers (reloaded from out after
// the first key block: a float store and load change nothing).
template <int NC, int R, bool F16>
MINFER_TARGET_AVX2 void few_rows_pv_block_avx2(const AttnRows& a, const float* p, int64_t sp,
                                               const int64_t* e, const int64_t* en, int64_t n_next,
                                               int64_t j0, int64_t j1, int c0, float* const* out) {
    constexpr int64_t es = F16 ? 2 : 4;
    const char* vb = static_cast<const char*>(a.v);
    __m256 acc[R][NC];
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u)
            acc[r][u] = j0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(out[r] + 8 * (c0 + u));
    for (int64_t j = j0; j < j1; ++j) {
        if (j - j0 < n_next) prefetch_lines(vb + (en[j - j0] + 8 * c0) * es, NC * 8 * es);
        __m256 vv[NC];
        for (int u = 0; u < NC; ++u) vv[u] = load8(F16, a.v, e[j - j0] + 8 * (c0 + u));
        for (int r = 0; r < R; ++r) {
            const __m256 pj = _mm256_broadcast_ss(p + r * sp + j);
            for (int u = 0; u < NC; ++u) acc[r][u] = _mm256_fmadd_ps(pj, vv[u], acc[r][u]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int u = 0; u < NC; ++u) _mm256_storeu_ps(out[r] + 8 * (c0 + u), acc[r][u]);
}
template <int NC, int R>
MINFER_TARGET_AVX2 void few_rows_pv_block_avx2(const AttnRows& a, const float* p, int64_t sp,
                                               const int64_t* e, const int64_t* en, int64_t n_next,
                                               int64_t j0, int64_t j1, int c0, float* const* out) {
    if (a.f16)
        few_rows_pv_block_avx2<NC, R, true>(a, p, sp, e, en, n_next, j0, j1, c0, out);
    else
        few_rows_pv_block_avx2<NC, R, false>(a, p, sp, e, en, n_next, j0, j1, c0, out);
}

// P V for all rows over keys [0, n_kv): key blocks of 64, so a block's V
// rows (16-32 KB of one head) stay in L1 while the column chunks of NC
// vectors of kLanes floats pass over them (Block: NC vectors, One: one).
// While a chunk passes over key j it asks for the same columns of key j +
// 64 (en: the next block's rows), so the next block arrives a line at a
// time, a block ahead. (All of the next block's lines asked for at the
// start of a block queued behind the loads that needed data now: decode
// attention 1.3-2x slower in BM_AttnDepth / BM_AttnDecodeCold; the scores
// fetch the next K block the same way, a line per dim.)
template <int NC, int64_t kLanes, auto Block, auto One>
void few_rows_pv_run(const AttnRows& a, const float* p, int64_t sp, int64_t n_kv,
                     float* const* out) {
    constexpr int64_t kBlock = 64;
    const int nv = static_cast<int>(a.hd / kLanes);
    int64_t e[kBlock], en[kBlock];
    for (int64_t j = 0; j < std::min(n_kv, kBlock); ++j) en[j] = v_elem(a, j);
    for (int64_t j0 = 0; j0 < n_kv; j0 += kBlock) {
        const int64_t j1 = std::min(n_kv, j0 + kBlock);
        std::copy(en, en + (j1 - j0), e);
        const int64_t n_next = std::min(n_kv - j1, kBlock);
        for (int64_t j = j1; j < j1 + n_next; ++j) en[j - j1] = v_elem(a, j);
        int c0 = 0;
        for (; c0 + NC <= nv; c0 += NC) Block(a, p, sp, e, en, n_next, j0, j1, c0, out);
        for (; c0 < nv; ++c0) One(a, p, sp, e, en, n_next, j0, j1, c0, out);
    }
}

// The level's scores and P V kernels for `rows` rows (1 .. kFewRows).
template <int R>
void few_rows_scores_r(bool wide, const AttnRows& a, const float* qr, const int32_t* row_kv,
                       int64_t n_kv_max, float* st, int64_t sst) {
    if (wide)
        few_rows_scores_avx512<R>(a, qr, row_kv, n_kv_max, st, sst);
    else
        few_rows_scores_avx2<R>(a, qr, row_kv, n_kv_max, st, sst);
}
template <int R>
void few_rows_pv_r(bool wide, const AttnRows& a, const float* p, int64_t sp, int64_t n_kv,
                   float* const* out) {
    // Accumulators a row: AVX2 (16 registers) 4 vectors for 1-2 rows, 2 for
    // 3-4, 1 for 5-8; AVX-512 (32) 8 (a 128-dim head), 4 and 2 for 1-2,
    // 3-4, 5-8 rows.
    if (wide) {
        constexpr int NC = R <= 2 ? 8 : R <= 4 ? 4 : 2;
        few_rows_pv_run<NC, 16, &few_rows_pv_block_avx512<NC, R>, &few_rows_pv_block_avx512<1, R>>(
            a, p, sp, n_kv, out);
    } else {
        constexpr int NC = R <= 2 ? 4 : R <= 4 ? 2 : 1;
        few_rows_pv_run<NC, 8, &few_rows_pv_block_avx2<NC, R>, &few_rows_pv_block_avx2<1, R>>(
            a, p, sp, n_kv, out);
    }
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
constexpr auto kFewRowsKernels = few_rows_table(std::make_integer_sequence<int, kFewRows>{});

// The kernel for at most kFewRows rows.
// `wide`: the AVX-512 level (16-key scores, 16-float P V, its exp), else
// AVX2. Both give the same bits but for the exp, which is the level's
// many-rows kernel's.
MINFER_TARGET_AVX2 void attn_few_rows(const AttnRows& a, float* scratch, bool wide) {
    const int64_t hd = a.hd;
    const int rows = static_cast<int>(a.n_tokens * a.group);
    MINFER_ASSERT(rows >= 1 && rows <= kFewRows);
    int64_t n_kv_max = 0;
    int32_t row_kv[kFewRows];
    for (int r = 0; r < rows; ++r) {
        row_kv[r] = a.n_kv[r / a.group];
        n_kv_max = std::max<int64_t>(n_kv_max, row_kv[r]);
    }
    // scratch (within attn_rows_scratch_floats): q rows [rows][hd] | scores
    // [rows][sst], each row padded with -inf to a whole K block of keys
    const int64_t sst =
        (n_kv_max + graph::kKBlockCells - 1) / graph::kKBlockCells * graph::kKBlockCells;
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
    float* outs[kFewRows];
    for (int r = 0; r < rows; ++r)
        outs[r] = a.out + (r / a.group) * a.out_stride + (r % a.group) * hd;
    kFewRowsKernels[static_cast<size_t>(rows - 1)].pv(wide, a, st, sst, n_kv_max, outs);
}

// One level's attention: a few rows take the kernels that keep a row per
// vector, more rows the transposed ones (16 lanes at Avx512, 8 at Avx2).
void attn_rows_avx512_level(const AttnRows& a, float* scratch) {
    if (a.n_tokens * a.group <= kFewRows)
        attn_few_rows(a, scratch, true);
    else
        attn_rows_avx512(a, scratch);
}

void attn_rows_avx2_level(const AttnRows& a, float* scratch) {
    if (a.n_tokens * a.group <= kFewRows)
        attn_few_rows(a, scratch, false);
    else
        attn_rows_avx2(a, scratch);
}

}  // namespace

// ---- K rows into the cache (attn.h: StoreKCellsFn) ----
// 8 rows x 8 elements through an 8 x 8 transpose: a vector per element
// holds its 8 cells, which the K layout keeps side by side. An f16 cache
// takes vcvtps2ph (round to nearest even, as fp32_to_fp16) with a NaN
// made fp32_to_fp16's quiet NaN (sign | 0x7E00) instead of the payload
// vcvtps2ph keeps.
MINFER_TARGET_AVX2 void store_k_cells_avx2(tensor::DType kv_type, const float* src,
                                           int64_t src_stride, int64_t n, void* region,
                                           int64_t cell0, int64_t n_kv) {
    const bool f16 = kv_type == tensor::DType::F16;
    int64_t r0 = 0;
    if (n_kv % 8 == 0)
        for (; r0 + 8 <= n; r0 += 8) {
            const int64_t first = graph::k_index(cell0 + r0, 0, n_kv);
            for (int64_t e0 = 0; e0 < n_kv; e0 += 8) {
                __m256i v[8];
                for (int i = 0; i < 8; ++i)
                    v[i] = _mm256_castps_si256(_mm256_loadu_ps(src + (r0 + i) * src_stride + e0));
                simd::transpose8x8(v);
                for (int l = 0; l < 8; ++l) {
                    const int64_t at = first + (e0 + l) * graph::kKBlockCells;
                    const __m256 x = _mm256_castsi256_ps(v[l]);
                    if (!f16) {
                        _mm256_storeu_ps(static_cast<float*>(region) + at, x);
                        continue;
                    }
                    __m128i h = _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
                    const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
                    if (!_mm256_testz_ps(nan, nan)) {
                        const __m128i sign =
                            _mm_and_si128(h, _mm_set1_epi16(static_cast<short>(0x8000)));
                        const __m128i quiet = _mm_or_si128(sign, _mm_set1_epi16(0x7E00));
                        const __m128i mask =
                            _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                            _mm256_extracti128_si256(_mm256_castps_si256(nan), 1));
                        h = _mm_blendv_epi8(h, quiet, mask);
                    }
                    _mm_storeu_si128(
                        reinterpret_cast<__m128i*>(static_cast<uint16_t*>(region) + at), h);
                }
            }
        }
    for (; r0 < n; ++r0) store_k_row(kv_type, src + r0 * src_stride, region, cell0 + r0, n_kv);
}

StoreKCellsFn store_k_cells_at(IsaLevel level) {
    if (level == IsaLevel::Avx512 || level == IsaLevel::Avx2) return store_k_cells_avx2;
    return nullptr;
}

AttnRowsFn attn_rows_at(IsaLevel level) {
    if (level == IsaLevel::Avx512) return attn_rows_avx512_level;
    if (level == IsaLevel::Avx2) return attn_rows_avx2_level;
    return nullptr;
}

bool attn_simd_supported(int64_t hd) {
    return kernels().attn_rows != nullptr && hd > 0 && hd % 16 == 0 && hd / 16 <= kMaxVecs;
}

void attn_rows_simd(const AttnRows& a, float* scratch) {
    MINFER_ASSERT(a.n_tokens * a.group <= kMaxRows);
    kernels().attn_rows(a, scratch);
}

}  // namespace minfer::cpu

#endif
