// Every CPU kernel against a straightforward scalar reference written here
// (double accumulation), with the tolerance of each comparison argued next
// to it. Weights are random bytes with sane block scales, so every bit
// pattern of the quant fields is exercised.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attn.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "ir/kv_layout.h"
#include "isa_levels.h"
#include "tensor/blocks.h"
#include "tensor/interleave.h"
#include "tensor/quants.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::tensor;
using minfer::cpu::NodeData;
using minfer::graph::Node;
using minfer::graph::Op;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// Byte offsets of the f16 scale fields of one block, per type.
std::vector<size_t> scale_offsets(DType t) {
    switch (t) {
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::IQ4_NL:
        case DType::IQ4_XS:
            return {0};
        case DType::Q4_1:
        case DType::Q5_1:
        case DType::Q4_K:
        case DType::Q5_K:
            return {0, 2};
        case DType::Q2_K:
            return {80, 82};
        case DType::Q3_K:
            return {108};
        case DType::Q6_K:
            return {208};
        default:
            return {};
    }
}

// A weight [K, M] of type t: random bytes, block scales in [0.002, 0.02]
// (mins of either sign), plain types random values in [-1, 1].
struct Weight {
    std::vector<uint8_t> bytes;
    TensorView view;
};
Weight make_weight(DType t, int64_t K, int64_t M, uint32_t seed) {
    Weight w;
    const size_t row = row_size(t, K);
    w.bytes.resize(row * static_cast<size_t>(M));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
        for (int64_t i = 0; i < K * M; ++i) {
            const float f = u(rng);
            if (t == DType::F32) std::memcpy(w.bytes.data() + 4 * i, &f, 4);
            uint16_t h = t == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
            if (t != DType::F32) std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        }
    } else {
        for (auto& b : w.bytes) b = static_cast<uint8_t>(rng());
        const size_t bs = traits(t).type_size;
        const std::vector<size_t> offs = scale_offsets(t);
        for (size_t blk = 0; blk < w.bytes.size() / bs; ++blk) {
            for (size_t k = 0; k < offs.size(); ++k) {
                float s = 0.002f + 0.018f * (u(rng) * 0.5f + 0.5f);
                if (k == 1) s *= (u(rng) < 0 ? -1.0f : 1.0f);  // the min / dmin
                const uint16_t h = fp32_to_fp16(s);
                std::memcpy(w.bytes.data() + blk * bs + offs[k], &h, 2);
            }
        }
    }
    w.view.name = std::string("w_") + std::string(dtype_name(t));
    w.view.type = t;
    w.view.ne = {K, M, 1, 1};
    w.view.data = w.bytes.data();
    w.view.nbytes = w.bytes.size();
    return w;
}

Node make_node(Op op, std::array<int64_t, 4> ne) {
    Node n;
    n.op = op;
    n.name = std::string(graph::op_name(op));
    n.ne = ne;
    return n;
}

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,
                              DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,   DType::Q3_K,
                              DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

}  // namespace

// ---- hand-computed blocks -----------------------------------------------------

TEST(CpuQuant, DequantizesHandMadeBlocks) {
    block_q4_0 b4{};
    b4.d = fp32_to_fp16(0.5f);
    b4.qs[0] = 0x1F;  // element 0 = 15, element 16 = 1
    float y[32];
    cpu::dequant_row(DType::Q4_0, &b4, y, 32);
    EXPECT_EQ(y[0], 3.5f);    // (15 - 8) * 0.5
    EXPECT_EQ(y[16], -3.5f);  // (1 - 8) * 0.5
    EXPECT_EQ(y[1], -4.0f);   // (0 - 8) * 0.5

    block_q4_K bk{};
    bk.d = fp32_to_fp16(1.0f);
    bk.dmin = fp32_to_fp16(1.0f);
    bk.scales[0] = 2;  // sub-block 0: scale 2
    bk.scales[4] = 1;  //              min 1
    bk.scales[1] = 3;  // sub-block 1: scale 3, min 0
    bk.qs[0] = 0x53;   // element 0 = 3, element 32 = 5
    std::vector<float> yk(256);
    cpu::dequant_row(DType::Q4_K, &bk, yk.data(), 256);
    EXPECT_EQ(yk[0], 5.0f);    // 2*3 - 1
    EXPECT_EQ(yk[1], -1.0f);   // 2*0 - 1
    EXPECT_EQ(yk[32], 15.0f);  // 3*5 - 0
}

TEST(CpuQuant, AgreesWithTheTensorStage) {
    // The activation formats must be the tensor stage's vec_dot_type. (GetRows'
    // dequantizer, cpu::dequant_row, *is* tensor::dequantize_row — it forwards
    // — so comparing the two would compare a function with itself; the
    // hand-made blocks above and Quants.Dequant* check its values.)
    for (DType t : kWeightTypes)
        EXPECT_EQ(cpu::act_type(t), tensor::vec_dot_type(t)) << dtype_name(t);
    // Q8_K activations: bit-identical to the reference quantizer, also for
    // a zero block, a block whose largest magnitude comes with both signs
    // (the first one's sign wins) and values on rounding ties.
    auto x = random_floats(1024, 78, -3, 3);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
    x[520] = 2.5f;
    x[530] = -2.5f;
    for (int j = 540; j < 560; ++j) x[size_t(j)] = 2.5f * float(j - 550) / 127.0f * 0.5f;
    x[770] = -3.5f;
    x[900] = 3.5f;
    std::vector<uint8_t> qa(row_size(DType::Q8_K, 1024)), qb(qa.size());
    cpu::quantize_act_row(DType::Q8_K, x.data(), qa.data(), 1024);
    tensor::quantize_row(DType::Q8_K, x.data(), qb.data(), 1024);
    EXPECT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size()));
}

TEST(CpuQuant, Q8ActivationsRoundTiesToEvenLikeGgml) {
    std::vector<float> x(32, 0.0f);
    x[0] = 127.0f;  // amax: d = 1, so q = x rounded
    x[1] = -63.5f;  // tie -> -64 (even)
    x[2] = 0.5f;    // tie -> 0
    x[3] = 1.5f;    // tie -> 2
    block_q8_0 q{};
    cpu::quantize_act_row(DType::Q8_0, x.data(), &q, 32);
    EXPECT_EQ(fp16_to_fp32(q.d), 1.0f);
    EXPECT_EQ(q.qs[0], 127);
    EXPECT_EQ(q.qs[1], -64);
    EXPECT_EQ(q.qs[2], 0);
    EXPECT_EQ(q.qs[3], 2);

    block_q8_1 q1{};
    cpu::quantize_act_row(DType::Q8_1, x.data(), &q1, 32);
    EXPECT_EQ(fp16_to_fp32(q1.s), 127.0f - 64.0f + 2.0f);  // d * sum(q)

    // Q8_K: the value of largest magnitude (here negative) maps to -127.
    std::vector<float> xk(256, 0.0f);
    xk[0] = -2.0f;
    xk[1] = 1.0f;   // 1 * 63.5 -> 64 (tie to even)
    xk[17] = 0.5f;  // 31.75 -> 32
    block_q8_K k{};
    cpu::quantize_act_row(DType::Q8_K, xk.data(), &k, 256);
    EXPECT_EQ(k.qs[0], -127);
    EXPECT_EQ(k.qs[1], 64);
    EXPECT_EQ(k.bsums[0], -127 + 64);
    EXPECT_EQ(k.bsums[1], 32);
    EXPECT_FLOAT_EQ(k.d, -2.0f / -127.0f);
}

// ---- MatMul -----------------------------------------------------------------------

