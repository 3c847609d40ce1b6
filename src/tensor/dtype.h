// Tensor element types. The numeric values are ggml's type ids, because they
// are what a GGUF file stores; block layouts are byte-identical to ggml's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace minfer::tensor {

enum class DType : uint32_t {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ4_NL = 20,
    IQ4_XS = 23,
    I32 = 26,
    BF16 = 30,
};

struct DTypeTraits {
    DType type;
    std::string_view name;  // as ggml spells it: "q4_K", "f16", ...
    int64_t block_size;     // elements per block (1 for plain types)
    size_t type_size;       // bytes per block
    bool quantized;
};

// nullptr for an id that is not a type minfer knows (the GGUF reader refuses
// such tensors, naming the id).
const DTypeTraits* dtype_traits(uint32_t ggml_id);
const DTypeTraits& traits(DType t);
inline std::string_view dtype_name(DType t) {
    return traits(t).name;
}
// Case-insensitive lookup by ggml name ("Q4_K", "q8_0", "F16", "bf16").
std::optional<DType> dtype_from_name(std::string_view name);

// Bytes of a row of n elements; n must be a multiple of the block size
// (callers validate that first: see row_size_checked in the GGUF reader).
inline size_t row_size(DType t, int64_t n) {
    const DTypeTraits& tr = traits(t);
    return static_cast<size_t>(n / tr.block_size) * tr.type_size;
}

// ---- scalar half-precision conversions (bit-exact with ggml's) -----------
inline float fp32_from_bits(uint32_t w) {
    float f;
    std::memcpy(&f, &w, 4);
    return f;
}
inline uint32_t fp32_to_bits(float f) {
    uint32_t w;
    std::memcpy(&w, &f, 4);
    return w;
}

// IEEE half -> float, exact for every input (subnormals, inf, nan).
inline float fp16_to_fp32(uint16_t h) {
    const uint32_t w = static_cast<uint32_t>(h) << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    const float normalized = fp32_from_bits((two_w >> 4) + exp_offset) * exp_scale;
    const uint32_t magic_mask = 126u << 23;
    const float magic_bias = 0.5f;
    const float denormalized = fp32_from_bits((two_w >> 17) | magic_mask) - magic_bias;
    const uint32_t denormalized_cutoff = 1u << 27;
    const uint32_t result = sign | (two_w < denormalized_cutoff ? fp32_to_bits(denormalized)
                                                                : fp32_to_bits(normalized));
    return fp32_from_bits(result);
}

// float -> IEEE half, round to nearest even (ggml's GGML_FP32_TO_FP16 on CPUs
// without F16C gives the same bits).
inline uint16_t fp32_to_fp16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (f < 0 ? -f : f) * scale_to_inf * scale_to_zero;
    const uint32_t w = fp32_to_bits(f);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = fp32_from_bits((bias >> 1) + 0x07800000u) + base;
    const uint32_t bits = fp32_to_bits(base);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

inline float bf16_to_fp32(uint16_t h) {
    return fp32_from_bits(static_cast<uint32_t>(h) << 16);
}

// Round to nearest even; NaN stays a (quiet) NaN — ggml's rule.
inline uint16_t fp32_to_bf16(float f) {
    uint32_t u = fp32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);
    return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

}  // namespace minfer::tensor
