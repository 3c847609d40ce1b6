// The forward pass end to end on models the tests write themselves: against
// a plain double-precision reference, fused vs. unfused, one backend vs.
// two, one pass vs. several, every weight type.
#include <gtest/gtest.h>

#include <cmath>

#include "isa_levels.h"
#include "model/model.h"
#include "reference_forward.h"
#include "runtime/session.h"
#include "session_steps.h"
#include "tiny_model.h"
#include "util/error.h"

using namespace minfer;
using minfer::testing::TinyModelSpec;

namespace {

auto load(const TinyModelSpec& s) {
    return minfer::testing::load_tiny_model(s);
}

const std::vector<int32_t> kPrompt = {5, 77, 260, 13, 256, 99, 150, 3, 42, 200, 7, 257};

std::vector<float> run(const model::Model& m, runtime::SessionOptions o,
                       const std::vector<int32_t>& ids) {
    o.n_ctx = 64;
    o.n_threads = 2;
    runtime::Session s(m, o);
    return s.eval(ids, true);
}

using minfer::testing::max_rel_diff;

}  // namespace

// Tolerances. F32 weights: the engine computes in float with the same
// weights, so only float rounding separates it from the double reference
// (measured 1.6e-7 of the logit range; bound 1e-4). These cases carry the
// architecture check: a RoPE base off by 1.5x moves the logits by 6e-3, a
// missing bias or a wrong causal mask by far more. F16 / BF16: activations
// are rounded to 16 bits before the dot product as llama.cpp does (2^-11 and
// 2^-8 relative per element; measured 2.5e-4 and 1.6e-3). Quantized
// weights: activations are quantized to 8 bits per block (relative error up
// to 1/254 per element; measured 0.3%-1.1% of the logit range through two
// random layers; bound 2%). There the test proves the type is wired to the
// right kernel (a wrong dequantizer moves logits by their whole range);
// kernel-level tests bound each type's dot product tightly.
TEST(Forward, MatchesDoublePrecisionReferenceForEveryWeightType) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        struct Case {
            const char* arch;
            tensor::DType type;
            double tol;
        };
        const Case cases[] = {
            {"qwen2", tensor::DType::F32, 1e-4},  {"qwen3", tensor::DType::F32, 1e-4},
            {"qwen2", tensor::DType::F16, 2e-3},  {"qwen2", tensor::DType::BF16, 2e-2},
            {"qwen2", tensor::DType::Q8_0, 2e-2}, {"qwen3", tensor::DType::Q4_0, 2e-2},
            {"qwen2", tensor::DType::Q4_1, 2e-2}, {"qwen2", tensor::DType::Q5_0, 2e-2},
            {"qwen3", tensor::DType::Q5_1, 2e-2}, {"qwen2", tensor::DType::IQ4_NL, 2e-2},
        };
        for (const Case& c : cases) {
            TinyModelSpec s;
            s.arch = c.arch;
            s.weight_type = c.type;
            s.tied_output = c.type != tensor::DType::Q4_1;  // one untied case
            auto l = load(s);
            const std::vector<double> ref = minfer::testing::reference_logits(l->model, kPrompt);
            const std::vector<float> got = run(l->model, {}, kPrompt);
            EXPECT_LT(max_rel_diff(got, ref, l->model.hp.n_vocab), c.tol)
                << c.arch << " " << tensor::dtype_name(c.type);
        }
    });
}

namespace {
// A qwen3 tiny model whose rows are multiples of 256, as K-quants need.
TinyModelSpec k_quant_spec(tensor::DType t) {
    TinyModelSpec s;
    s.arch = "qwen3";
    s.n_embd = 256;
    s.n_head = 4;
    s.n_head_kv = 2;
    s.head_dim = 64;
    s.n_ff = 512;
    s.n_layer = 1;
    s.weight_type = t;
    return s;
}
}  // namespace

TEST(Forward, KQuantsMatchReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        for (tensor::DType t : {tensor::DType::Q2_K, tensor::DType::Q3_K, tensor::DType::Q4_K,
                                tensor::DType::Q5_K, tensor::DType::Q6_K, tensor::DType::IQ4_XS}) {
            auto l = load(k_quant_spec(t));
            const std::vector<double> ref = minfer::testing::reference_logits(l->model, kPrompt);
            const std::vector<float> got = run(l->model, {}, kPrompt);
            EXPECT_LT(max_rel_diff(got, ref, l->model.hp.n_vocab), 3e-2) << tensor::dtype_name(t);
        }
    });
}