// For every weight type, out[t][m] against sum_i w[m][i] * x[t][i] in double
// with w dequantized. The kernel's integer arithmetic is exact, so the error
// is that of the activation format, per element i of a block with largest
// magnitude amax:
//   Q8_0 / Q8_1: |x - d*q| <= amax/254 (rounding) + amax * 2^-11 (d stored
//     as f16, |q| <= 127)  -> e_i = amax * (1/254 + 1/2048);
//     Q8_1 also uses s = f16(d * sum q): |m| * 32 * amax * 2^-11 per block;
//   Q8_K: d is a float: e_i = amax / 254 (+ float rounding of 127/max);
//   F16: |x| * 2^-11, BF16: |x| * 2^-8, F32: 0.
// bound = sum_i |w_i| e_i, plus 1e-5 * sum |w_i x_i| for the float
// accumulation of a few hundred terms (each rounding <= 2^-24 relative).
// The check of the test below for one shape; types whose block does not
// divide K are left out.
void expect_matmul_within_activation_error(int64_t K, int64_t M, int64_t n) {
    ThreadPool pool(2);
    std::vector<float> x = random_floats(static_cast<size_t>(K * n), 7);
    x[5] = 3.0f;  // an outlier widens one block's scale
    for (DType t : kWeightTypes) {
        if (K % traits(t).block_size != 0) continue;
        SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K) +
                     " M=" + std::to_string(M) + " n=" + std::to_string(n));
        Weight w = make_weight(t, K, M, 11);
        std::vector<float> out(static_cast<size_t>(M * n));
        Node node = make_node(Op::MatMul, {M, n, 1, 1});
        node.weights = {&w.view};
        NodeData data;
        data.src = {x.data()};
        data.src_ne = {{K, n, 1, 1}};
        data.out = out.data();
        cpu::run_node(node, data, pool);

        const DType at = cpu::act_type(t);
        const int64_t blk = at == DType::Q8_K ? 256 : 32;
        std::vector<float> wrow(static_cast<size_t>(K));
        // The activations as the kernel sees them (quantized, back to float).
        std::vector<float> xq(x.size());
        std::vector<uint8_t> qbuf(row_size(at, K));
        for (int64_t tok = 0; tok < n; ++tok) {
            cpu::quantize_act_row(at, x.data() + tok * K, qbuf.data(), K);
            cpu::dequant_row(at, qbuf.data(), xq.data() + tok * K, K);
        }
        for (int64_t m = 0; m < M; ++m) {
            tensor::dequantize_row(t, w.view.row(m), wrow.data(), K);  // independent reference
            for (int64_t tok = 0; tok < n; ++tok) {
                const float* xt = x.data() + tok * K;
                double ref = 0, bound = 0, mag = 0;
                for (int64_t b0 = 0; b0 < K; b0 += blk) {
                    double amax = 0;
                    for (int64_t i = b0; i < b0 + blk; ++i)
                        amax = std::max(amax, std::fabs(double(xt[i])));
                    for (int64_t i = b0; i < b0 + blk; ++i) {
                        const double wi = wrow[static_cast<size_t>(i)], xi = xt[i];
                        ref += wi * xi;
                        mag += std::fabs(wi * xi);
                        double e = 0;
                        if (at == DType::Q8_0 || at == DType::Q8_1)
                            e = amax * (1.0 / 254 + 1.0 / 2048);
                        if (at == DType::Q8_K) e = amax * (1.0 / 254 + 1e-6);
                        if (at == DType::F16) e = std::fabs(xi) / 2048;
                        if (at == DType::BF16) e = std::fabs(xi) / 256;
                        bound += std::fabs(wi) * e;
                    }
                    if (at == DType::Q8_1) {
                        uint16_t hm;
                        std::memcpy(&hm, w.view.row(m) + (b0 / 32) * traits(t).type_size + 2, 2);
                        bound += std::fabs(fp16_to_fp32(hm)) * 32 * amax / 2048;
                    }
                }
                bound += 1e-5 * mag + 1e-6;
                const float got = out[static_cast<size_t>(tok * M + m)];
                EXPECT_NEAR(got, ref, bound) << "m=" << m << " t=" << tok;
                // Against the quantized activations the integer sums are
                // exact: only float roundings remain, each <= 2^-24 of the
                // magnitude, at most K/32 block terms + 8 per block chain
                // (and Q8_1's f16 s, bounded as above). This catches a wrong
                // nibble or scale index that the loose bound above might not.
                double ref_q = 0, mag_q = 0, slack = 0;
                for (int64_t i = 0; i < K; ++i) {
                    const double p =
                        double(wrow[static_cast<size_t>(i)]) * xq[static_cast<size_t>(tok * K + i)];
                    ref_q += p;
                    mag_q += std::fabs(p);
                }
                if (at == DType::Q8_1) {
                    for (int64_t b0 = 0; b0 < K; b0 += 32) {
                        uint16_t hm;
                        std::memcpy(&hm, w.view.row(m) + (b0 / 32) * traits(t).type_size + 2, 2);
                        double sq = 0;
                        for (int64_t i = b0; i < b0 + 32; ++i)
                            sq += std::fabs(xq[static_cast<size_t>(tok * K + i)]);
                        slack += std::fabs(fp16_to_fp32(hm)) * sq / 2048;
                    }
                }
                EXPECT_NEAR(got, ref_q, (K / 32 + 8) * std::ldexp(mag_q, -24) + slack + 1e-7)
                    << "m=" << m << " t=" << tok;
            }
        }
    }
}

// Each check once per kernel level this CPU has.
TEST(CpuMatMul, EveryWeightTypeMatchesDequantizedDotWithinActivationError) {
    // n = 5 tokens: from 4 tokens on the GEMM path runs where it exists.
    minfer::testing::for_each_isa_level(
        [&](cpu::IsaLevel) { expect_matmul_within_activation_error(512, 9, 5); });
}

TEST(CpuMatMul, OddBlockCountsAndKNotAMultipleOf64) {
    // K = 96, 160, 224: 3, 5, 7 blocks of 32 (not a multiple of 64, so a
    // kernel that steps two blocks at a time has a tail); K = 768: three
    // 256-wide super-blocks. M = 17: one row past a 16-row panel. One token
    // (the dot path) and five (the GEMM path).
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        for (int64_t K : {96, 160, 224, 768})
            for (int64_t n : {1, 5}) expect_matmul_within_activation_error(K, 17, n);
    });
}

TEST(CpuMatMul, SameBitsWithOneAndTwoThreadsAndPrefillTiles) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        (void)level;
        // n = 40 tokens crosses the 32-token tile, M = 37 rows a partial row block.
        const int64_t K = 256, M = 37, n = 40;
        std::vector<float> x = random_floats(static_cast<size_t>(K * n), 3);
        for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F32}) {
            Weight w = make_weight(t, K, M, 5);
            std::vector<float> o1(static_cast<size_t>(M * n)), o2(o1.size()), o3(o1.size());
            cpu::MatMulPart part{&w.view, 0};
            ThreadPool p1(1), p2(2);
            cpu::matmul(&part, 1, x.data(), K, n, o1.data(), M, p1);
            cpu::matmul(&part, 1, x.data(), K, n, o2.data(), M, p2);
            EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * 4)) << dtype_name(t);
            // token t alone (decode shape) against the same token inside a batch
            cpu::matmul(&part, 1, x.data() + 7 * K, K, 1, o3.data(), M, p2);
            if (!cpu::gemm_supported(t, K)) {
                EXPECT_EQ(0, std::memcmp(o3.data(), o1.data() + 7 * M, static_cast<size_t>(M) * 4));
                continue;
            }
            // The batch took the GEMM path: the integer sums per group are the
            // same, only the float accumulation order differs. Each path rounds
            // at most K/32 + 8 times along a chain, each by <= 2^-24 of the sum
            // of |products| (bounded with the dequantized weights and |x|, as
            // the activation quantization changes |x| by under 1%).
            std::vector<float> wrow(static_cast<size_t>(K));
            for (int64_t m = 0; m < M; ++m) {
                tensor::dequantize_row(t, w.view.row(m), wrow.data(), K);
                double mag = 0;
                for (int64_t i = 0; i < K; ++i)
                    mag += std::fabs(double(wrow[size_t(i)]) * x[size_t(7 * K + i)]);
                EXPECT_NEAR(o3[size_t(m)], o1[size_t(7 * M + m)],
                            2 * (K / 32 + 8) * std::ldexp(1.02 * mag, -24))
                    << dtype_name(t) << " m=" << m;
            }
        }
    });
}

TEST(CpuMatMul, GemmPathEqualsTokenByTokenDots) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        (void)level;
        // Every GEMM weight type, a fused 3-part matmul with a partial 16-row
        // tile, 4..9 tokens (full and partial 4-token micro-tiles): each output
        // equals the vec_dot path of that token alone, within the float-order
        // bound argued above.
        const int64_t K = 512;
        for (DType t :
             {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
            if (!cpu::gemm_supported(t, K)) {
#if defined(__x86_64__) || defined(__aarch64__)
                // every SIMD level of x86-64 (avx2, avx512) and ARM64 (neon,
                // dotprod, i8mm) has a GEMM for these types
                EXPECT_EQ(level, cpu::IsaLevel::Scalar) << dtype_name(t);
#endif
                return;
            }
            Weight a = make_weight(t, K, 21, 1), b = make_weight(t, K, 6, 2),
                   c = make_weight(t, K, 6, 3);
            const cpu::MatMulPart parts[3] = {{&a.view, 0}, {&b.view, 21}, {&c.view, 27}};
            const int64_t M = 33;
            for (int64_t n : {4, 9, 19}) {
                std::vector<float> x = random_floats(static_cast<size_t>(K * n), 17 + uint32_t(n));
                std::vector<float> batch(static_cast<size_t>(M * n)), one(static_cast<size_t>(M));
                ThreadPool pool(2);
                cpu::matmul(parts, 3, x.data(), K, n, batch.data(), M, pool);
                std::vector<float> wrow(static_cast<size_t>(K));
                for (int64_t tok = 0; tok < n; ++tok) {
                    cpu::matmul(parts, 3, x.data() + tok * K, K, 1, one.data(), M, pool);
                    for (int64_t m = 0; m < M; ++m) {
                        const Weight& w = m < 21 ? a : m < 27 ? b : c;
                        const int64_t r = m < 21 ? m : m < 27 ? m - 21 : m - 27;
                        tensor::dequantize_row(t, w.view.row(r), wrow.data(), K);
                        double mag = 0;
                        for (int64_t i = 0; i < K; ++i)
                            mag += std::fabs(double(wrow[size_t(i)]) * x[size_t(tok * K + i)]);
                        EXPECT_NEAR(batch[size_t(tok * M + m)], one[size_t(m)],
                                    2 * (K / 32 + 8) * std::ldexp(1.02 * mag, -24))
                            << dtype_name(t) << " n=" << n << " t=" << tok << " m=" << m;
                    }
                }
            }
        }
    });
}

