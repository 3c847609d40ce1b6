// Tests of tensor/quants: every type's dequantizer against blocks built by
// hand from the documented layout (the expected floats computed here from the
// format's formula, never by the code under test), and the quantizers'
// round-trip errors against bounds argued per type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "quants_golden.h"
#include "tensor/blocks.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"

using namespace minfer::tensor;

namespace {

// The IQ4_NL grid as ggml defines it, written out again so the test does not
// read the table under test.
constexpr int kIq4Grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};

std::vector<float> deq(DType t, const void* blocks, int64_t n) {
    std::vector<float> out(static_cast<size_t>(n));
    dequantize_row(t, blocks, out.data(), n);
    return out;
}

std::vector<uint8_t> quant(DType t, const std::vector<float>& x) {
    std::vector<uint8_t> q(row_size(t, static_cast<int64_t>(x.size())));
    quantize_row(t, x.data(), q.data(), static_cast<int64_t>(x.size()));
    return q;
}

std::vector<float> round_trip(DType t, const std::vector<float>& x) {
    auto q = quant(t, x);
    return deq(t, q.data(), static_cast<int64_t>(x.size()));
}

// Portable Gaussian (Box-Muller on mt19937 bits), so the data is the same
// with every standard library.
std::vector<float> gaussian(size_t n, uint32_t seed, float sigma = 1.0f) {
    std::mt19937 rng(seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = (rng() + 1.0) / 4294967297.0;
        const double u2 = (rng() + 0.5) / 4294967296.0;
        const double r = std::sqrt(-2.0 * std::log(u1));
        v[i] = static_cast<float>(sigma * r * std::cos(2 * M_PI * u2));
        if (i + 1 < n) v[i + 1] = static_cast<float>(sigma * r * std::sin(2 * M_PI * u2));
    }
    return v;
}

// Largest relative rounding error of a float -> half conversion (normal range).
constexpr float kHalfEps = 1.0f / 2048;

}  // namespace

// ---------------------------------------------------------------------------
// Dequantization of hand-built blocks. All scales are powers of two and all
// quants small integers, so every expected value is exact in float and the
// comparisons are exact.
// ---------------------------------------------------------------------------

TEST(Quants, DequantF32F16BF16) {
    const float f32[3] = {1.5f, -0.0f, 3e-39f};
    EXPECT_EQ(deq(DType::F32, f32, 3), std::vector<float>({1.5f, -0.0f, 3e-39f}));
    const uint16_t h[4] = {0x3c00, 0xc000, 0x0001, 0x7bff};  // 1, -2, 2^-24, 65504
    EXPECT_EQ(deq(DType::F16, h, 4),
              std::vector<float>({1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f}));
    const uint16_t b[3] = {0x3f80, 0xc040, 0x0080};  // 1, -3, 2^-126
    EXPECT_EQ(deq(DType::BF16, b, 3), std::vector<float>({1.0f, -3.0f, std::ldexp(1.0f, -126)}));
}

TEST(Quants, DequantQ4_0) {
    block_q4_0 b{};
    b.d = fp32_to_fp16(0.5f);
    // Element j (j < 16) is the low nibble of qs[j] and holds j; element
    // j + 16 is the high nibble and holds 15 - j.
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = deq(DType::Q4_0, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], (j - 8) * 0.5f) << j;
        EXPECT_EQ(y[j + 16], (15 - j - 8) * 0.5f) << j;
    }
}

TEST(Quants, DequantQ4_1) {
    block_q4_1 b{};
    b.d = fp32_to_fp16(0.25f);
    b.m = fp32_to_fp16(-1.0f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(((j * 3) % 16) | (j << 4));
    auto y = deq(DType::Q4_1, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], ((j * 3) % 16) * 0.25f - 1.0f);
        EXPECT_EQ(y[j + 16], j * 0.25f - 1.0f);
    }
}

// Q5: element k's low 4 bits in a nibble of qs (as Q4), its 5th bit is bit k
// of the little-endian 32-bit qh.
template <typename Block>
void pack_q5(Block& b, const int q[32]) {
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
        b.qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
        qh |= static_cast<uint32_t>(q[j] >> 4) << j;
        qh |= static_cast<uint32_t>(q[j + 16] >> 4) << (j + 16);
    }
    b.qh[0] = qh & 0xFF;
    b.qh[1] = (qh >> 8) & 0xFF;
    b.qh[2] = (qh >> 16) & 0xFF;
    b.qh[3] = qh >> 24;
}

