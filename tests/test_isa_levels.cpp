// The kernel entry points at every ISA level this CPU offers
// (cpu::isa_levels_supported(): scalar and, on x86-64, avx2/avx512; on ARM64,
// neon/dotprod/i8mm), each capped in turn with cpu::set_isa_cap, against
// double-precision references. On ARM64 the NEON dot products also promise
// the portable kernels' result bit for bit (arm/quant_dot_neon.inc), which is
// checked against the scalar level.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attn.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"

using namespace minfer;
using tensor::DType;

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// Restores the level in effect before the test (the detected one, or
// MINFER_CPU's cap) when it ends, whatever it capped.
struct LevelGuard {
    cpu::IsaLevel before = cpu::isa_level();
    ~LevelGuard() { cpu::set_isa_cap(before); }
};

const DType kDotTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,
                           DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,   DType::Q3_K,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

TEST(IsaLevels, ListStartsWithScalarAndEndsWithTheDetectedLevel) {
    const auto levels = cpu::isa_levels_supported();
    ASSERT_FALSE(levels.empty());
    EXPECT_EQ(levels.front(), cpu::IsaLevel::Scalar);
    EXPECT_EQ(levels.back(), cpu::isa_detected());
    std::string names;
    for (auto l : levels) names += std::string(" ") + cpu::isa_name(l);
    std::printf("ISA levels on this CPU:%s\n", names.c_str());
#if defined(__aarch64__)
    // ASIMD is part of the ARMv8-A baseline every ARM64 Linux runs.
    EXPECT_GE(levels.size(), 2u);
    EXPECT_EQ(levels[1], cpu::IsaLevel::Neon);
#endif
}

// Which dot products have their own code at each level (the function differs
// from the scalar level's) and which run the portable kernel, and which
// prompt GEMM runs (none at the scalar level: prompts take the dot
// products): printed for scripts/test_arm64.sh's summary, and checked where
// the code promises a path.
TEST(IsaLevels, ReportsWhichKernelsHaveASimdPathAtEachLevel) {
    LevelGuard guard;
    cpu::set_isa_cap(cpu::IsaLevel::Scalar);
    EXPECT_EQ(cpu::gemm_name(), nullptr);
    std::printf("kernels at scalar: portable only; prompt GEMM none (dot products)\n");
    std::vector<cpu::VecDotFn> portable;
    for (DType t : kDotTypes) portable.push_back(cpu::vec_dot_fn(t));
    EXPECT_FALSE(cpu::attn_simd_supported(128));
    for (cpu::IsaLevel level : cpu::isa_levels_supported()) {
        if (level == cpu::IsaLevel::Scalar) continue;
        cpu::set_isa_cap(level);
        std::string own, fallback;
        for (size_t i = 0; i < std::size(kDotTypes); ++i) {
            std::string& list = cpu::vec_dot_fn(kDotTypes[i]) != portable[i] ? own : fallback;
            list += ' ';  // appended: " " + string trips GCC 12's false -Wrestrict
            list += tensor::dtype_name(kDotTypes[i]);
        }
        const char* gemm = cpu::gemm_name();
        std::printf(
            "kernels at %s: vec_dot own path:%s; portable:%s; attention %s; prompt GEMM %s\n",
            cpu::isa_name(level), own.c_str(), fallback.c_str(),
            cpu::attn_simd_supported(128) ? "own path" : "portable",
            gemm != nullptr ? gemm : "none (dot products)");
#if defined(__x86_64__)
        // Every dot product follows the cap: the portable loops too are
        // built per level (x86-64-v3 / v4) and picked by it, so none runs
        // the scalar level's code here (nor wider code under a lower cap).
        EXPECT_TRUE(fallback.empty())
            << "the scalar level's code at " << cpu::isa_name(level) << ":" << fallback;
#endif
#if defined(__x86_64__) || defined(__aarch64__)
        // every SIMD level of both has a GEMM (of Q8_0, Q4_0, Q5_0, Q4_K, Q5_K, Q6_K)
        EXPECT_NE(gemm, nullptr);
        for (DType t :
             {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q5_K, DType::Q6_K})
            EXPECT_TRUE(cpu::gemm_supported(t, 512)) << tensor::dtype_name(t);
#endif
#if defined(__aarch64__)
        for (DType t :
             {DType::Q8_0, DType::Q4_0, DType::Q5_0, DType::Q4_K, DType::Q5_K, DType::Q6_K}) {
            std::string name = " ";  // (built by appends: GCC 12 warns on " " + string)
            name += tensor::dtype_name(t);
            name += ' ';
            EXPECT_NE((own + " ").find(name), std::string::npos) << name;
        }
        EXPECT_TRUE(cpu::attn_simd_supported(128));
        // each level runs its own GEMM (the three give the same bits, so
        // only the name tells a level that fell back to a lower one)
        const char* want = level == cpu::IsaLevel::I8mm      ? "neon smmla"
                           : level == cpu::IsaLevel::Dotprod ? "neon sdot"
                                                             : "neon vmull";
        EXPECT_STREQ(gemm, want);
#endif
    }
}