TEST(CpuMatMul, GemmRowOfATokenIsBitwiseTheSameInAnyBatch) {
    // Batch invariance (many sequences share a pass): a token's outputs from
    // the GEMM depend only on its activations and the weights, not on how
    // many tokens surround it, where it sits among them (micro-tile edges)
    // or the thread count. Token 5 of a 19-token batch against the same
    // token at the front of a 4-token batch and in the middle of a 9-token
    // one. (Below 4 tokens matmul takes the dot products, whose float order
    // differs: see GemmPathEqualsTokenByTokenDots.)
    const int64_t K = 512, M = 40;
    for (DType t : {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
        Weight w = make_weight(t, K, M, 4);
        const cpu::MatMulPart part{&w.view, 0};
        std::vector<float> x = random_floats(static_cast<size_t>(K * 19), 23);
        minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
            if (!cpu::gemm_supported(t, K)) {
#if defined(__x86_64__) || defined(__aarch64__)
                EXPECT_EQ(level, cpu::IsaLevel::Scalar) << dtype_name(t);
#endif
                return;
            }
            ThreadPool p1(1), p2(2);
            std::vector<float> all(static_cast<size_t>(M * 19)), front(static_cast<size_t>(M * 4)),
                mid(static_cast<size_t>(M * 9));
            cpu::matmul(&part, 1, x.data(), K, 19, all.data(), M, p2);
            cpu::matmul(&part, 1, x.data() + 5 * K, K, 4, front.data(), M, p1);
            cpu::matmul(&part, 1, x.data() + 1 * K, K, 9, mid.data(), M, p2);
            EXPECT_EQ(0, std::memcmp(all.data() + 5 * M, front.data(), M * sizeof(float)))
                << dtype_name(t);
            EXPECT_EQ(0, std::memcmp(all.data() + 5 * M, mid.data() + 4 * M, M * sizeof(float)))
                << dtype_name(t);
        });
    }
}

// gemm_rows itself, at every level with a GEMM: token counts that leave a
// lone token in the last pair or micro-tile (1, 3, 5, 17), row ranges of
// odd sizes at odd offsets (a lone row in a panel, a whole tile), K of one
// and of three super-blocks. Each output against the double-precision dot
// of the dequantized weight row and activation row: the integer sums per
// group are exact, so what remains is float rounding along one chain of at
// most K/16 + K/256 + 2 operations, each within 2^-24 of a partial sum
// bounded by the sum of |products| (the bound of the matmul tests above).
// A token's outputs are also bitwise the same in every batch, and on ARM64
// bitwise the same at every level (gemm_neon.h: one float step for all), on
// x86-64 with AVX-VNNI and without.
TEST(CpuGemm, OddTokenAndRowCountsMatchDoubleReference) {
    for (const int64_t K : {256, 768}) {
        for (DType t :
             {DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
            SCOPED_TRACE(std::string(dtype_name(t)) + " K=" + std::to_string(K));
            const DType at = cpu::act_type(t);
            constexpr int64_t kMaxTokens = 17;
            std::vector<float> x = random_floats(static_cast<size_t>(K * kMaxTokens), 41);
            x[5] = 3.0f;  // an outlier: a wide activation scale in one block
            std::vector<std::vector<uint8_t>> qrows(kMaxTokens,
                                                    std::vector<uint8_t>(row_size(at, K)));
            std::vector<std::vector<float>> ad(kMaxTokens, std::vector<float>(size_t(K)));
            for (int64_t tok = 0; tok < kMaxTokens; ++tok) {
                cpu::quantize_act_row(at, x.data() + tok * K, qrows[size_t(tok)].data(), K);
                dequantize_row(at, qrows[size_t(tok)].data(), ad[size_t(tok)].data(), K);
            }
            std::vector<float> first_level;  // the 17-token outputs at the first GEMM level
            minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
                if (!cpu::gemm_supported(t, K)) {
#if defined(__x86_64__) || defined(__aarch64__)
                    EXPECT_EQ(level, cpu::IsaLevel::Scalar);
#endif
                    return;
                }
                // Row ranges: 7 rows, 1 row, a whole tile, 3 rows, 13 rows.
                const int64_t tile = cpu::gemm_tile_rows();
                const int64_t counts[] = {7, 1, tile, 3, 13};
                int64_t M = 0;
                for (int64_t c : counts) M += std::min(c, tile);
                Weight w = make_weight(t, K, M, 43);
                std::vector<float> wd(static_cast<size_t>(K * M));
                for (int64_t m = 0; m < M; ++m)
                    dequantize_row(t, w.view.row(m), wd.data() + m * K, K);
                const size_t stride = cpu::gemm_act_row_bytes(at, K);
                std::vector<uint8_t> act(stride * kMaxTokens), scratch(cpu::gemm_scratch_bytes(K));
                for (int64_t tok = 0; tok < kMaxTokens; ++tok)
                    cpu::gemm_pack_act(at, qrows[size_t(tok)].data(), K,
                                       act.data() + size_t(tok) * stride);
                std::vector<float> all;  // the 17-token batch's outputs [17][M]
                for (const int64_t n : {kMaxTokens, int64_t{1}, int64_t{3}, int64_t{5}}) {
                    SCOPED_TRACE("n_tokens=" + std::to_string(n));
                    std::vector<float> out(static_cast<size_t>(n * M), NAN);
                    int64_t r0 = 0;
                    for (int64_t c : counts) {
                        const int64_t r1 = r0 + std::min(c, tile);
                        cpu::gemm_rows(t, false, w.view.row(0), w.view.row_bytes(), K, r0, r1,
                                       act.data(), stride, n, out.data() + r0, M, scratch.data());
                        r0 = r1;
                    }
                    for (int64_t tok = 0; tok < n; ++tok)
                        for (int64_t m = 0; m < M; ++m) {
                            double ref = 0, mag = 0;
                            for (int64_t i = 0; i < K; ++i) {
                                const double p =
                                    double(wd[size_t(m * K + i)]) * ad[size_t(tok)][size_t(i)];
                                ref += p;
                                mag += std::fabs(p);
                            }
                            const float got = out[size_t(tok * M + m)];
                            ASSERT_NEAR(got, ref, (K / 16 + 8) * std::ldexp(mag, -24) + 1e-7)
                                << "t=" << tok << " m=" << m;
                            if (n == kMaxTokens) continue;
                            // the same token in the 17-token batch: the same bits
                            ASSERT_EQ(0, std::memcmp(&got, &all[size_t(tok * M + m)], 4))
                                << "t=" << tok << " m=" << m << ": " << got << " vs "
                                << all[size_t(tok * M + m)] << " in the 17-token batch";
                        }
                    if (n == kMaxTokens) all = out;
                }
#if defined(__aarch64__)
                if (first_level.empty()) {
                    first_level = all;
                } else {
                    EXPECT_EQ(0, std::memcmp(all.data(), first_level.data(), all.size() * 4))
                        << cpu::gemm_name() << " differs from the lower levels' GEMM";
                }
#else
                // The Avx2 level runs twice on an AVX-VNNI CPU (isa_levels.h):
                // vpdpbusd and vpmaddubsw + vpmaddwd give the same bits.
                if (level == cpu::IsaLevel::Avx2) {
                    if (first_level.empty()) {
                        first_level = all;
                    } else {
                        EXPECT_EQ(0, std::memcmp(all.data(), first_level.data(), all.size() * 4))
                            << "the AVX-VNNI micro-kernels differ from the AVX2 ones";
                    }
                }
#endif
            });
        }
    }
}

// ---- interleaved weights (tensor/interleave.h) ---------------------------------