TEST(Quants, DequantQ5_0) {
    block_q5_0 b{};
    b.d = fp32_to_fp16(0.5f);
    int q[32];
    for (int k = 0; k < 32; ++k) q[k] = (k * 13) % 32;  // all of 0..31 once
    pack_q5(b, q);
    auto y = deq(DType::Q5_0, &b, 32);
    for (int k = 0; k < 32; ++k) EXPECT_EQ(y[k], (q[k] - 16) * 0.5f) << k;
}

TEST(Quants, DequantQ5_1) {
    block_q5_1 b{};
    b.d = fp32_to_fp16(0.125f);
    b.m = fp32_to_fp16(2.0f);
    int q[32];
    for (int k = 0; k < 32; ++k) q[k] = 31 - k;
    pack_q5(b, q);
    auto y = deq(DType::Q5_1, &b, 32);
    for (int k = 0; k < 32; ++k) EXPECT_EQ(y[k], q[k] * 0.125f + 2.0f) << k;
}

TEST(Quants, DequantQ8_0AndQ8_1) {
    block_q8_0 b{};
    block_q8_1 c{};
    b.d = c.d = fp32_to_fp16(0.25f);
    c.s = fp32_to_fp16(123.0f);  // the sum field plays no part in the values
    for (int j = 0; j < 32; ++j) b.qs[j] = c.qs[j] = static_cast<int8_t>(j * 8 - 128);
    auto y = deq(DType::Q8_0, &b, 32);
    auto z = deq(DType::Q8_1, &c, 32);
    for (int j = 0; j < 32; ++j) {
        EXPECT_EQ(y[j], (j * 8 - 128) * 0.25f);
        EXPECT_EQ(z[j], (j * 8 - 128) * 0.25f);
    }
}

// The 2-bit field of element e (0..255) in the Q2_K / Q3_K qs layout: each
// 128-half uses 32 bytes; within a half, element r sits in byte r % 32 at bit
// offset 2 * (r / 32).
void put2(uint8_t* qs, int e, int v) {
    const int half = e / 128, r = e % 128;
    qs[half * 32 + r % 32] |= static_cast<uint8_t>((v & 3) << (2 * (r / 32)));
}

TEST(Quants, DequantQ2_K) {
    block_q2_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.dmin = fp32_to_fp16(0.25f);
    int sc[16], mn[16], q[256];
    for (int g = 0; g < 16; ++g) {
        sc[g] = g;
        mn[g] = 15 - g;
        b.scales[g] = static_cast<uint8_t>(sc[g] | (mn[g] << 4));
    }
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 7 + e / 32) & 3;
        put2(b.qs, e, q[e]);
    }
    auto y = deq(DType::Q2_K, &b, 256);
    for (int e = 0; e < 256; ++e) {
        const int g = e / 16;
        EXPECT_EQ(y[e], 0.5f * sc[g] * q[e] - 0.25f * mn[g]) << e;
    }
}

TEST(Quants, DequantQ3_K) {
    block_q3_K b{};
    b.d = fp32_to_fp16(0.25f);
    int sc[16], q[256];
    for (int g = 0; g < 16; ++g) {
        sc[g] = (g * 9) % 64 - 32;  // signed 6-bit, stored + 32
        const int s = sc[g] + 32;
        // Low 4 bits: byte g (g < 8) low nibble or byte g-8 high nibble; high 2
        // bits: byte 8 + g % 4 at bit offset 2 * (g / 4).
        if (g < 8)
            b.scales[g] |= static_cast<uint8_t>(s & 0xF);
        else
            b.scales[g - 8] |= static_cast<uint8_t>((s & 0xF) << 4);
        b.scales[8 + g % 4] |= static_cast<uint8_t>((s >> 4) << (2 * (g / 4)));
    }
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 5 + e / 64) % 8 - 4;  // [-4, 3], stored + 4 as 2 low bits + high bit
        const int s = q[e] + 4;
        put2(b.qs, e, s & 3);
        if (s >> 2) b.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
    }
    auto y = deq(DType::Q3_K, &b, 256);
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * sc[e / 16] * q[e]) << e;
}

