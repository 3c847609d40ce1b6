// NEON row helpers (vec_ops.h): silu / SwiGLU and the sum of squares of
// rms_norm. NEON is part of the ARMv8-A baseline, so these need no target
// attribute; the scalar level's kernel table keeps the loops.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cmath>
#include <cstdint>

#include "backend/cpu/arm/neon.h"
#include "backend/cpu/arm/neon_exp.h"

namespace minfer::cpu::arm {

void swiglu_row_neon(const float* a, const float* b, float* y, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(a + i);
        float32x4_t r = vdivq_f32(x, vaddq_f32(one, exp_ps(vnegq_f32(x))));
        if (b) r = vmulq_f32(r, vld1q_f32(b + i));
        vst1q_f32(y + i, r);
    }
    for (; i < n; ++i) {
        const float s = a[i] / (1.0f + std::exp(-a[i]));
        y[i] = b ? s * b[i] : s;
    }
}

double sum_squares_neon(const float* x, int64_t n) {
    // each square in float, as the portable loop; the sum in 8 double lanes
    float64x2_t acc[4] = {vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0), vdupq_n_f64(0)};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float32x4_t v0 = vld1q_f32(x + i), v1 = vld1q_f32(x + i + 4);
        const float32x4_t s0 = vmulq_f32(v0, v0), s1 = vmulq_f32(v1, v1);
        acc[0] = vaddq_f64(acc[0], vcvt_f64_f32(vget_low_f32(s0)));
        acc[1] = vaddq_f64(acc[1], vcvt_high_f64_f32(s0));
        acc[2] = vaddq_f64(acc[2], vcvt_f64_f32(vget_low_f32(s1)));
        acc[3] = vaddq_f64(acc[3], vcvt_high_f64_f32(s1));
    }
    double sum = vaddvq_f64(vaddq_f64(vaddq_f64(acc[0], acc[1]), vaddq_f64(acc[2], acc[3])));
    for (; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
    return sum;
}

}  // namespace minfer::cpu::arm

#endif  // __aarch64__