TEST(Interleave, RoundTripsEveryRowAndKeepsTheBytes) {
    for (DType t : {DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
        const int64_t K = 512, M = 48;
        ASSERT_TRUE(tensor::can_interleave(t, K, M)) << dtype_name(t);
        EXPECT_FALSE(tensor::can_interleave(t, K, 40)) << "rows not a multiple of 16";
        Weight w = make_weight(t, K, M, 9);
        std::vector<uint8_t> il(w.bytes.size(), 0xEE), row(row_size(t, K));
        tensor::interleave_rows(t, w.bytes.data(), K, M, il.data());
        // a permutation of the bytes: same multiset (Q8_0 stores its quants ^ 0x80)
        std::vector<uint8_t> a = w.bytes, b = il;
        std::sort(a.begin(), a.end());
        std::sort(b.begin(), b.end());
        if (t != DType::Q8_0) {
            EXPECT_EQ(a, b) << dtype_name(t);
        }
        for (int64_t r = 0; r < M; ++r) {
            tensor::deinterleave_row(t, il.data(), K, r, row.data());
            ASSERT_EQ(0, std::memcmp(row.data(), w.view.row(r), row.size()))
                << dtype_name(t) << " row " << r;
        }
    }
    EXPECT_FALSE(tensor::can_interleave(DType::F32, 64, 16));
}

// The many-token group kernels (the MoE experts' path for up to 16 tokens)
// are bitwise the one-token kernel, token by token, for every count of
// tokens (4 at a time, then 3, 2 or 1), and write only their tokens' rows.
TEST(Interleave, GroupDotManyIsBitwiseGroupDotPerToken) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        int kernels = 0;
        for (DType t : {DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
            const cpu::GroupDotManyFn many = cpu::group_dot_many_fn(t);
            const cpu::GroupDotFn one = cpu::group_dot_fn(t);
            if (many == nullptr) continue;
            ASSERT_NE(one, nullptr) << dtype_name(t);
            ++kernels;
            SCOPED_TRACE(dtype_name(t));
            const int64_t K = 512, M = 32, out_stride = M + 3, n_max = 11;
            Weight w = make_weight(t, K, M, 21);
            std::vector<uint8_t> il(w.bytes.size());
            tensor::interleave_rows(t, w.bytes.data(), K, M, il.data());
            const DType at = cpu::act_type(t);
            const size_t ar = row_size(at, K);
            const std::vector<float> x = random_floats(static_cast<size_t>(K * n_max), 22, -2, 2);
            std::vector<uint8_t> act(ar * static_cast<size_t>(n_max));
            for (int64_t i = 0; i < n_max; ++i)
                cpu::quantize_act_row(at, x.data() + i * K, act.data() + i * ar, K);
            for (int64_t n = 1; n <= n_max; ++n)
                for (int64_t g = 0; g < M; g += kInterleaveRows) {
                    const uint8_t* group = il.data() + static_cast<size_t>(g) * w.view.row_bytes();
                    std::vector<float> got(static_cast<size_t>(out_stride * (n_max + 1)), -7.0f);
                    many(K, group, act.data(), ar, n, got.data(), out_stride);
                    for (int64_t i = 0; i < n; ++i) {
                        float want[kInterleaveRows];
                        one(K, group, act.data() + i * ar, want);
                        ASSERT_EQ(0, std::memcmp(want, got.data() + i * out_stride, sizeof want))
                            << "n=" << n << " token " << i << " group " << g;
                        for (int64_t j = kInterleaveRows; j < out_stride; ++j)
                            ASSERT_EQ(got[size_t(i * out_stride + j)], -7.0f);
                    }
                    for (int64_t j = n * out_stride; j < out_stride * (n_max + 1); ++j)
                        ASSERT_EQ(got[size_t(j)], -7.0f) << "n=" << n << ": wrote past its tokens";
                }
        }
        // AVX-512 has Q8_0's and Q4_K's: a level that should have them and
        // returns none checks nothing
        if (level == cpu::IsaLevel::Avx512) {
            EXPECT_GE(kernels, 2);
        }
    });
}

TEST(CpuMatMul, InterleavedWeightsMatchTheFileLayout) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        (void)level;
        // Decode (1 token), small batches (dot path, 3 tokens) and prompt
        // batches (GEMM, 9 and 40 tokens) on interleaved weights against the
        // same weights in GGUF rows: the integer sums are the same, only the
        // float order differs (the bound argued for the GEMM above). Parts: a
        // 21-row Q8_0 part first, so the interleaved part's groups straddle
        // the threads' 16-row blocks (partial groups), then two interleaved
        // parts.
        const int64_t K = 512;
        for (DType t : {DType::Q5_0, DType::Q4_K, DType::Q6_K, DType::Q8_0}) {
            SCOPED_TRACE(dtype_name(t));
            Weight a = make_weight(DType::Q8_0, K, 21, 1), b = make_weight(t, K, 32, 2),
                   c = make_weight(t, K, 48, 3);
            std::vector<uint8_t> bi(b.bytes.size()), ci(c.bytes.size());
            tensor::interleave_rows(t, b.bytes.data(), K, 32, bi.data());
            tensor::interleave_rows(t, c.bytes.data(), K, 48, ci.data());
            TensorView bv = b.view, cv = c.view;
            bv.data = bi.data();
            cv.data = ci.data();
            bv.layout = cv.layout = TensorView::Layout::Rows16;
            // with the 21-row lead part (groups straddle tiles) and without it
            // (whole groups: the GEMM fills its panels straight from them)
            for (const bool lead : {true, false}) {
                const int64_t off = lead ? 21 : 0;
                const cpu::MatMulPart plain_all[3] = {{&a.view, 0}, {&b.view, 21}, {&c.view, 53}};
                const cpu::MatMulPart inter_all[3] = {{&a.view, 0}, {&bv, 21}, {&cv, 53}};
                const cpu::MatMulPart plain_bc[2] = {{&b.view, 0}, {&c.view, 32}};
                const cpu::MatMulPart inter_bc[2] = {{&bv, 0}, {&cv, 32}};
                const cpu::MatMulPart* plain = lead ? plain_all : plain_bc;
                const cpu::MatMulPart* inter = lead ? inter_all : inter_bc;
                const int n_parts = lead ? 3 : 2;
                const int64_t M = 80 + off;
                for (int64_t n : {1, 3, 9, 40}) {
                    for (int threads : {1, 2}) {
                        std::vector<float> x =
                            random_floats(static_cast<size_t>(K * n), 5 + uint32_t(n));
                        std::vector<float> want(static_cast<size_t>(M * n)), got(want.size(), NAN);
                        ThreadPool pool(threads);
                        cpu::matmul(plain, n_parts, x.data(), K, n, want.data(), M, pool);
                        cpu::matmul(inter, n_parts, x.data(), K, n, got.data(), M, pool);
                        std::vector<float> wrow(static_cast<size_t>(K));
                        for (int64_t tok = 0; tok < n; ++tok)
                            for (int64_t m = 0; m < M; ++m) {
                                const Weight& w = m < off ? a : m < off + 32 ? b : c;
                                const int64_t r = m < off        ? m
                                                  : m < off + 32 ? m - off
                                                                 : m - off - 32;
                                tensor::dequantize_row(w.view.type, w.view.row(r), wrow.data(), K);
                                double mag = 0;
                                for (int64_t i = 0; i < K; ++i)
                                    mag +=
                                        std::fabs(double(wrow[size_t(i)]) * x[size_t(tok * K + i)]);
                                ASSERT_NEAR(got[size_t(tok * M + m)], want[size_t(tok * M + m)],
                                            2 * (K / 32 + 8) * std::ldexp(1.02 * mag, -24))
                                    << "lead=" << lead << " n=" << n << " threads=" << threads
                                    << " t=" << tok << " m=" << m;
                            }
                    }
                }
            }
        }
    });
}

TEST(CpuMatMul, RegroupedWeightsAreBitwiseTheSameAloneAndInAnyBatch) {
    // Regrouped weights whose type has a group kernel at the level: the
    // decode kernel (fewer than 4 tokens) and the GEMM (4 or more) do per
    // row the same float steps on exact integer sums, so a token's outputs
    // are bitwise the same alone, among 3 (dot path) and at any place in 9
    // or 19 (GEMM), with 1 and 2 threads. matmul_batch_invariant says so,
    // and on x86-64 it must for Q8_0, Q4_K, Q6_K at Avx2 and all four types
    // at Avx512 (Q5_0 with BITALG), or the check would pass by skipping. Rows
    // 48: three 16-row groups, so a 32-row GEMM tile and a lone group.
    const int64_t K = 512, M = 48;
    std::vector<float> x = random_floats(static_cast<size_t>(K * 19), 31);
    int checked = 0;
    for (DType t : {DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q6_K}) {
        SCOPED_TRACE(dtype_name(t));
        Weight w = make_weight(t, K, M, 7);
        std::vector<uint8_t> wi(w.bytes.size());
        tensor::interleave_rows(t, w.bytes.data(), K, M, wi.data());
        TensorView v = w.view;
        v.data = wi.data();
        v.layout = TensorView::Layout::Rows16;
        const cpu::MatMulPart part{&v, 0};
        minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
            const bool expected = (level == cpu::IsaLevel::Avx2 && t != DType::Q5_0) ||
                                  (level == cpu::IsaLevel::Avx512 &&
                                   (t != DType::Q5_0 || cpu::cpu_has_avx512_bitalg()));
            if (expected) {
                EXPECT_TRUE(cpu::matmul_batch_invariant(v));
            }
            if (!cpu::matmul_batch_invariant(v)) return;
            for (int threads : {1, 2}) {
                ThreadPool pool(threads);
                std::vector<float> all(static_cast<size_t>(M * 19));
                cpu::matmul(&part, 1, x.data(), K, 19, all.data(), M, pool);
                // token 7 of the 19, alone, as 3rd of 3, as 1st of 9 (t = 7 .. 15)
                std::vector<float> one(static_cast<size_t>(M)), three(static_cast<size_t>(M * 3)),
                    nine(static_cast<size_t>(M * 9));
                cpu::matmul(&part, 1, x.data() + 7 * K, K, 1, one.data(), M, pool);
                cpu::matmul(&part, 1, x.data() + 5 * K, K, 3, three.data(), M, pool);
                cpu::matmul(&part, 1, x.data() + 7 * K, K, 9, nine.data(), M, pool);
                const float* want = all.data() + 7 * M;
                EXPECT_EQ(0, std::memcmp(one.data(), want, M * sizeof(float))) << threads;
                EXPECT_EQ(0, std::memcmp(three.data() + 2 * M, want, M * sizeof(float))) << threads;
                EXPECT_EQ(0, std::memcmp(nine.data(), want, M * sizeof(float))) << threads;
                ++checked;
            }
        });
    }
