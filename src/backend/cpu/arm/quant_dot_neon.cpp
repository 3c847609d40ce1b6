// NEON and sdot dot products of quantized weight rows with Q8_0 / Q8_K
// activation rows (kernel bodies in quant_dot_neon.inc, compiled once per
// level). Types without a kernel here (Q4_1, Q5_1, Q2_K, Q3_K, IQ4_NL,
// IQ4_XS, F16, BF16, F32) keep the portable kernels, which GCC
// auto-vectorizes for the ARMv8.0 baseline.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/arm/neon.h"
#include "backend/cpu/isa.h"
#include "tensor/blocks.h"

namespace minfer::cpu::arm {

using namespace tensor;

namespace {

inline float h2f(f16_t h) {
    return fp16_to_fp32(h);
}

// Plain NEON (ARMv8.0): widening multiplies into int16, pairwise added into
// int32. |product| <= 128 * 127, so the int16 lanes cannot overflow.
namespace plain {
inline int32x4_t mac(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#include "backend/cpu/arm/quant_dot_neon.inc"
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
// ARMv8.2 dot product: sdot adds four int8 products into each int32 lane.
namespace sdot {
inline int32x4_t mac(int32x4_t acc, int8x16_t a, int8x16_t b) {
    return vdotq_s32(acc, a, b);
}
#include "backend/cpu/arm/quant_dot_neon.inc"
}  // namespace sdot
#pragma GCC pop_options

}  // namespace

VecDotFn vec_dot_neon(IsaLevel level, DType w) {
    // The i8mm level keeps the sdot kernels here: smmla multiplies two
    // tokens at once, so one token's dot product would waste half of it
    // (the prompt GEMM, arm/gemm_neon.cpp, pairs tokens for it).
    const bool dot = level == IsaLevel::Dotprod || level == IsaLevel::I8mm;
    if (!dot && level != IsaLevel::Neon) return nullptr;
    switch (w) {
        case DType::Q8_0:
            return dot ? sdot::dot_q8_0 : plain::dot_q8_0;
        case DType::Q4_0:
            return dot ? sdot::dot_q4_0 : plain::dot_q4_0;
        case DType::Q5_0:
            return dot ? sdot::dot_q5_0 : plain::dot_q5_0;
        case DType::Q4_K:
            return dot ? sdot::dot_q4_K : plain::dot_q4_K;
        case DType::Q5_K:
            return dot ? sdot::dot_q5_K : plain::dot_q5_K;
        case DType::Q6_K:
            return dot ? sdot::dot_q6_K : plain::dot_q6_K;
        default:
            return nullptr;
    }
}

}  // namespace minfer::cpu::arm

#endif  // __aarch64__