TEST(Forward, InterleavedWeightsMatchReferenceInPromptAndDecode) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // Model::interleave_weights (the CLI's default) for each type with an
        // interleaved kernel: the prompt in one pass (GEMM on regrouped rows)
        // and token by token (the 16-row decode kernels), against the reference
        // computed from the file's layout, at the tolerances above.
        struct Case {
            const char* arch;
            tensor::DType type;
            bool k_quant;
        };
        for (const Case& c :
             {Case{"qwen2", tensor::DType::Q8_0, false}, Case{"qwen2", tensor::DType::Q5_0, false},
              Case{"qwen3", tensor::DType::Q4_K, true}, Case{"qwen3", tensor::DType::Q6_K, true}}) {
            SCOPED_TRACE(std::string(c.arch) + " " + std::string(tensor::dtype_name(c.type)));
            TinyModelSpec s = c.k_quant ? k_quant_spec(c.type) : TinyModelSpec{};
            s.arch = c.arch;
            s.weight_type = c.type;
            auto l = load(s);
            const std::vector<double> ref = minfer::testing::reference_logits(l->model, kPrompt);
            ASSERT_GT(l->model.interleave_weights(), 0u);
            const double tol = c.k_quant ? 3e-2 : 2e-2;
            EXPECT_LT(max_rel_diff(run(l->model, {}, kPrompt), ref, l->model.hp.n_vocab), tol);
            EXPECT_LT(max_rel_diff(minfer::testing::logits_token_by_token(l->model, kPrompt), ref,
                                   l->model.hp.n_vocab),
                      tol);
        }
    });
}

TEST(Forward, OtherHeadSizesAndRopeBases) {
    TinyModelSpec s;
    s.arch = "qwen3";
    s.n_head = 2;
    s.n_head_kv = 1;
    s.head_dim = 48;
    s.rope_freq_base = 1e6f;
    auto l = load(s);
    const std::vector<double> ref = minfer::testing::reference_logits(l->model, kPrompt);
    EXPECT_LT(max_rel_diff(run(l->model, {}, kPrompt), ref, l->model.hp.n_vocab), 1e-4);
}

TEST(Forward, FusedAndUnfusedGiveBitwiseEqualLogits) {
    for (const char* arch : {"qwen2", "qwen3"}) {
        TinyModelSpec s;
        s.arch = arch;
        s.weight_type = tensor::DType::Q8_0;
        auto l = load(s);
        runtime::SessionOptions fused, plain;
        fused.fuse = {.qkv = true, .ffn = true};
        plain.fuse = {.qkv = false, .ffn = false};
        EXPECT_EQ(run(l->model, fused, kPrompt), run(l->model, plain, kPrompt)) << arch;
    }
}

TEST(Forward, TwoBackendsGiveTheSameLogitsAsOne) {
    TinyModelSpec s;
    s.weight_type = tensor::DType::Q8_0;
    s.n_layer = 3;
    auto l = load(s);
    runtime::SessionOptions one, two;
    two.queue_first_layer = 1;
    two.queue_end_layer = 2;
    EXPECT_EQ(run(l->model, one, kPrompt), run(l->model, two, kPrompt));
}

TEST(Forward, PromptInSeveralPassesMatchesOnePass) {
    TinyModelSpec s;
    s.weight_type = tensor::DType::Q8_0;
    auto l = load(s);
    runtime::SessionOptions whole, chunks, single;
    chunks.n_batch = 5;
    single.n_batch = 1;
    const auto a = run(l->model, whole, kPrompt);
    for (const auto& o : {chunks, single}) {
        const auto b = run(l->model, o, kPrompt);
        ASSERT_EQ(a.size(), b.size());
        // The same kernels on the same rows: only the attention's KV length
        // differs per pass, which does not change the sums' order.
        for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-4f * (1 + std::abs(a[i])));
    }
}

TEST(Forward, DecodeStepsReuseOneGraphAndAllocateNothing) {
    TinyModelSpec s;
    auto l = load(s);
    runtime::SessionOptions o;
    o.n_ctx = 64;
    runtime::Session session(l->model, o);
    session.eval(kPrompt);
    for (int32_t t = 0; t < 10; ++t) session.eval(std::vector<int32_t>{t});
    EXPECT_EQ(session.stats().decode_steps, 10);
    EXPECT_EQ(session.stats().graphs_built, 2);  // one prefill, one decode
    EXPECT_EQ(session.stats().rebuilds_after_first_decode, 0);
    EXPECT_EQ(session.stats().allocations_after_first_decode, 0);
    // A second prompt pass of the same size reuses the cached prefill graph.
    session.truncate(0);
    session.eval(kPrompt);
    EXPECT_EQ(session.stats().graphs_built, 2);
}

TEST(Forward, ContextOverflowIsAnErrorAndRunsNothing) {
    TinyModelSpec s;
    auto l = load(s);
    runtime::SessionOptions o;
    o.n_ctx = 8;
    runtime::Session session(l->model, o);
    EXPECT_THROW(session.eval(kPrompt), Error);  // 12 tokens > 8
    EXPECT_EQ(session.n_past(), 0);
    EXPECT_THROW(session.eval(std::vector<int32_t>{100000}), Error);  // id outside the vocabulary
}

TEST(ContextPlan, ClampsRaisesAndRefuses) {
    auto p = runtime::plan_context(4096, false, 1024, 10);
    EXPECT_EQ(p.n_ctx, 1024);
    EXPECT_TRUE(p.warning.empty());  // the default was clamped, not the user's request
    p = runtime::plan_context(4096, true, 1024, 10);
    EXPECT_EQ(p.n_ctx, 1024);
    EXPECT_NE(p.warning.find("larger than the model's trained context"), std::string::npos);
    p = runtime::plan_context(100, true, 1024, 300, 50);
    EXPECT_EQ(p.n_ctx, 350);  // raised to fit the prompt and the tokens asked for
    EXPECT_THROW(runtime::plan_context(4096, false, 1024, 2000), Error);
}
