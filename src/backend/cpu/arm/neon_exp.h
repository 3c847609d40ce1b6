// exp on NEON vectors for the ARM64 kernels (internal to src/backend/cpu/arm;
// include only under #if defined(__aarch64__)).
#pragma once

#include <arm_neon.h>

namespace minfer::cpu::arm {

// 2^n for integral n in [-126, 127], as float bits.
inline float32x4_t pow2i(int32x4_t n) {
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(n, vdupq_n_s32(127)), 23));
}

// exp(x): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by its degree-6 Taylor
// polynomial (truncation <= 1.3e-7 relative, about one ulp; the same scheme
// as the AVX-512 simd::exp_ps), times 2^n applied in two halves so n down to
// -150 underflows gradually to 0 and n up to 128 overflows to inf.
inline float32x4_t exp_ps(float32x4_t x) {
    x = vmaxq_f32(vminq_f32(x, vdupq_n_f32(89.0f)), vdupq_n_f32(-104.0f));
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187045e-06f));
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t ni = vcvtq_s32_f32(n);
    const int32x4_t n1 = vshrq_n_s32(ni, 1);  // floor(n / 2)
    const int32x4_t n2 = vsubq_s32(ni, n1);
    return vmulq_f32(vmulq_f32(p, pow2i(n1)), pow2i(n2));
}

}  // namespace minfer::cpu::arm