#if defined(__x86_64__)
    if (cpu::isa_detected() != cpu::IsaLevel::Scalar) {
        EXPECT_GT(checked, 0);
    }
#endif
    if (checked == 0) GTEST_SKIP() << "no level of this CPU has a 16-row group kernel";
}

// ---- small ops --------------------------------------------------------------------

TEST(CpuOps, RmsNormAndHeadNormMatchDoubleReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // One float scale and two float multiplies per element after a double
        // sum: relative error a few 2^-24; 1e-6 relative is generous.
        const int64_t ne0 = 128, n = 3, hd = 32;
        ThreadPool pool(2);
        auto x = random_floats(static_cast<size_t>(ne0 * n), 1, -2, 2);
        auto w = random_floats(static_cast<size_t>(ne0), 2);
        TensorView wv{"norm", DType::F32, {ne0, 1, 1, 1}, w.data(), w.size() * 4};
        TensorView hv{"head_norm", DType::F32, {hd, 1, 1, 1}, w.data(), hd * 4};
        std::vector<float> out(x.size()), out_h(x.size());
        Node norm = make_node(Op::RmsNorm, {ne0, n, 1, 1});
        norm.meta.eps = 1e-6f;
        norm.weights = {&wv};
        cpu::run_node(norm, NodeData{{x.data()}, out.data(), nullptr, nullptr, {}}, pool);
        Node hn = make_node(Op::HeadNorm, {ne0, n, 1, 1});
        hn.meta.eps = 1e-6f;
        hn.meta.head_dim = hd;
        hn.weights = {&hv};
        cpu::run_node(hn, NodeData{{x.data()}, out_h.data(), nullptr, nullptr, {}}, pool);
        for (int64_t t = 0; t < n; ++t) {
            const float* xt = x.data() + t * ne0;
            double ss = 0;
            for (int64_t i = 0; i < ne0; ++i) ss += double(xt[i]) * xt[i];
            const double sc = 1.0 / std::sqrt(ss / ne0 + 1e-6);
            for (int64_t i = 0; i < ne0; ++i) {
                const double ref = xt[i] * sc * w[static_cast<size_t>(i)];
                EXPECT_NEAR(out[static_cast<size_t>(t * ne0 + i)], ref,
                            1e-6 * std::fabs(ref) + 1e-7);
            }
            for (int64_t h = 0; h < ne0 / hd; ++h) {
                double hs = 0;
                for (int64_t i = 0; i < hd; ++i) hs += double(xt[h * hd + i]) * xt[h * hd + i];
                const double hsc = 1.0 / std::sqrt(hs / hd + 1e-6);
                for (int64_t i = 0; i < hd; ++i) {
                    const double ref = xt[h * hd + i] * hsc * w[static_cast<size_t>(i)];
                    EXPECT_NEAR(out_h[static_cast<size_t>(t * ne0 + h * hd + i)], ref,
                                1e-6 * std::fabs(ref) + 1e-7);
                }
            }
        }
    });
}

TEST(CpuOps, ElementwiseOpsMatchReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // One or two float operations per element, expf within 1 ulp: 1e-6
        // relative (+1e-7 absolute near zero).
        const int64_t ne0 = 64, n = 5;
        ThreadPool pool(2);
        auto a = random_floats(static_cast<size_t>(ne0 * n), 3, -6, 6);
        auto b = random_floats(static_cast<size_t>(ne0 * n), 4, -2, 2);
        TensorView bias{"bias", DType::F32, {ne0, 1, 1, 1}, b.data(), static_cast<size_t>(ne0) * 4};
        std::vector<float> out(a.size());
        auto run = [&](Op op, std::vector<const void*> src) {
            Node node = make_node(op, {ne0, n, 1, 1});
            if (op == Op::AddBias) node.weights = {&bias};
            cpu::run_node(node, NodeData{src, out.data(), nullptr, nullptr, {}}, pool);
        };
        auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
        run(Op::Add, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
        run(Op::Mul, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] * b[i]);
        run(Op::AddBias, {a.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i % ne0]);
        run(Op::Silu, {a.data()});
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(out[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
        run(Op::SwiGLU, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) {
            const double ref = silu(a[i]) * b[i];
            EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7);
        }
        // in place
        std::vector<float> c = a;
        Node s = make_node(Op::Silu, {ne0, n, 1, 1});
        cpu::run_node(s, NodeData{{c.data()}, c.data(), nullptr, nullptr, {}}, pool);
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(c[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
    });
}

TEST(CpuOps, ElementwiseAndNormsOnOddWidths) {
    // once per kernel level this CPU has (the AVX2 and AVX-512 tails differ)
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // Widths that are not multiples of the SIMD width (16 floats), so every
        // kernel's tail runs: 1, 3, 15, 17, 31, 33, 100, 129. Same bounds as the
        // two tests above; HeadNorm with head_dim 20 (a 4-float tail per head).
        ThreadPool pool(2);
        auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
        for (int64_t ne0 : {1, 3, 15, 17, 31, 33, 100, 129}) {
            SCOPED_TRACE(::testing::Message() << "ne0 " << ne0);
            const int64_t n = 3;
            auto a = random_floats(static_cast<size_t>(ne0 * n), 21, -6, 6);
            auto b = random_floats(static_cast<size_t>(ne0 * n), 22, -2, 2);
            TensorView bias{
                "bias", DType::F32, {ne0, 1, 1, 1}, b.data(), static_cast<size_t>(ne0) * 4};
            // Canaries past the end: a tail must not write beyond the row.
            std::vector<float> out(a.size() + 16, -7.0f);
            auto run = [&](Op op, std::vector<const void*> src) {
                Node node = make_node(op, {ne0, n, 1, 1});
                if (op == Op::AddBias) node.weights = {&bias};
                if (op == Op::RmsNorm) {
                    node.meta.eps = 1e-6f;
                    node.weights = {&bias};
                }
                cpu::run_node(node, NodeData{src, out.data(), nullptr, nullptr, {}}, pool);
            };
            run(Op::Add, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
            run(Op::Mul, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] * b[i]);
            run(Op::AddBias, {a.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i % size_t(ne0)]);
            run(Op::Silu, {a.data()});
            for (size_t i = 0; i < a.size(); ++i)
                EXPECT_NEAR(out[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
            run(Op::SwiGLU, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) {
                const double ref = silu(a[i]) * b[i];
                EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7);
            }
            run(Op::RmsNorm, {a.data()});
            for (int64_t t = 0; t < n; ++t) {
                const float* xt = a.data() + t * ne0;
                double ss = 0;
                for (int64_t i = 0; i < ne0; ++i) ss += double(xt[i]) * xt[i];
                const double sc = 1.0 / std::sqrt(ss / double(ne0) + 1e-6);
                for (int64_t i = 0; i < ne0; ++i) {
                    const double ref = xt[i] * sc * b[size_t(i)];
                    EXPECT_NEAR(out[size_t(t * ne0 + i)], ref, 1e-6 * std::fabs(ref) + 1e-7);
                }
            }
            for (size_t i = a.size(); i < out.size(); ++i)
                EXPECT_EQ(out[i], -7.0f) << "past the end";
        }
        // HeadNorm: 3 heads of 20.
        const int64_t hd = 20, ne0 = 60, n = 2;
        auto x = random_floats(static_cast<size_t>(ne0 * n), 23, -2, 2);
        auto w = random_floats(static_cast<size_t>(hd), 24);
        TensorView hv{"head_norm", DType::F32, {hd, 1, 1, 1}, w.data(), hd * 4};
        std::vector<float> out(x.size());
        Node hn = make_node(Op::HeadNorm, {ne0, n, 1, 1});
        hn.meta.eps = 1e-6f;
        hn.meta.head_dim = hd;
        hn.weights = {&hv};
        cpu::run_node(hn, NodeData{{x.data()}, out.data(), nullptr, nullptr, {}}, pool);
        for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < ne0 / hd; ++h) {
                const float* xh = x.data() + t * ne0 + h * hd;
                double hs = 0;
                for (int64_t i = 0; i < hd; ++i) hs += double(xh[i]) * xh[i];
                const double hsc = 1.0 / std::sqrt(hs / hd + 1e-6);
                for (int64_t i = 0; i < hd; ++i) {
                    const double ref = xh[i] * hsc * w[size_t(i)];
                    EXPECT_NEAR(out[size_t(t * ne0 + h * hd + i)], ref,
                                1e-6 * std::fabs(ref) + 1e-7);
                }
            }
    });
}