// Q4_K / Q5_K scales: 8 pairs of 6-bit (scale, min). Pairs 0..3: byte j and
// byte j+4 (low 6 bits). Pairs 4..7: low nibbles in byte j+4, top 2 bits in
// the top of bytes j-4 (scale) and j (min).
void pack_k4_scales(uint8_t s[12], const int sc[8], const int mn[8]) {
    std::memset(s, 0, 12);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            s[j] |= static_cast<uint8_t>(sc[j]);
            s[j + 4] |= static_cast<uint8_t>(mn[j]);
        } else {
            s[j + 4] = static_cast<uint8_t>((sc[j] & 0xF) | ((mn[j] & 0xF) << 4));
            s[j - 4] |= static_cast<uint8_t>((sc[j] >> 4) << 6);
            s[j] |= static_cast<uint8_t>((mn[j] >> 4) << 6);
        }
    }
}

TEST(Quants, DequantQ4_K) {
    block_q4_K b{};
    b.d = fp32_to_fp16(0.5f);
    b.dmin = fp32_to_fp16(0.125f);
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; ++j) {
        sc[j] = 63 - 5 * j;
        mn[j] = 7 * j + 3;
    }
    pack_k4_scales(b.scales, sc, mn);
    // Element c*64 + l: low nibble of qs[c*32 + l]; c*64 + 32 + l: high nibble.
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 11 + 3) % 16;
        const int c = e / 64, r = e % 64;
        b.qs[c * 32 + r % 32] |= static_cast<uint8_t>(q[e] << (r < 32 ? 0 : 4));
    }
    auto y = deq(DType::Q4_K, &b, 256);
    for (int e = 0; e < 256; ++e) {
        const int g = e / 32;
        EXPECT_EQ(y[e], 0.5f * sc[g] * q[e] - 0.125f * mn[g]) << e;
    }
}

TEST(Quants, DequantQ5_K) {
    block_q5_K b{};
    b.d = fp32_to_fp16(0.25f);
    b.dmin = fp32_to_fp16(0.5f);
    int sc[8], mn[8], q[256];
    for (int j = 0; j < 8; ++j) {
        sc[j] = 8 * j + 7;  // 7..63
        mn[j] = 62 - 8 * j;
    }
    pack_k4_scales(b.scales, sc, mn);
    // As Q4_K for the low 4 bits; the 5th bit of element c*64 + l is bit 2c
    // of qh[l], of element c*64 + 32 + l bit 2c + 1.
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 7 + e / 16) % 32;
        const int c = e / 64, r = e % 64;
        b.qs[c * 32 + r % 32] |= static_cast<uint8_t>((q[e] & 0xF) << (r < 32 ? 0 : 4));
        if (q[e] >> 4) b.qh[r % 32] |= static_cast<uint8_t>(1 << (2 * c + (r < 32 ? 0 : 1)));
    }
    auto y = deq(DType::Q5_K, &b, 256);
    for (int e = 0; e < 256; ++e) {
        const int g = e / 32;
        EXPECT_EQ(y[e], 0.25f * sc[g] * q[e] - 0.5f * mn[g]) << e;
    }
}

TEST(Quants, DequantQ6_K) {
    block_q6_K b{};
    b.d = fp32_to_fp16(0.25f);
    int q[256];
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(g * 17 - 128);
    // In each 128-half n, element n*128 + 32*k + l (k = 0..3, l < 32): low 4
    // bits in ql[n*64 + 32*(k%2) + l] (low nibble for k < 2, high for k >= 2),
    // high 2 bits in qh[n*32 + l] at bit offset 2k. Stored + 32.
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 29 + 5) % 64 - 32;
        const int s = q[e] + 32;
        const int n = e / 128, k = (e % 128) / 32, l = e % 32;
        b.ql[n * 64 + 32 * (k % 2) + l] |= static_cast<uint8_t>((s & 0xF) << (k < 2 ? 0 : 4));
        b.qh[n * 32 + l] |= static_cast<uint8_t>((s >> 4) << (2 * k));
    }
    auto y = deq(DType::Q6_K, &b, 256);
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * b.scales[e / 16] * q[e]) << e;
}

TEST(Quants, DequantQ8_K) {
    block_q8_K b{};
    b.d = 0.0625f;  // a float, not a half
    for (int j = 0; j < 256; ++j) b.qs[j] = static_cast<int8_t>(j - 128);
    auto y = deq(DType::Q8_K, &b, 256);
    for (int j = 0; j < 256; ++j) EXPECT_EQ(y[j], (j - 128) * 0.0625f);
}

TEST(Quants, DequantIQ4_NL) {
    block_iq4_nl b{};
    b.d = fp32_to_fp16(0.5f);
    for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
    auto y = deq(DType::IQ4_NL, &b, 32);
    for (int j = 0; j < 16; ++j) {
        EXPECT_EQ(y[j], 0.5f * kIq4Grid[j]);
        EXPECT_EQ(y[j + 16], 0.5f * kIq4Grid[15 - j]);
    }
}