TEST(IsaLevels, EveryDotProductAtEveryLevelMatchesDoubleReference) {
    LevelGuard guard;
    const int64_t K = 1024, rows = 6;
    // Weights with an outlier per row (wide block scales, high bits set),
    // activations with one too.
    auto wf = random_floats(static_cast<size_t>(K * rows), 21, -1, 1);
    for (int64_t r = 0; r < rows; ++r) wf[static_cast<size_t>(r * K + 37 * (r + 1))] = 4.0f;
    auto x = random_floats(static_cast<size_t>(K), 22, -1, 1);
    x[300] = -3.5f;

    for (DType t : kDotTypes) {
        SCOPED_TRACE(std::string(tensor::dtype_name(t)));
        const DType at = cpu::act_type(t);
        const size_t wbytes = tensor::row_size(t, K);
        std::vector<uint8_t> w(wbytes * rows), a(tensor::row_size(at, K));
        for (int64_t r = 0; r < rows; ++r)
            tensor::quantize_row(t, wf.data() + r * K, w.data() + r * wbytes, K);
        cpu::quantize_act_row(at, x.data(), a.data(), K);
        // The reference: both operands as the kernel sees them, in double.
        std::vector<float> wd(static_cast<size_t>(K)), ad(static_cast<size_t>(K));
        tensor::dequantize_row(at, a.data(), ad.data(), K);

        std::vector<float> scalar(static_cast<size_t>(rows));
        for (cpu::IsaLevel level : cpu::isa_levels_supported()) {
            SCOPED_TRACE(cpu::isa_name(level));
            cpu::set_isa_cap(level);
            const cpu::VecDotFn dot = cpu::vec_dot_fn(t);
            ASSERT_NE(dot, nullptr);
            for (int64_t r = 0; r < rows; ++r) {
                tensor::dequantize_row(t, w.data() + r * wbytes, wd.data(), K);
                double ref = 0, mag = 0;
                for (int64_t i = 0; i < K; ++i) {
                    ref += double(wd[size_t(i)]) * ad[size_t(i)];
                    mag += std::fabs(double(wd[size_t(i)]) * ad[size_t(i)]);
                }
                const float got = dot(K, w.data() + r * wbytes, a.data());
                // Integer sums are exact; what remains is float rounding of
                // the block scales' products and of the running sum over
                // K / 32 blocks (F16/BF16/F32: K float products and sums):
                // 1e-5 of the sum of magnitudes covers that with a margin.
                EXPECT_NEAR(got, ref, 1e-5 * mag) << "row " << r;
                if (level == cpu::IsaLevel::Scalar) {
                    scalar[size_t(r)] = got;
                } else {
#if defined(__aarch64__)
                    uint32_t gb, sb;
                    std::memcpy(&gb, &got, 4);
                    std::memcpy(&sb, &scalar[size_t(r)], 4);
                    EXPECT_EQ(gb, sb)
                        << "row " << r << ": NEON " << got << " vs portable " << scalar[size_t(r)];
#endif
                }
            }
        }
    }
}

TEST(IsaLevels, SwigluAndSumOfSquaresAtEveryLevelMatchDoubleReference) {
    LevelGuard guard;
    const int64_t n = 203;  // not a multiple of any vector width: tails run
    auto a = random_floats(size_t(n), 31, -12, 12);
    auto b = random_floats(size_t(n), 32, -2, 2);
    a[0] = -95.0f;  // exp(95) overflows float: silu is -0
    a[1] = 95.0f;
    a[2] = 0.0f;
    auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
    for (cpu::IsaLevel level : cpu::isa_levels_supported()) {
        SCOPED_TRACE(cpu::isa_name(level));
        cpu::set_isa_cap(level);
        std::vector<float> y(static_cast<size_t>(n)), g(static_cast<size_t>(n));
        cpu::swiglu_row(a.data(), nullptr, y.data(), n);
        cpu::swiglu_row(a.data(), b.data(), g.data(), n);
        for (int64_t i = 0; i < n; ++i) {
            const double s = silu(a[size_t(i)]), sg = s * b[size_t(i)];
            // exp within about 1 ulp, then one division and one product.
            EXPECT_NEAR(y[size_t(i)], s, 1e-6 * std::fabs(s) + 1e-30) << "i " << i;
            EXPECT_NEAR(g[size_t(i)], sg, 1e-6 * std::fabs(sg) + 1e-30) << "i " << i;
        }
        double ref = 0;
        for (float v : a) ref += double(v) * v;
        // each square rounded to float (2^-24 relative), summed in double
        EXPECT_NEAR(cpu::sum_squares(a.data(), n), ref, ref * 1e-7);
    }
}

}  // namespace