TEST(CpuOps, GetRowsDequantizesAndRejectsBadIds) {
    const int64_t ne0 = 64, n_vocab = 10;
    ThreadPool pool(2);
    for (DType t : {DType::Q8_0, DType::F16, DType::Q6_K}) {
        const int64_t K = t == DType::Q6_K ? 256 : ne0;
        Weight table = make_weight(t, K, n_vocab, 9);
        std::vector<int32_t> ids = {3, 0, 9, 3};
        std::vector<float> out(static_cast<size_t>(K) * ids.size()), ref(static_cast<size_t>(K));
        Node node = make_node(Op::GetRows, {K, 4, 1, 1});
        node.weights = {&table.view};
        cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool);
        for (size_t i = 0; i < ids.size(); ++i) {
            cpu::dequant_row(t, table.view.row(ids[i]), ref.data(), K);
            EXPECT_EQ(0, std::memcmp(out.data() + i * K, ref.data(), static_cast<size_t>(K) * 4));
        }
        ids[2] = 10;
        EXPECT_THROW(
            cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool),
            Error);
        ids[2] = -1;
        EXPECT_THROW(
            cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool),
            Error);
    }
}

TEST(CpuOps, SelectRowsCopiesRows) {
    ThreadPool pool(1);
    auto src = random_floats(4 * 8, 5);
    std::vector<int32_t> ids = {7, 2};
    std::vector<float> out(8);
    Node node = make_node(Op::SelectRows, {4, 2, 1, 1});
    cpu::run_node(
        node,
        NodeData{
            {src.data(), ids.data()}, out.data(), nullptr, nullptr, {{4, 8, 1, 1}, {2, 1, 1, 1}}},
        pool);
    EXPECT_EQ(0, std::memcmp(out.data(), src.data() + 28, 16));
    EXPECT_EQ(0, std::memcmp(out.data() + 4, src.data() + 8, 16));
    ids[0] = 8;
    EXPECT_THROW(cpu::run_node(node,
                               NodeData{{src.data(), ids.data()},
                                        out.data(),
                                        nullptr,
                                        nullptr,
                                        {{4, 8, 1, 1}, {2, 1, 1, 1}}},
                               pool),
                 Error);
}

TEST(CpuOps, RopeMatchesClosedForm) {
    // theta_i = p * base^(-2i/d). ggml (and we) build theta by repeated float
    // multiplication: after i steps its relative error is about i * 2^-24
    // (plus powf's ulp), so |dtheta| <= p * (i + 2) * 2^-23 and the outputs
    // err by at most (|x0| + |x1|) * |dtheta| + a few ulp of sin/cos.
    const int64_t hd = 64, heads = 3, n = 4;
    ThreadPool pool(2);
    auto x = random_floats(static_cast<size_t>(hd * heads * n), 6);
    std::vector<int32_t> pos = {0, 1, 17, 300};
    std::vector<float> y(x.size());
    Node node = make_node(Op::Rope, {hd * heads, n, 1, 1});
    node.meta.head_dim = static_cast<int32_t>(hd);
    node.meta.rope_freq_base = 1000000.0f;
    cpu::run_node(node, NodeData{{x.data(), pos.data()}, y.data(), nullptr, nullptr, {}}, pool);
    for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < hd / 2; ++i) {
                const double theta =
                    pos[static_cast<size_t>(t)] * std::pow(1000000.0, -2.0 * i / hd);
                const size_t b = static_cast<size_t>(t * hd * heads + h * hd);
                const double x0 = x[b + i], x1 = x[b + i + hd / 2];
                const double tol =
                    (std::fabs(x0) + std::fabs(x1)) *
                    (pos[static_cast<size_t>(t)] * (i + 2) * std::ldexp(1.0, -23) + 4e-7);
                EXPECT_NEAR(y[b + i], x0 * std::cos(theta) - x1 * std::sin(theta), tol);
                EXPECT_NEAR(y[b + i + hd / 2], x0 * std::sin(theta) + x1 * std::cos(theta), tol);
            }
    // in place gives the same bits
    std::vector<float> z = x;
    cpu::run_node(node, NodeData{{z.data(), pos.data()}, z.data(), nullptr, nullptr, {}}, pool);
    EXPECT_EQ(0, std::memcmp(z.data(), y.data(), y.size() * 4));
}

// ---- KV cache and attention ------------------------------------------------------

namespace {
struct AttnSetup {
    int32_t n_head, n_head_kv, hd;
    int64_t n_ctx = 32;  // a multiple of the K block (ir/kv_layout.h)
    graph::NodeMeta meta() const {
        graph::NodeMeta m;
        m.n_head = n_head;
        m.n_head_kv = n_head_kv;
        m.head_dim = hd;
        m.n_ctx = n_ctx;
        return m;
    }
};

// fn throws a minfer::Error whose message holds `needle`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
    try {
        fn();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        return;
    }
    ADD_FAILURE() << "no minfer::Error thrown (expected one saying \"" << needle << "\")";
}

void kv_store(const AttnSetup& s, const float* k, const float* v, const int32_t* pos, int64_t n,
              std::vector<float>& K, std::vector<float>& V, ThreadPool& pool) {
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    Node node = make_node(Op::KvStore, {kv, s.n_ctx, 1, 1});
    node.meta = s.meta();
    NodeData d{
        {k, v, pos}, K.data(), K.data(), V.data(), {{kv, n, 1, 1}, {kv, n, 1, 1}, {n, 1, 1, 1}}};
    cpu::run_node(node, d, pool);
}
}  // namespace

TEST(CpuAttn, GqaMatchesNaiveSoftmaxAttention) {
    // Batch at positions 5..8 after 0..4 were stored. Reference: scores,
    // softmax and the weighted sum in double. Values in [-1, 1], head_dim
    // 64: each float dot of 64 terms errs by < 64 * 2^-24 * 64 relative to
    // its magnitude (< 64) -> < 1e-5 in a score, softmax and the sum of <= 9
    // weighted rows keep that order: 2e-5 absolute.
    for (AttnSetup s : {AttnSetup{14, 2, 64}, AttnSetup{4, 2, 64}}) {
        SCOPED_TRACE(s.n_head / s.n_head_kv);
        const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
        std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
        auto k_all = random_floats(static_cast<size_t>(kv * 9), 21);
        auto v_all = random_floats(static_cast<size_t>(kv * 9), 22);
        std::vector<int32_t> p0 = {0, 1, 2, 3, 4}, p1 = {5, 6, 7, 8};
        ThreadPool pool(2);
        kv_store(s, k_all.data(), v_all.data(), p0.data(), 5, K, V, pool);
        kv_store(s, k_all.data() + 5 * kv, v_all.data() + 5 * kv, p1.data(), 4, K, V, pool);
        // V rows as they come; K element-major in blocks of cells
        // (ir/kv_layout.h): element e of cell c at k_index(c, e, kv)
        EXPECT_EQ(0, std::memcmp(V.data(), v_all.data(), v_all.size() * 4));
        std::vector<float> k_want(K.size(), 0.0f);  // untouched cells stay 0
        for (int64_t c = 0; c < 9; ++c)
            for (int64_t e = 0; e < kv; ++e)
                k_want[static_cast<size_t>(graph::k_index(c, e, kv))] =
                    k_all[static_cast<size_t>(c * kv + e)];
        EXPECT_EQ(k_want, K);
        EXPECT_EQ(K[static_cast<size_t>(graph::kKBlockCells + 3)],
                  k_all[3 * kv + 1]);  // cell 3, e 1

        // q rows carry extra columns (the fused q|k|v layout): stride nq + 2kv
        const int64_t q_stride = nq + 2 * kv;
        auto q = random_floats(static_cast<size_t>(q_stride * 4), 23);
        std::vector<float> out(static_cast<size_t>(nq * 4));
        Node node = make_node(Op::Attn, {nq, 4, 1, 1});
        node.meta = s.meta();
        NodeData d{{q.data(), nullptr, p1.data()},
                   out.data(),
                   K.data(),
                   V.data(),
                   {{q_stride, 4, 1, 1}, {kv, s.n_ctx, 1, 1}, {4, 1, 1, 1}}};
        cpu::run_node(node, d, pool);
        std::vector<float> out1(out.size());
        ThreadPool one(1);
        d.out = out1.data();
        cpu::run_node(node, d, one);
        EXPECT_EQ(0, std::memcmp(out.data(), out1.data(), out.size() * 4));

        const int group = s.n_head / s.n_head_kv;
        for (int t = 0; t < 4; ++t)
            for (int h = 0; h < s.n_head; ++h) {
                const int kvh = h / group;
                const float* qh = q.data() + t * q_stride + h * s.hd;
                const int n_kv = p1[static_cast<size_t>(t)] + 1;
                std::vector<double> sc(static_cast<size_t>(n_kv));
                double mx = -1e300, sum = 0;
                for (int j = 0; j < n_kv; ++j) {
                    double dot = 0;
                    for (int i = 0; i < s.hd; ++i)
                        dot += double(qh[i]) * k_all[static_cast<size_t>(j * kv + kvh * s.hd + i)];
                    sc[static_cast<size_t>(j)] = dot / std::sqrt(double(s.hd));
                    mx = std::max(mx, sc[static_cast<size_t>(j)]);
                }
                for (auto& e : sc) sum += (e = std::exp(e - mx));
                for (int i = 0; i < s.hd; ++i) {
                    double ref = 0;
                    for (int j = 0; j < n_kv; ++j)
                        ref += sc[static_cast<size_t>(j)] / sum *
                               v_all[static_cast<size_t>(j * kv + kvh * s.hd + i)];
                    EXPECT_NEAR(out[static_cast<size_t>(t * nq + h * s.hd + i)], ref, 2e-5);
                }
            }
    }
}