TEST(Quants, DequantIQ4_XS) {
    block_iq4_xs b{};
    b.d = fp32_to_fp16(0.25f);
    int ls[8];
    for (int ib = 0; ib < 8; ++ib) {
        ls[ib] = (ib * 23 + 5) % 64;  // 6-bit, value ls - 32
        b.scales_l[ib / 2] |= static_cast<uint8_t>((ls[ib] & 0xF) << (4 * (ib % 2)));
        b.scales_h |= static_cast<uint16_t>((ls[ib] >> 4) << (2 * ib));
    }
    int q[256];
    // Each 32-block ib: element ib*32 + j low nibble of qs[ib*16 + j], + 16 high.
    for (int e = 0; e < 256; ++e) {
        q[e] = (e * 3 + e / 32) % 16;
        const int ib = e / 32, r = e % 32;
        b.qs[ib * 16 + r % 16] |= static_cast<uint8_t>(q[e] << (r < 16 ? 0 : 4));
    }
    auto y = deq(DType::IQ4_XS, &b, 256);
    for (int e = 0; e < 256; ++e) EXPECT_EQ(y[e], 0.25f * (ls[e / 32] - 32) * kIq4Grid[q[e]]) << e;
}

TEST(Quants, VecDotTypes) {
    EXPECT_EQ(vec_dot_type(DType::F32), DType::F32);
    EXPECT_EQ(vec_dot_type(DType::F16), DType::F16);
    EXPECT_EQ(vec_dot_type(DType::BF16), DType::BF16);
    for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::IQ4_NL})
        EXPECT_EQ(vec_dot_type(t), DType::Q8_0);
    for (DType t : {DType::Q4_1, DType::Q5_1}) EXPECT_EQ(vec_dot_type(t), DType::Q8_1);
    for (DType t : {DType::Q2_K, DType::Q3_K, DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_XS})
        EXPECT_EQ(vec_dot_type(t), DType::Q8_K);
}

// ---------------------------------------------------------------------------
// Bit identity with llama.cpp on real rows (golden bytes cut from files
// llama.cpp wrote; see quants_golden.h).
// ---------------------------------------------------------------------------

namespace {
template <size_t NS, size_t NQ>
void expect_golden(DType t, const uint32_t (&src_bits)[NS], const uint8_t (&ref)[NQ], int64_t row) {
    std::vector<float> x(NS);
    std::memcpy(x.data(), src_bits, sizeof(src_bits));
    std::vector<uint8_t> q(NQ);
    for (int64_t r = 0; r < static_cast<int64_t>(NS) / row; ++r)
        quantize_row(t, x.data() + r * row, q.data() + r * row_size(t, row), row);
    for (size_t i = 0; i < NQ; ++i) ASSERT_EQ(q[i], ref[i]) << dtype_name(t) << " byte " << i;
}
}  // namespace

TEST(Quants, BitIdenticalToLlamaCppQ4_K) {
    expect_golden(DType::Q4_K, golden::kQ4K_src, golden::kQ4K_ref, 256);
}
TEST(Quants, BitIdenticalToLlamaCppQ6_K) {
    expect_golden(DType::Q6_K, golden::kQ6K_src, golden::kQ6K_ref, 256);
}
TEST(Quants, BitIdenticalToLlamaCppQ8_0) {
    expect_golden(DType::Q8_0, golden::kQ80_src, golden::kQ80_ref, 64);
}

// ---------------------------------------------------------------------------
// Round-trip error bounds. Notation: d the block's scale as computed in fp32,
// d_h = fp16(d) the stored one, |d_h - d| <= d * 2^-11 (kHalfEps). Quants are
// integers q with |q| <= Q; dequantization is q * d_h (+ m_h), so besides the
// rounding of x/d to an integer (half a step) the error carries Q * d * 2^-11
// from the stored scale (and |m| * 2^-11 from a stored min). A further 1e-3 of
// a step covers fp32 rounding of x * (1/d).
// ---------------------------------------------------------------------------

TEST(Quants, RoundTripQ8_0WithinHalfStep) {
    // d = amax/127, q = round(x/d) in [-127, 127]: |x - q d_h| <= d/2 + 127 d 2^-11.
    auto x = gaussian(32 * 64, 11);
    auto y = round_trip(DType::Q8_0, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        const float d = amax / 127;
        for (int j = 0; j < 32; ++j)
            EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]),
                      d * (0.5f + 127 * kHalfEps + 1e-3f));
    }
}

