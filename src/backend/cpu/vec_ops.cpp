#include "backend/cpu/vec_ops.h"

#include <algorithm>
#include <cmath>

#include "backend/cpu/arm/neon.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/x86/intrinsics.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define MINFER_VEC_X86 1
#include "backend/cpu/simd_exp.h"
#endif

namespace minfer::cpu {

namespace {

void swiglu_scalar(const float* a, const float* b, float* y, int64_t i, int64_t n) {
    for (; i < n; ++i) {
        const float s = a[i] / (1.0f + std::exp(-a[i]));
        y[i] = b ? s * b[i] : s;
    }
}

double sum_squares_scalar(const float* x, int64_t n) {
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
    return sum;
}

#ifdef MINFER_VEC_X86
MINFER_TARGET_AVX512 void swiglu_avx512(const float* a, const float* b, float* y, int64_t n) {
    int64_t i = 0;
    const __m512 one = _mm512_set1_ps(1.0f);
    for (; i + 16 <= n; i += 16) {
        const __m512 x = _mm512_loadu_ps(a + i);
        const __m512 e = simd::exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), x));
        __m512 r = _mm512_div_ps(x, _mm512_add_ps(one, e));
        if (b) r = _mm512_mul_ps(r, _mm512_loadu_ps(b + i));
        _mm512_storeu_ps(y + i, r);
    }
    swiglu_scalar(a, b, y, i, n);
}

MINFER_TARGET_AVX512 double sum_squares_avx512(const float* x, int64_t n) {
    __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        const __m512 sq = _mm512_mul_ps(v, v);
        lo = _mm512_add_pd(lo, _mm512_cvtps_pd(_mm512_castps512_ps256(sq)));
        hi = _mm512_add_pd(hi, _mm512_cvtps_pd(_mm512_extractf32x8_ps(sq, 1)));
    }
    double sum = _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
    for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
    return sum;
}

// The AVX2 level: the same arithmetic on 8 lanes.

MINFER_TARGET_AVX2 void swiglu_avx2(const float* a, const float* b, float* y, int64_t n) {
    int64_t i = 0;
    const __m256 one = _mm256_set1_ps(1.0f);
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(a + i);
        const __m256 e = simd::exp8_ps(_mm256_sub_ps(_mm256_setzero_ps(), x));
        __m256 r = _mm256_div_ps(x, _mm256_add_ps(one, e));
        if (b) r = _mm256_mul_ps(r, _mm256_loadu_ps(b + i));
        _mm256_storeu_ps(y + i, r);
    }
    swiglu_scalar(a, b, y, i, n);
}

MINFER_TARGET_AVX2 double sum_squares_avx2(const float* x, int64_t n) {
    __m256d lo = _mm256_setzero_pd(), hi = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        lo = _mm256_add_pd(lo, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        hi = _mm256_add_pd(hi, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    alignas(32) double l[4];
    _mm256_store_pd(l, _mm256_add_pd(lo, hi));
    double sum = (l[0] + l[1]) + (l[2] + l[3]);
    for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
    return sum;
}
#endif

}  // namespace

SwigluFn swiglu_at(IsaLevel level) {
#if defined(__aarch64__)
    if (level != IsaLevel::Scalar) return arm::swiglu_row_neon;
#endif
#ifdef MINFER_VEC_X86
    if (level == IsaLevel::Avx512) return swiglu_avx512;
    if (level == IsaLevel::Avx2) return swiglu_avx2;
#endif
    (void)level;
    return
        [](const float* a, const float* b, float* y, int64_t n) { swiglu_scalar(a, b, y, 0, n); };
}

SumSquaresFn sum_squares_at(IsaLevel level) {
#if defined(__aarch64__)
    if (level != IsaLevel::Scalar) return arm::sum_squares_neon;
#endif
#ifdef MINFER_VEC_X86
    if (level == IsaLevel::Avx512) return sum_squares_avx512;
    if (level == IsaLevel::Avx2) return sum_squares_avx2;
#endif
    (void)level;
    return sum_squares_scalar;
}

void swiglu_row(const float* a, const float* b, float* y, int64_t n) {
    kernels().swiglu(a, b, y, n);
}

void swiglu_tile(float* gate, const float* up, int64_t n_tokens, int64_t width, float* out,
                 int64_t out_stride) {
    if (width % 16 == 0) {
        swiglu_row(gate, up, gate, n_tokens * width);
    } else {
        for (int64_t t = 0; t < n_tokens; ++t)
            swiglu_row(gate + t * width, up + t * width, gate + t * width, width);
    }
    for (int64_t t = 0; t < n_tokens; ++t)
        std::copy(gate + t * width, gate + (t + 1) * width, out + t * out_stride);
}

double sum_squares(const float* x, int64_t n) {
    return kernels().sum_squares(x, n);
}

}  // namespace minfer::cpu