TEST(CpuAttn, PositionPastContextThrowsAndWritesNothing) {
    AttnSetup s{4, 2, 8};
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
    auto k = random_floats(static_cast<size_t>(kv * 2), 1);
    std::vector<int32_t> pos = {31, 32};
    ThreadPool pool(1);
    expect_error([&] { kv_store(s, k.data(), k.data(), pos.data(), 2, K, V, pool); },
                 "position 32 is past the context size 32");
    for (float f : K) EXPECT_EQ(f, 0.0f);
    pos = {-1, 0};
    EXPECT_THROW(kv_store(s, k.data(), k.data(), pos.data(), 2, K, V, pool), Error);
}

TEST(CpuAttn, RegionsOfPartBlocksAndPagesOfPartBlocksAreErrors) {
    // K is stored in whole blocks of cells (ir/kv_layout.h): a region of
    // 40 cells would be read and written past its end, a page of 16 cells
    // would make the kernels read another page's cells as this one's.
    AttnSetup s{4, 2, 8};
    s.n_ctx = 40;
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
    auto k = random_floats(static_cast<size_t>(kv), 1);
    std::vector<int32_t> pos = {0};
    ThreadPool pool(1);
    expect_error([&] { kv_store(s, k.data(), k.data(), pos.data(), 1, K, V, pool); },
                 "40 cells are not a multiple of 32");
    for (float f : K) EXPECT_EQ(f, 0.0f);

    s.n_ctx = 64;
    Node node = make_node(Op::Attn, {int64_t{s.n_head} * s.hd, 1, 1, 1});
    node.meta = s.meta();
    node.meta.kv_page = 16;
    node.src = {0, 1, 2, 3, 4};
    std::vector<float> q(static_cast<size_t>(s.n_head * s.hd)), out(q.size());
    std::vector<int32_t> rows = {0}, table = {0, 1, 2, 3};
    K.assign(static_cast<size_t>(kv * s.n_ctx), 0.0f);
    V = K;
    NodeData d{{q.data(), nullptr, pos.data(), rows.data(), table.data()},
               out.data(),
               K.data(),
               V.data(),
               {{int64_t{s.n_head} * s.hd, 1, 1, 1},
                {kv, s.n_ctx, 1, 1},
                {1, 1, 1, 1},
                {1, 1, 1, 1},
                {4, 1, 1, 1}}};
    expect_error([&] { cpu::run_node(node, d, pool); }, "kv_page a multiple of 32");
}

// ---- fusion -----------------------------------------------------------------------