TEST(Quants, RoundTripQ8_1AndQ8_K) {
    // Q8_1 is Q8_0 plus a sum; Q8_K keeps d = max/-127 in fp32 (no fp16 term).
    auto x = gaussian(256 * 8, 12);
    auto y1 = round_trip(DType::Q8_1, x);
    auto yk = round_trip(DType::Q8_K, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
        for (int j = 0; j < 32; ++j)
            EXPECT_LE(std::fabs(x[b * 32 + j] - y1[b * 32 + j]),
                      amax / 127 * (0.5f + 127 * kHalfEps + 1e-3f));
    }
    for (size_t b = 0; b < x.size() / 256; ++b) {
        float amax = 0;
        for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[b * 256 + j]));
        for (int j = 0; j < 256; ++j)
            EXPECT_LE(std::fabs(x[b * 256 + j] - yk[b * 256 + j]), amax / 127 * (0.5f + 1e-3f));
    }
    // Q8_1's s field is d * sum(q), d the fp32 scale amax/127.
    auto q = quant(DType::Q8_1, x);
    const auto* blk = reinterpret_cast<const block_q8_1*>(q.data());
    int sum = 0;
    float a = 0;
    for (int j = 0; j < 32; ++j) {
        sum += blk[0].qs[j];
        a = std::max(a, std::fabs(x[j]));
    }
    EXPECT_EQ(blk[0].s, fp32_to_fp16(sum * (a / 127)));
}

// Symmetric 4/5-bit: d = max/-2^(b-1) puts the largest magnitude exactly on
// the end -2^(b-1) of the range; x/d lies in [-2^(b-1), 2^(b-1)], and values
// above 2^(b-1) - 1/2 (only an element of opposite sign and nearly the same
// magnitude) clamp to 2^(b-1) - 1, an error of at most one step. Everything
// else is within half a step.
void check_symmetric(DType t, int half_range) {
    auto x = gaussian(32 * 128, 13);
    auto y = round_trip(t, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float amax = 0, max = 0;
        for (int j = 0; j < 32; ++j)
            if (std::fabs(x[b * 32 + j]) > amax) {
                amax = std::fabs(x[b * 32 + j]);
                max = x[b * 32 + j];
            }
        const float d = max / -half_range;
        for (int j = 0; j < 32; ++j) {
            const float v = x[b * 32 + j];
            const float steps = v / d > half_range - 0.5f ? 1.0f : 0.5f;
            EXPECT_LE(std::fabs(v - y[b * 32 + j]),
                      std::fabs(d) * (steps + half_range * kHalfEps + 1e-3f))
                << dtype_name(t) << " block " << b << " elem " << j;
        }
    }
}
TEST(Quants, RoundTripQ4_0) {
    check_symmetric(DType::Q4_0, 8);
}
TEST(Quants, RoundTripQ5_0) {
    check_symmetric(DType::Q5_0, 16);
}

// Asymmetric 4/5-bit: d = (max - min)/(2^b - 1), m = min; (x - min)/d lies in
// [0, 2^b - 1] and rounds to within half a step; stored d and m add
// (2^b - 1) d 2^-11 and |min| 2^-11.
void check_asymmetric(DType t, int levels) {
    auto x = gaussian(32 * 128, 14);
    for (auto& v : x) v += 0.3f;  // not centred, so the min matters
    auto y = round_trip(t, x);
    for (size_t b = 0; b < x.size() / 32; ++b) {
        float mn = x[b * 32], mx = x[b * 32];
        for (int j = 0; j < 32; ++j) {
            mn = std::min(mn, x[b * 32 + j]);
            mx = std::max(mx, x[b * 32 + j]);
        }
        const float d = (mx - mn) / levels;
        for (int j = 0; j < 32; ++j)
            EXPECT_LE(std::fabs(x[b * 32 + j] - y[b * 32 + j]),
                      d * (0.5f + levels * kHalfEps + 1e-3f) + std::fabs(mn) * kHalfEps)
                << dtype_name(t);
    }
}
TEST(Quants, RoundTripQ4_1) {
    check_asymmetric(DType::Q4_1, 15);
}
TEST(Quants, RoundTripQ5_1) {
    check_asymmetric(DType::Q5_1, 31);
}

