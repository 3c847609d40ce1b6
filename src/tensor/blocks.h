// Block layouts, byte-identical to ggml's (ggml-common.h). Sizes are checked
// by static_assert against the traits table in dtype.cpp.
#pragma once

#include <cstdint>

namespace minfer::tensor {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256;         // super-block size of the K-quants
constexpr int K_SCALE_SIZE = 12;  // packed 6-bit scales of Q4_K / Q5_K
constexpr int QK4_NL = 32;

using f16_t = uint16_t;  // IEEE half bits

struct block_q4_0 {
    f16_t d;                // delta
    uint8_t qs[QK4_0 / 2];  // nibbles: low = element j, high = element j + 16
};
struct block_q4_1 {
    f16_t d, m;
    uint8_t qs[QK4_1 / 2];
};
struct block_q5_0 {
    f16_t d;
    uint8_t qh[4];  // 5th bits
    uint8_t qs[QK5_0 / 2];
};
struct block_q5_1 {
    f16_t d, m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
struct block_q8_0 {
    f16_t d;
    int8_t qs[QK8_0];
};
struct block_q8_1 {
    f16_t d;  // delta
    f16_t s;  // d * sum(qs)
    int8_t qs[QK8_1];
};
struct block_q2_K {
    uint8_t scales[QK_K / 16];  // scales (low 4 bits) and mins (high 4 bits)
    uint8_t qs[QK_K / 4];       // 2-bit quants
    f16_t d, dmin;
};
struct block_q3_K {
    uint8_t hmask[QK_K / 8];  // high bit
    uint8_t qs[QK_K / 4];     // low 2 bits
    uint8_t scales[12];       // 6-bit scales, packed
    f16_t d;
};
struct block_q4_K {
    f16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];  // 8 x (6-bit scale, 6-bit min), packed
    uint8_t qs[QK_K / 2];
};
struct block_q5_K {
    f16_t d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
struct block_q6_K {
    uint8_t ql[QK_K / 2];      // low 4 bits
    uint8_t qh[QK_K / 4];      // high 2 bits
    int8_t scales[QK_K / 16];  // 8-bit scales
    f16_t d;
};
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];  // sums of groups of 16
};
struct block_iq4_nl {
    f16_t d;
    uint8_t qs[QK4_NL / 2];
};
struct block_iq4_xs {
    f16_t d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
};

static_assert(sizeof(block_q4_0) == 18);
static_assert(sizeof(block_q4_1) == 20);
static_assert(sizeof(block_q5_0) == 22);
static_assert(sizeof(block_q5_1) == 24);
static_assert(sizeof(block_q8_0) == 34);
static_assert(sizeof(block_q8_1) == 36);
static_assert(sizeof(block_q2_K) == 84);
static_assert(sizeof(block_q3_K) == 110);
static_assert(sizeof(block_q4_K) == 144);
static_assert(sizeof(block_q5_K) == 176);
static_assert(sizeof(block_q6_K) == 210);
static_assert(sizeof(block_q8_K) == 292);
static_assert(sizeof(block_iq4_nl) == 18);
static_assert(sizeof(block_iq4_xs) == 136);

// The 6-bit (scale, min) pair j of a Q4_K / Q5_K super-block's 12 packed
// scale bytes (ggml's get_scale_min_k4): the reference dequantizers and
// every CPU kernel level read them through this one function.
inline void get_scale_min_k4(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

// The non-linear 4-bit grid of IQ4_NL / IQ4_XS.
inline constexpr int8_t kvalues_iq4nl[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                             1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace minfer::tensor