// FusedQKV + QkvBiasRopeStore must give the same bits as MatMul x3 +
// AddBias (qwen2) / HeadNorm (qwen3) + Rope + KvStore: the same per-element
// kernels run in both paths.
TEST(CpuFusion, FusedQkvEpilogueEqualsUnfusedChainBitForBit) {
    const int32_t n_head = 4, n_head_kv = 2, hd = 32;
    const int64_t n_embd = 128, nq = n_head * hd, nkv = n_head_kv * hd, n = 3, n_ctx = 32;
    auto x = random_floats(static_cast<size_t>(n_embd * n), 31);
    Weight wq = make_weight(DType::Q8_0, n_embd, nq, 1);
    Weight wk = make_weight(DType::Q4_0, n_embd, nkv, 2);
    Weight wv = make_weight(DType::Q5_0, n_embd, nkv, 3);
    auto b = random_floats(static_cast<size_t>(nq + 2 * nkv), 32);
    TensorView bq{"bq", DType::F32, {nq, 1, 1, 1}, b.data(), 0};
    TensorView bk{"bk", DType::F32, {nkv, 1, 1, 1}, b.data() + nq, 0};
    TensorView bv{"bv", DType::F32, {nkv, 1, 1, 1}, b.data() + nq + nkv, 0};
    TensorView qn{"q_norm", DType::F32, {hd, 1, 1, 1}, b.data(), 0};
    TensorView kn{"k_norm", DType::F32, {hd, 1, 1, 1}, b.data() + hd, 0};
    std::vector<int32_t> pos = {2, 3, 4};
    graph::NodeMeta meta;
    meta.n_head = n_head;
    meta.n_head_kv = n_head_kv;
    meta.head_dim = hd;
    meta.n_ctx = n_ctx;
    meta.eps = 1e-6f;
    meta.rope_freq_base = 1000000.0f;
    ThreadPool pool(2);
    const std::array<int64_t, 4> x_ne{n_embd, n, 1, 1}, pos_ne{n, 1, 1, 1};

    for (bool qwen3 : {false, true}) {
        SCOPED_TRACE(qwen3 ? "norms" : "biases");
        // fused
        std::vector<float> qkv(static_cast<size_t>((nq + 2 * nkv) * n));
        std::vector<float> Kf(static_cast<size_t>(nkv * n_ctx), 0.0f), Vf(Kf.size(), 0.0f);
        Node fq = make_node(Op::FusedQKV, {nq + 2 * nkv, n, 1, 1});
        fq.meta = meta;
        fq.weights = {&wq.view, &wk.view, &wv.view};
        cpu::run_node(fq, NodeData{{x.data()}, qkv.data(), nullptr, nullptr, {x_ne}}, pool);
        Node ep = make_node(Op::QkvBiasRopeStore, {nq + 2 * nkv, n, 1, 1});
        ep.meta = meta;
        if (qwen3)
            ep.weights = {&qn, &kn};
        else
            ep.weights = {&bq, &bk, &bv};
        cpu::run_node(ep,
                      NodeData{{qkv.data(), pos.data()},
                               qkv.data(),
                               Kf.data(),
                               Vf.data(),
                               {{nq + 2 * nkv, n, 1, 1}, pos_ne}},
                      pool);
        // unfused
        std::vector<float> Ku(Kf.size(), 0.0f), Vu(Kf.size(), 0.0f);
        auto mm = [&](const Weight& w, int64_t M) {
            std::vector<float> o(static_cast<size_t>(M * n));
            Node node = make_node(Op::MatMul, {M, n, 1, 1});
            node.weights = {&w.view};
            cpu::run_node(node, NodeData{{x.data()}, o.data(), nullptr, nullptr, {x_ne}}, pool);
            return o;
        };
        auto post = [&](std::vector<float>& v, int64_t M, const TensorView* bias,
                        const TensorView* norm, bool rope) {
            Node node = make_node(Op::AddBias, {M, n, 1, 1});
            node.meta = meta;
            if (bias) {
                node.weights = {bias};
                cpu::run_node(node, NodeData{{v.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
            if (norm) {
                node.op = Op::HeadNorm;
                node.weights = {norm};
                cpu::run_node(node, NodeData{{v.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
            if (rope) {
                node.op = Op::Rope;
                node.weights = {};
                cpu::run_node(
                    node, NodeData{{v.data(), pos.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
        };
        auto q = mm(wq, nq), k = mm(wk, nkv), v = mm(wv, nkv);
        post(q, nq, qwen3 ? nullptr : &bq, qwen3 ? &qn : nullptr, true);
        post(k, nkv, qwen3 ? nullptr : &bk, qwen3 ? &kn : nullptr, true);
        post(v, nkv, qwen3 ? nullptr : &bv, nullptr, false);
        Node st = make_node(Op::KvStore, {nkv, n_ctx, 1, 1});
        st.meta = meta;
        cpu::run_node(st,
                      NodeData{{k.data(), v.data(), pos.data()},
                               Ku.data(),
                               Ku.data(),
                               Vu.data(),
                               {{nkv, n, 1, 1}, {nkv, n, 1, 1}, pos_ne}},
                      pool);
        for (int64_t t = 0; t < n; ++t) {
            EXPECT_EQ(0, std::memcmp(qkv.data() + t * (nq + 2 * nkv), q.data() + t * nq,
                                     static_cast<size_t>(nq) * 4));
        }
        EXPECT_EQ(0, std::memcmp(Kf.data(), Ku.data(), Kf.size() * 4));
        EXPECT_EQ(0, std::memcmp(Vf.data(), Vu.data(), Vf.size() * 4));
        bool any = false;
        for (float f : Kf) any |= f != 0.0f;
        EXPECT_TRUE(any);
    }
}

namespace {
// A random K and V cache of n values each (seeds seed, seed + 1), as f32
// or as their f16 roundings.
struct RandomKv {
    std::vector<float> k32, v32;
    std::vector<uint16_t> k16, v16;
    bool f16;
    RandomKv(int64_t n, DType kvt, uint32_t seed)
        : k32(random_floats(static_cast<size_t>(n), seed)),
          v32(random_floats(static_cast<size_t>(n), seed + 1)),
          k16(k32.size()),
          v16(v32.size()),
          f16(kvt == DType::F16) {
        for (size_t i = 0; i < k32.size(); ++i) {
            k16[i] = fp32_to_fp16(k32[i]);
            v16[i] = fp32_to_fp16(v32[i]);
        }
    }
    void* k() { return f16 ? static_cast<void*>(k16.data()) : k32.data(); }
    void* v() { return f16 ? static_cast<void*>(v16.data()) : v32.data(); }
};

// Runs one Attn node of n_tok tokens at positions n_kv - n_tok .. n_kv - 1
// over a random cache with the SIMD kernels and with the scalar loop
// (MINFER_SCALAR_ATTN=1) and compares. The SIMD paths differ from the
// scalar loop only by float order and their exp (<= ~2 ulp): 2e-5 absolute
// for values in [-1, 1]. With an f16 cache, a probability may round to the
// neighbouring f16 (2^-11 relative) when its float differs in the last
// bits: <= n_kv * 2^-11 * |p| * |v| summed, 1e-3 absolute.
void expect_simd_attn_matches_scalar(const AttnSetup& s, DType kvt, int64_t n_tok, int64_t n_kv) {
    SCOPED_TRACE(std::string(dtype_name(kvt)) + " hd=" + std::to_string(s.hd) +
                 " heads=" + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                 " tokens=" + std::to_string(n_tok));
    const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
    RandomKv cache(kv * s.n_ctx, kvt, 31);
    void* K = cache.k();
    void* V = cache.v();
    const bool f16 = kvt == DType::F16;
    auto q = random_floats(static_cast<size_t>(nq * n_tok), 33);
    std::vector<int32_t> pos(static_cast<size_t>(n_tok));
    for (int64_t i = 0; i < n_tok; ++i) pos[size_t(i)] = int32_t(n_kv - n_tok + i);
    Node node = make_node(Op::Attn, {nq, n_tok, 1, 1});
    node.meta = s.meta();
    node.meta.kv_type = kvt;
    std::vector<float> fast(static_cast<size_t>(nq * n_tok), NAN), slow(fast.size());
    NodeData d{{q.data(), nullptr, pos.data()},
               fast.data(),
               K,
               V,
               {{nq, n_tok, 1, 1}, {kv, s.n_ctx, 1, 1}, {n_tok, 1, 1, 1}}};
    ThreadPool pool(2);
    cpu::run_node(node, d, pool);
    setenv("MINFER_SCALAR_ATTN", "1", 1);
    d.out = slow.data();
    cpu::run_node(node, d, pool);
    unsetenv("MINFER_SCALAR_ATTN");
    for (size_t i = 0; i < fast.size(); ++i)
        ASSERT_NEAR(fast[i], slow[i], f16 ? 1e-3 : 2e-5) << "i=" << i;
}
}  // namespace

namespace {
using minfer::testing::IsaCap;
// The levels this CPU can run that have a SIMD attention kernel: AVX2 and
// AVX-512 on x86-64 (attn.cpp), NEON, dotprod and i8mm on ARM64 (all three
// run arm/attn_neon.cpp's kernel).
std::vector<cpu::IsaLevel> attn_simd_levels() {
    std::vector<cpu::IsaLevel> out;
    for (cpu::IsaLevel l : cpu::isa_levels_supported()) {
        IsaCap cap(l);
        if (cpu::attn_simd_supported(64)) out.push_back(l);
    }
    return out;
}
}  // namespace

TEST(CpuAttn, EverySimdLevelMatchesTheScalarLoop) {
    // The same cases as the two tests below, at each level in turn (an
    // AVX-512 host runs the AVX2 kernels too): decode rows (2 tokens) and
    // prompt chunks (21 tokens, causal masks inside a vector, GQA 7:1, 2:1,
    // 1:1, head_dim 48, 64, 128).
    const auto levels = attn_simd_levels();
    if (levels.empty()) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
    for (cpu::IsaLevel l : levels) {
        IsaCap cap(l);
        SCOPED_TRACE(cpu::isa_name(l));
        ASSERT_TRUE(cpu::attn_simd_supported(64));
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{2, 2, 128, 64}})
            for (DType kvt : {DType::F32, DType::F16}) {
                expect_simd_attn_matches_scalar(s, kvt, 2, 37);
                expect_simd_attn_matches_scalar(s, kvt, 1, 1);  // one key
                expect_simd_attn_matches_scalar(s, kvt, 1, 8);  // one full 8-vector
            }
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{4, 2, 128, 64},
                            AttnSetup{2, 2, 128, 64}, AttnSetup{4, 2, 48, 64}})
            for (DType kvt : {DType::F32, DType::F16}) {
                expect_simd_attn_matches_scalar(s, kvt, 21, 45);
                expect_simd_attn_matches_scalar(s, kvt, 4, 4);  // keys < kKeysPerStep rows
            }
        if (HasFailure()) return;
    }
    // Scalar: no SIMD attention at all (the loop the others are compared with).
    IsaCap cap(cpu::IsaLevel::Scalar);
    EXPECT_FALSE(cpu::attn_simd_supported(64));
}

TEST(CpuAttn, SimdPathMatchesScalarLoopForF32AndF16Caches) {
    // Two tokens (the per-head kernel of decode): 37 cached rows (two full
    // 16-blocks and a masked tail), GQA 7:1 and 1:1, head_dim 64 and 128.
    // once per level with a SIMD attention kernel
    int levels = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        if (!cpu::attn_simd_supported(64)) return;
        ++levels;
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{2, 2, 128, 64}})
            for (DType kvt : {DType::F32, DType::F16})
                expect_simd_attn_matches_scalar(s, kvt, 2, 37);
    });
    if (levels == 0) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
}

TEST(CpuAttn, ATokenAloneIsBitwiseItsRowsInAChunk) {
    // A decode token (1 token: `group` rows; up to 8 rows take the
    // keys-in-lanes kernel) against the same token inside a 21-token
    // prompt chunk (the many-rows kernel, causal masks inside a vector):
    // the outputs must be bitwise equal, so a sequence's result does not
    // depend on how its prompt was chunked or what shares its pass. GQA
    // 1:1, 2:1, 4:1, 7:1; key counts 24..44, not multiples of 8 or 16, and
    // for Qwen3-0.6B's heads (16 / 8, 128) also 169..189 (several key
    // blocks of the few-rows P V, which reloads its sums between blocks).
    // On ARM64 every row takes the one per-row NEON kernel over keys
    // gathered for the whole chunk: the check there is that a row's result
    // does not depend on the gather's extent or on the chunk's other rows.
    const auto levels = attn_simd_levels();
    if (levels.empty()) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
    for (cpu::IsaLevel l : levels) {
        IsaCap cap(l);
        for (AttnSetup s :
             {AttnSetup{2, 2, 64, 64}, AttnSetup{4, 2, 128, 64}, AttnSetup{8, 2, 64, 64},
              AttnSetup{14, 2, 64, 64}, AttnSetup{16, 8, 128, 192}})
            for (DType kvt : {DType::F32, DType::F16}) {
                SCOPED_TRACE(std::string(cpu::isa_name(l)) + " " + std::string(dtype_name(kvt)) +
                             " heads=" + std::to_string(s.n_head));
                const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
                const int64_t n_tok = 21, p0 = s.n_ctx - n_tok - 3;
                RandomKv cache(kv * s.n_ctx, kvt, 41);
                void* K = cache.k();
                void* V = cache.v();
                auto q = random_floats(static_cast<size_t>(nq * n_tok), 43);
                std::vector<int32_t> pos(static_cast<size_t>(n_tok));
                for (int64_t i = 0; i < n_tok; ++i) pos[size_t(i)] = int32_t(p0 + i);
                ThreadPool pool(2);
                auto run = [&](const float* qs, const int32_t* ps, int64_t n, float* out) {
                    Node node = make_node(Op::Attn, {nq, n, 1, 1});
                    node.meta = s.meta();
                    node.meta.kv_type = kvt;
                    NodeData d{{qs, nullptr, ps},
                               out,
                               K,
                               V,
                               {{nq, n, 1, 1}, {kv, s.n_ctx, 1, 1}, {n, 1, 1, 1}}};
                    cpu::run_node(node, d, pool);
                };
                std::vector<float> chunk(static_cast<size_t>(nq * n_tok), NAN);
                run(q.data(), pos.data(), n_tok, chunk.data());
                for (int64_t t = 0; t < n_tok; ++t) {
                    std::vector<float> alone(static_cast<size_t>(nq), NAN);
                    run(q.data() + t * nq, pos.data() + t, 1, alone.data());
                    ASSERT_EQ(0, std::memcmp(alone.data(), chunk.data() + t * nq,
                                             static_cast<size_t>(nq) * 4))
                        << "token " << t << " (position " << p0 + t << ")";
                }
            }
    }
}

TEST(CpuAttn, ManyRowsPathMatchesScalarLoopForF32AndF16Caches) {
    // A prompt chunk (the many-rows kernel): 21 tokens at positions 24..44,
    // so blocks of tokens see different key counts (causal masking inside a
    // vector) and key counts not a multiple of 4; GQA 7:1 (112-row blocks),
    // 2:1, 1:1 and head_dim 48, 64, 128 (3, 4 and 8 vectors per row).
    // once per level with a SIMD attention kernel
    int levels = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        if (!cpu::attn_simd_supported(64)) return;
        ++levels;
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{4, 2, 128, 64},
                            AttnSetup{2, 2, 128, 64}, AttnSetup{4, 2, 48, 64}})
            for (DType kvt : {DType::F32, DType::F16})
                expect_simd_attn_matches_scalar(s, kvt, 21, 45);
    });
    if (levels == 0) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
}
