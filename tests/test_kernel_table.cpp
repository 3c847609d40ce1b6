// The kernel table of every ISA level this CPU can run (backend/cpu/
// kernel_table.h) against the scalar level's: each entry on random data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/gemm.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/quant_dot.h"
#include "isa_levels.h"
#include "tensor/dtype.h"
#include "tensor/interleave.h"
#include "tensor/quants.h"

namespace cpu = minfer::cpu;
using minfer::tensor::DType;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

constexpr DType kWeightTypes[] = {DType::F32,  DType::F16,    DType::BF16,  DType::Q4_0,
                                  DType::Q4_1, DType::Q5_0,   DType::Q5_1,  DType::Q8_0,
                                  DType::Q2_K, DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                                  DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

// M rows of K random values quantized to t, and one activation row in
// act_type(t), with the float values both stand for.
struct Case {
    std::vector<uint8_t> w, act;
    std::vector<float> wf, af;
    size_t row_bytes;
};
Case make_case(DType t, int64_t K, int64_t M, uint32_t seed) {
    Case c;
    c.row_bytes = minfer::tensor::row_size(t, K);
    const std::vector<float> x = random_floats(static_cast<size_t>(K * M), seed);
    c.w.resize(c.row_bytes * static_cast<size_t>(M));
    c.wf.resize(x.size());
    for (int64_t m = 0; m < M; ++m) {
        uint8_t* row = c.w.data() + static_cast<size_t>(m) * c.row_bytes;
        minfer::tensor::quantize_row(t, x.data() + m * K, row, K);
        minfer::tensor::dequantize_row(t, row, c.wf.data() + m * K, K);
    }
    const DType at = cpu::act_type(t);
    const std::vector<float> a = random_floats(static_cast<size_t>(K), seed + 1);
    c.act.resize(minfer::tensor::row_size(at, K));
    cpu::quantize_act_row(at, a.data(), c.act.data(), K);
    c.af.resize(static_cast<size_t>(K));
    cpu::dequant_row(at, c.act.data(), c.af.data(), K);
    return c;
}

// Two dot products of the same integer sums differ only in the order of
// their float steps: each rounding is at most 2^-24 of the magnitude, at
// most K/32 block terms + 8 per block chain (the bound test_kernels.cpp's
// CpuMatMul tests hold each level to), twice (one per side).
double order_bound(const Case& c, int64_t K, int64_t m) {
    double mag = 0;
    for (int64_t i = 0; i < K; ++i)
        mag += std::fabs(double(c.wf[size_t(m * K + i)]) * c.af[size_t(i)]);
    return 2 * (K / 32 + 8) * std::ldexp(mag, -24) + 1e-7;
}

}  // namespace

TEST(IsaLevels, EveryLevelsKernelTableMatchesTheScalarOne) {
    const cpu::KernelTable& ref = cpu::kernels_at(cpu::IsaLevel::Scalar);
    EXPECT_EQ(ref.gemm, cpu::GemmIsa::None);
    EXPECT_EQ(ref.attn_rows, nullptr);
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        const cpu::KernelTable& t = cpu::kernels();
        ASSERT_EQ(&t, &cpu::kernels_at(level));
        EXPECT_EQ(t.level, level);
        EXPECT_EQ(t.avx_vnni, cpu::avx_vnni_enabled());
        // The families read this table.
        EXPECT_EQ(t.gemm != cpu::GemmIsa::None, cpu::gemm_name() != nullptr);
#if defined(__x86_64__)
        EXPECT_EQ(t.attn_rows != nullptr, cpu::attn_simd_supported(64));
        EXPECT_EQ(t.attn_rows != nullptr, level != cpu::IsaLevel::Scalar);
#endif
        // The row helpers: within the rounding of their exp (swiglu) and of
        // their double sums' order (sum_squares) of the scalar level's.
        ASSERT_NE(t.swiglu, nullptr);
        ASSERT_NE(t.sum_squares, nullptr);
        {
            const int64_t n = 203;  // not a multiple of any vector width
            const std::vector<float> a = random_floats(size_t(n), 7),
                                     b = random_floats(size_t(n), 8);
            std::vector<float> y(static_cast<size_t>(n)), y_ref(static_cast<size_t>(n));
            t.swiglu(a.data(), b.data(), y.data(), n);
            ref.swiglu(a.data(), b.data(), y_ref.data(), n);
            for (size_t i = 0; i < size_t(n); ++i)
                EXPECT_NEAR(y[i], y_ref[i], 2e-6 * std::fabs(y_ref[i]) + 1e-30) << "swiglu " << i;
            const double s = t.sum_squares(a.data(), n), s_ref = ref.sum_squares(a.data(), n);
            EXPECT_NEAR(s, s_ref, s_ref * 1e-12);
        }
        const int64_t K = 512, M = minfer::tensor::kInterleaveRows;
        for (DType w : kWeightTypes) {
            SCOPED_TRACE(std::string(minfer::tensor::dtype_name(w)));
            const cpu::VecDotFn dot = t.vec_dot_of(w), dot_ref = ref.vec_dot_of(w);
            ASSERT_NE(dot, nullptr);
            ASSERT_NE(dot_ref, nullptr);
            EXPECT_EQ(dot, cpu::vec_dot_fn(w));
            EXPECT_EQ(t.group_dot_of(w), cpu::group_dot_fn(w));
            EXPECT_EQ(t.group_dot_many_of(w), cpu::group_dot_many_fn(w));
            const Case c = make_case(w, K, M, 31 + static_cast<uint32_t>(w));
            std::vector<float> want(static_cast<size_t>(M));
            for (int64_t m = 0; m < M; ++m) {
                const uint8_t* row = c.w.data() + static_cast<size_t>(m) * c.row_bytes;
                want[size_t(m)] = dot_ref(K, row, c.act.data());
                EXPECT_NEAR(dot(K, row, c.act.data()), want[size_t(m)], order_bound(c, K, m))
                    << "row " << m;
            }
            const cpu::GroupDotFn group = t.group_dot_of(w);
            if (group == nullptr) continue;
            ASSERT_TRUE(minfer::tensor::can_interleave(w, K, M));
            std::vector<uint8_t> il(c.w.size());
            minfer::tensor::interleave_rows(w, c.w.data(), K, M, il.data());
            float got[minfer::tensor::kInterleaveRows];
            group(K, il.data(), c.act.data(), got);
            // The scalar dot takes the group kernels' float steps
            // (quant_dot.h): the same bits, so the level does not change a
            // regrouped row's sums.
            for (int64_t m = 0; m < M; ++m)
                EXPECT_EQ(0, std::memcmp(&got[m], &want[size_t(m)], sizeof(float)))
                    << "group row " << m << ": " << got[m] << " vs the scalar level's "
                    << want[size_t(m)];
            // Several tokens at once: bitwise the group dot of each.
            const cpu::GroupDotManyFn many = t.group_dot_many_of(w);
            if (many == nullptr) continue;
            const size_t ar = c.act.size();
            std::vector<uint8_t> acts(3 * ar);
            for (int i = 0; i < 3; ++i) std::memcpy(acts.data() + i * ar, c.act.data(), ar);
            float outs[3 * minfer::tensor::kInterleaveRows];
            many(K, il.data(), acts.data(), ar, 3, outs, M);
            for (int i = 0; i < 3; ++i)
                EXPECT_EQ(0, std::memcmp(outs + i * M, got, sizeof got)) << "token " << i;
        }
    });
}
