// The CPU's quantizers, dot products, matmul/GEMM and interleaved-group
// kernels (test_kernels_ops.cpp has the small ops, attention and fusion)
// against a straightforward scalar reference written here (double accumulation), with the tolerance
// of each comparison argued next to it. Weights are random bytes with sane block scales, so every
// bit pattern of the quant fields is exercised.
#include "backend/cpu/kernel_table.h"
#include "isa_levels.h"
#include "kernel_test_data.h"

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
    // Q8_K activations, at every level: bit-identical to the reference
    // quantizer, also for a zero block, blocks whose largest magnitude
    // comes with both signs (the first one's sign wins; in one vector of
    // the x86 search or in two; first in the block's last element),
    // infinities and values on rounding ties.
    auto x = random_floats(1536, 78, -3, 3);
    std::fill(x.begin() + 256, x.begin() + 512, 0.0f);
    x[520] = 2.5f;
    x[530] = -2.5f;
    for (int j = 540; j < 560; ++j) x[size_t(j)] = 2.5f * float(j - 550) / 127.0f * 0.5f;
    x[770] = -3.5f;
    x[775] = 3.5f;
    x[900] = 3.5f;
    x[1023] = -3.75f;
    x[1100] = INFINITY;
    x[1200] = -INFINITY;
    x[1535] = -3.25f;
    x[1300] = 3.25f;
    std::vector<uint8_t> qb(row_size(DType::Q8_K, 1536));
    tensor::quantize_row(DType::Q8_K, x.data(), qb.data(), 1536);
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        std::vector<uint8_t> qa(qb.size());
        cpu::quantize_act_row(DType::Q8_K, x.data(), qa.data(), 1536);
        EXPECT_EQ(0, std::memcmp(qa.data(), qb.data(), qa.size()));
    });
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
// x86-64 with AVX-VNNI and without, and there bitwise the scalar level's
// dot of the row (quant_dot.h).
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
            const cpu::VecDotFn scalar_dot = cpu::vec_dot_at(cpu::IsaLevel::Scalar, t);
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
#if defined(__x86_64__)
                            // the scalar level's dot takes the x86 GEMMs'
                            // float steps (quant_dot.h): the same bits
                            const float s = scalar_dot(K, w.view.row(m), qrows[size_t(tok)].data());
                            ASSERT_EQ(0, std::memcmp(&got, &s, 4))
                                << "t=" << tok << " m=" << m << ": " << got
                                << " vs the scalar level's " << s;
#endif
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

// gemm_quantize_act (the one step the matmul and MoE kernels take) gives
// the bytes of its two steps, quantize_act_row then gemm_pack_act, at every
// level: the AVX-512 level's direct Q8_K path included. The rows hold
// blocks with a zero block, a peak that is negative, a peak that ties
// (the first of equal magnitudes sets the sign), values a hair from a
// rounding tie, tiny values, and an infinite peak with a NaN beside it
// (x * iscale is NaN there, which nearest_int makes 0).
TEST(CpuGemm, QuantizeActIsQuantizeThenPack) {
    const int64_t K = 1280;
    std::vector<float> x = random_floats(static_cast<size_t>(K), 7, -2.0f, 2.0f);
    for (int64_t i = 256; i < 512; ++i) x[size_t(i)] = 0.0f;  // a zero block
    x[520] = -5.0f;                                           // a negative peak
    x[800] = 4.0f;                                            // a tie: +4 first, -4 after
    x[900] = -4.0f;
    for (int64_t i = 768; i < 780; ++i) x[size_t(i)] = 4.0f * (0.5f + float(i - 768)) / 127.0f;
    for (int64_t i = 960; i < 1024; ++i) x[size_t(i)] *= 1e-30f;
    x[1100] = -INFINITY;
    x[1150] = NAN;
    for (const DType at : {DType::Q8_K, DType::Q8_0}) {
        SCOPED_TRACE(dtype_name(at));
        minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
            if (cpu::gemm_name() == nullptr) return;  // no GEMM at this level
            const size_t bytes = cpu::gemm_act_row_bytes(at, K);
            std::vector<uint8_t> q(row_size(at, K)), two(bytes), one(bytes, 0xEE), tmp(q.size());
            cpu::quantize_act_row(at, x.data(), q.data(), K);
            cpu::gemm_pack_act(at, q.data(), K, two.data());
            cpu::gemm_quantize_act(at, x.data(), K, one.data(), tmp.data());
            for (size_t i = 0; i < bytes; ++i)
                ASSERT_EQ(one[i], two[i])
                    << "byte " << i << " of " << bytes << " at " << cpu::gemm_name();
        });
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
    // decode kernel (fewer than 4 tokens), the many-token group kernel
    // (AVX-512 Q8_0 and Q4_K, 2 to 16 tokens) and the GEMM (the rest) do per
    // row the same float steps on exact integer sums, so a token's outputs
    // are bitwise the same alone, among 3 and 9, and in 19 (the GEMM
    // everywhere), with 1 and 2 threads. matmul_batch_invariant says so,
    // and on x86-64 it must for all four types at Avx2 and at Avx512 (Q5_0
    // there with BITALG), or the check would pass by skipping. Rows
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
            const bool expected = level == cpu::IsaLevel::Avx2 ||
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
