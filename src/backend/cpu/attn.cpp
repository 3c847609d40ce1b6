#include "backend/cpu/attn.h"

#include <cmath>

#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#define MINFER_ATTN_X86 1
#include "backend/cpu/simd_exp.h"
#endif

namespace minfer::cpu {

#ifdef MINFER_ATTN_X86
namespace {

bool has_avx512() {
    static const bool yes =
        __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    return yes;
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

}  // namespace

bool attn_simd_supported(int64_t hd) {
    return has_avx512() && hd % 16 == 0 && hd / 16 <= kMaxVecs;
}

void attn_head_simd(bool f16, const float* q, const void* k, const void* v, int64_t kv_row,
                    int64_t off, int64_t n_kv, int64_t hd, float scale, float* s, float* o) {
    attn_head_avx512(f16, q, k, v, kv_row, off, n_kv, hd, scale, s, o);
}

#else

bool attn_simd_supported(int64_t) {
    return false;
}

void attn_head_simd(bool, const float*, const void*, const void*, int64_t, int64_t, int64_t,
                    int64_t, float, float*, float*) {
    MINFER_ASSERT_MSG(false, "attn_head_simd without AVX-512");
}

#endif

}  // namespace minfer::cpu