TEST(Quants, RoundTripF16AndBF16) {
    // Round to nearest: relative error <= 2^-11 (half) and 2^-8 (bfloat16) in
    // the normal range; ties go to even.
    auto x = gaussian(1024, 15);
    auto h = round_trip(DType::F16, x);
    auto b = round_trip(DType::BF16, x);
    for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_LE(std::fabs(x[i] - h[i]), std::fabs(x[i]) * kHalfEps);
        EXPECT_LE(std::fabs(x[i] - b[i]), std::fabs(x[i]) / 256);
    }
    const std::vector<float> ties = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048};  // half ties
    auto q = quant(DType::F16, ties);
    uint16_t bits[2];
    std::memcpy(bits, q.data(), 4);
    EXPECT_EQ(bits[0], 0x3c00);  // to even (down)
    EXPECT_EQ(bits[1], 0x3c02);  // to even (up)
    const std::vector<float> bties = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
    auto qb = quant(DType::BF16, bties);
    std::memcpy(bits, qb.data(), 4);
    EXPECT_EQ(bits[0], 0x3f80);
    EXPECT_EQ(bits[1], 0x3f82);
}

TEST(Quants, Q8_0IsIdempotent) {
    // deq(q(x)) = q * d_h with |q| = 127 at the block's largest magnitude, so
    // its amax is exactly 127 d_h (7-bit times 11-bit significands: exact in
    // fp32), the new d is exactly d_h and every q * d_h / d_h rounds back to q.
    auto x = gaussian(32 * 32, 16);
    auto q1 = quant(DType::Q8_0, x);
    auto y = deq(DType::Q8_0, q1.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(quant(DType::Q8_0, y), q1);
}

// ---------------------------------------------------------------------------
// Special inputs, every quantized type.
// ---------------------------------------------------------------------------

namespace {
const DType kQuantTypes[] = {DType::Q4_0, DType::Q4_1, DType::Q5_0,   DType::Q5_1,  DType::Q8_0,
                             DType::Q8_1, DType::Q2_K, DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                             DType::Q6_K, DType::Q8_K, DType::IQ4_NL, DType::IQ4_XS};
// 2^bits - 1 quant levels per type (the finest step is range / levels).
int levels(DType t) {
    switch (t) {
        case DType::Q2_K:
            return 3;
        case DType::Q3_K:
            return 7;
        case DType::Q5_0:
        case DType::Q5_1:
        case DType::Q5_K:
            return 31;
        case DType::Q6_K:
            return 63;
        case DType::Q8_0:
        case DType::Q8_1:
        case DType::Q8_K:
            return 255;
        default:
            return 15;
    }
}
}  // namespace

TEST(Quants, AllZeroBlocksGiveZerosNotNaN) {
    std::vector<float> x(512, 0.0f);
    for (DType t : kQuantTypes) {
        auto y = round_trip(t, x);
        for (float v : y) ASSERT_EQ(v, 0.0f) << dtype_name(t);
    }
}

TEST(Quants, OneHugeValueIsKept) {
    // The block holding 1000 among N(0,1) values: its range is ~1000, so half a
    // step is ~1000 / (2 levels); the largest element is where every scale
    // search starts, so it is reproduced within that. We allow a full step
    // (1000 / levels) for the rounding of the stored scales.
    auto x = gaussian(512, 17);
    x[37] = 1000.0f;
    for (DType t : kQuantTypes) {
        auto y = round_trip(t, x);
        for (float v : y) ASSERT_TRUE(std::isfinite(v)) << dtype_name(t);
        EXPECT_NEAR(y[37], 1000.0f, 1000.0f / levels(t)) << dtype_name(t);
    }
}

TEST(Quants, NegativeOnlyBlocks) {
    // All values in [-4, -0.5]: relative RMSE must stay below the type's error
    // on centred Gaussian data (the data only uses one side of a symmetric
    // grid, but its norm is larger by the offset): bounded by 2 / levels, a
    // generous multiple of the Gaussian figures (e.g. Q4_0 0.086 < 2/15).
    auto x = gaussian(1024, 18);
    for (auto& v : x) v = -0.5f - std::min(3.5f, std::fabs(v));
    for (DType t : kQuantTypes) {
        auto y = round_trip(t, x);
        double e2 = 0, w2 = 0;
        for (size_t i = 0; i < x.size(); ++i) {
            e2 += (x[i] - y[i]) * (x[i] - y[i]);
            w2 += x[i] * x[i];
        }
        EXPECT_LT(std::sqrt(e2 / w2), 2.0 / levels(t)) << dtype_name(t);
    }
}
