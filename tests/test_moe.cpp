// Mixture-of-experts models (qwen2moe, qwen3moe) on files the tests write
// themselves: loading and its errors, the MoE ops against plain references
// (top-k ties, weights, grouping, only the chosen experts read), the whole
// forward pass against the double-precision reference at every ISA level,
// and a token's logits alone against batched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <span>

#include "backend/cpu/kernels.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_ops.h"
#include "cli_runner.h"
#include "ir/moe_layout.h"
#include "isa_levels.h"
#include "model/model.h"
#include "reference_forward.h"
#include "report/observe.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "session_steps.h"
#include "tensor/interleave.h"
#include "tensor/quants.h"
#include "tiny_model.h"
#include "util/error.h"

using namespace minfer;
using minfer::testing::TinyModelSpec;

namespace {

const std::vector<int32_t> kPrompt = {5, 77, 260, 13, 256, 99, 150, 3, 42, 200, 7, 257};

// Seed 2: no token's router puts two experts so close at the k-th place
// that the 8-bit activations of a quantized model swap them (with seed 1,
// token 10 of kPrompt does: one expert's SwiGLU replaced by another's moves
// its logits by 3.8% of their range, against 0.4-0.8% for the others).
TinyModelSpec moe_spec(const char* arch, tensor::DType t = tensor::DType::F32) {
    TinyModelSpec s;
    s.arch = arch;
    s.weight_type = t;
    s.tied_output = false;
    s.seed = 2;
    return s;
}

// n_embd and the expert widths multiples of 256, as K-quants need
TinyModelSpec k_quant_moe_spec(const char* arch, tensor::DType t) {
    TinyModelSpec s = moe_spec(arch, t);
    s.n_embd = 256;
    s.head_dim = 64;
    s.n_ff_exp = 256;
    s.n_ff_shexp = 256;
    s.n_layer = 1;
    return s;
}

std::vector<float> run(const model::Model& m, const std::vector<int32_t>& ids,
                       runtime::SessionOptions o = {}) {
    o.n_ctx = 64;
    o.n_threads = 2;
    runtime::Session s(m, o);
    return s.eval(ids, true);
}

using minfer::testing::max_rel_diff;

// The tiny model's file with one tensor left out, or one key changed.
std::vector<uint8_t> without_tensor(const TinyModelSpec& s, const std::string& drop) {
    const std::vector<uint8_t> good = minfer::testing::make_tiny_model(s).to_bytes();
    const gguf::File f = gguf::File::parse(good.data(), good.size());
    gguf::Writer w;
    w.copy_metadata(f);
    for (const auto& t : f.tensors()) {
        if (t.name == drop) continue;
        const auto* p = static_cast<const uint8_t*>(t.data);
        w.add_tensor(t.name, t.type, std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims),
                     std::vector<uint8_t>(p, p + t.nbytes));
    }
    return w.to_bytes();
}

std::string load_error(const std::vector<uint8_t>& bytes) {
    try {
        model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size()));
    } catch (const Error& e) {
        return e.what();
    }
    return "(loaded)";
}

}  // namespace

TEST(Moe, LoadsBothArchitecturesHyperParametersAndExpertTensors) {
    for (const char* arch : {"qwen2moe", "qwen3moe"}) {
        auto l = minfer::testing::load_tiny_model(moe_spec(arch));
        const auto& hp = l->model.hp;
        EXPECT_TRUE(hp.moe());
        EXPECT_EQ(hp.n_expert, 8);
        EXPECT_EQ(hp.n_expert_used, 2);
        EXPECT_EQ(hp.n_ff_exp, 32);
        EXPECT_EQ(hp.moe_norm_weights(), std::string(arch) == "qwen3moe");
        const auto& L = l->model.layers[1];
        ASSERT_NE(L.ffn_down_exps, nullptr);
        EXPECT_EQ(L.ffn_down_exps->ne, (std::array<int64_t, 4>{32, 64, 8, 1}));
        EXPECT_EQ(L.ffn_gate_inp->ne, (std::array<int64_t, 4>{64, 8, 1, 1}));
        EXPECT_EQ(L.w_gate, nullptr);
        if (std::string(arch) == "qwen2moe") {
            EXPECT_EQ(hp.n_ff_shexp, 64);
            ASSERT_NE(L.ffn_gate_inp_shexp, nullptr);
            EXPECT_EQ(L.ffn_up_shexp->ne[1], 64);
            EXPECT_NE(L.bq, nullptr);  // qwen2's attention
        } else {
            EXPECT_EQ(L.ffn_gate_inp_shexp, nullptr);
            EXPECT_NE(L.q_norm, nullptr);  // qwen3's attention
        }
    }
}

TEST(Moe, HostileFilesAreNamedErrors) {
    const TinyModelSpec s2 = moe_spec("qwen2moe");
    // a missing expert tensor, router, shared expert
    for (const char* t : {"blk.1.ffn_down_exps.weight", "blk.0.ffn_gate_inp.weight",
                          "blk.0.ffn_up_shexp.weight", "blk.1.ffn_gate_inp_shexp.weight"}) {
        const std::string e = load_error(without_tensor(s2, t));
        EXPECT_NE(e.find(std::string("missing tensor '") + t + "'"), std::string::npos) << e;
    }
    // expert_count disagreeing with the tensors (more experts than stored:
    // an id the router could give would read past the tensor)
    for (int64_t n : {9, 7}) {
        gguf::Writer w = minfer::testing::make_tiny_model(moe_spec("qwen3moe"));
        w.set_u32("qwen3moe.expert_count", static_cast<uint32_t>(n));
        const std::string e = load_error(w.to_bytes());
        EXPECT_NE(e.find("ffn_gate_inp.weight' has shape [64, 8]"), std::string::npos) << e;
    }
    {
        gguf::Writer w = minfer::testing::make_tiny_model(moe_spec("qwen3moe"));
        w.set_u32("qwen3moe.expert_used_count", 9);
        const std::string e = load_error(w.to_bytes());
        EXPECT_NE(e.find("expert_used_count' = 9 exceeds"), std::string::npos) << e;
    }
    {
        gguf::Writer w = minfer::testing::make_tiny_model(moe_spec("qwen3moe"));
        w.set_u32("qwen3moe.expert_feed_forward_length", 33);
        const std::string e = load_error(w.to_bytes());
        EXPECT_NE(e.find("ffn_gate_exps.weight' has shape [64, 32, 8]"), std::string::npos) << e;
    }
    {
        gguf::Writer w = minfer::testing::make_tiny_model(moe_spec("qwen3moe"));
        w.set_u32("qwen3moe.expert_count", 0);
        const std::string e = load_error(w.to_bytes());
        EXPECT_NE(e.find("'qwen3moe.expert_count' = 0 is out of range"), std::string::npos) << e;
    }
}

// The ops on their own, against what llama.cpp's graph computes.
TEST(Moe, TopKKeepsTheLargestAndBreaksTiesAsGgmlsArgsort) {
    ThreadPool pool(1);
    graph::Node node;
    node.op = graph::Op::TopK;
    node.ne = {3, 2, 1, 1};
    node.type = tensor::DType::I32;
    // row 0: ties at 0.25 (experts 1, 3, 4): llama.cpp keeps index order for
    // 16 or fewer experts; row 1: distinct values
    const std::vector<float> p = {0.1f, 0.25f, 0.05f, 0.25f, 0.25f, 0.1f,
                                  0.3f, 0.1f,  0.2f,  0.05f, 0.15f, 0.2f};
    std::vector<int32_t> out(6, -1);
    cpu::NodeData d;
    d.src = {p.data()};
    d.src_ne = {{6, 2, 1, 1}};
    d.out = out.data();
    cpu::run_node(node, d, pool);
    EXPECT_EQ(out, (std::vector<int32_t>{1, 3, 4, 0, 2, 5}));
}

TEST(Moe, WeightsAreTheChosenProbabilitiesRenormalizedForQwen3Moe) {
    ThreadPool pool(1);
    const std::vector<float> p = {0.1f, 0.4f, 0.2f, 0.3f};
    const std::vector<int32_t> ids = {1, 3};
    for (bool norm : {false, true}) {
        graph::Node node;
        node.op = graph::Op::MoeWeights;
        node.ne = {2, 1, 1, 1};
        node.meta.moe_norm = norm;
        std::vector<float> w(2);
        cpu::NodeData d;
        d.src = {p.data(), ids.data()};
        d.src_ne = {{4, 1, 1, 1}, {2, 1, 1, 1}};
        d.out = w.data();
        cpu::run_node(node, d, pool);
        EXPECT_FLOAT_EQ(w[0], norm ? 0.4f / 0.7f : 0.4f);
        EXPECT_FLOAT_EQ(w[1], norm ? 0.3f / 0.7f : 0.3f);
    }
}

TEST(Moe, GroupingIsByExpertInTokenOrderAndRejectsBadIds) {
    ThreadPool pool(1);
    const int64_t n_expert = 4, k = 2, n = 3, slots = k * n;
    const std::vector<int32_t> ids = {2, 0, 0, 3, 2, 3};  // tokens 0, 1, 2
    graph::Node node;
    node.op = graph::Op::MoeGroup;
    node.type = tensor::DType::I32;
    node.meta.n_expert = static_cast<int32_t>(n_expert);
    node.ne = {graph::moe_group_size(n_expert, slots), 1, 1, 1};
    std::vector<int32_t> out(static_cast<size_t>(node.ne[0]));
    cpu::NodeData d;
    d.src = {ids.data()};
    d.src_ne = {{k, n, 1, 1}};
    d.out = out.data();
    cpu::run_node(node, d, pool);
    const graph::MoeGroupView gv(out.data(), n_expert, slots);
    EXPECT_EQ(std::vector<int32_t>(gv.offset, gv.offset + n_expert + 1),
              (std::vector<int32_t>{0, 2, 2, 4, 6}));  // expert 1: no slot
    EXPECT_EQ(std::vector<int32_t>(gv.slot_at, gv.slot_at + slots),
              (std::vector<int32_t>{1, 2, 0, 4, 3, 5}));
    for (int64_t s = 0; s < slots; ++s) EXPECT_EQ(gv.slot_at[gv.position[s]], s);
    const std::vector<int32_t> bad = {2, 0, 0, 4, 2, 3};
    d.src = {bad.data()};
    try {
        cpu::run_node(node, d, pool);
        FAIL() << "expert id 4 of 4 experts accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("expert id 4 is outside [0, 4)"), std::string::npos);
    }
}

// MatMulId reads only the experts some slot chose: the others' slices are
// NaN here, and every output must still match the reference (a read of a
// NaN slice would poison its rows). Each row alone gives the same bits
// wherever the dense matmul is batch invariant for the slice.
// An expert tensor [K, M, n_expert] of type t in the file's layout, or
// regrouped 16 rows at a time (tensor/interleave.h) as the model's load does.
struct ExpertTensor {
    std::vector<uint8_t> file;   // GGUF layout, for the reference
    std::vector<uint8_t> bytes;  // what the kernel reads
    tensor::TensorView w;
    size_t slice_bytes = 0;
};

ExpertTensor make_experts(tensor::DType t, int64_t K, int64_t M, int64_t n_expert, bool regroup,
                          const std::vector<int64_t>& poisoned, uint32_t seed) {
    ExpertTensor x;
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> wf(static_cast<size_t>(K * M * n_expert));
    for (auto& v : wf) v = g(rng);
    x.file = minfer::testing::encode_tensor(t, wf, K);
    x.slice_bytes = tensor::row_size(t, K) * static_cast<size_t>(M);
    // experts nobody chooses: their bytes become NaN, so a read shows
    for (int64_t e : poisoned) {
        if (t == tensor::DType::F32) {
            auto* f = reinterpret_cast<float*>(x.file.data() + e * x.slice_bytes);
            std::fill(f, f + K * M, std::numeric_limits<float>::quiet_NaN());
        } else {
            std::fill(x.file.begin() + e * x.slice_bytes, x.file.begin() + (e + 1) * x.slice_bytes,
                      0xFF);
        }
    }
    x.bytes = x.file;
    x.w.name = "exps";
    x.w.type = t;
    x.w.ne = {K, M, n_expert, 1};
    if (regroup) {
        EXPECT_TRUE(tensor::can_interleave(t, K, M));
        tensor::interleave_rows(t, x.file.data(), K, M * n_expert, x.bytes.data());
        x.w.layout = tensor::TensorView::Layout::Rows16;
    }
    x.w.data = x.bytes.data();
    x.w.nbytes = x.bytes.size();
    return x;
}

// MoeGroup, MoeGather and MatMulId as the graph runs them, for the tokens xs
// [K, n] and their expert ids [k, n]; y is [M, slots] grouped by expert.
// With `up`, the node is MatMulIdSwiGLU: y = silu(w rows) * (up rows).
struct MatMulIdRun {
    std::vector<int32_t> grp;
    std::vector<float> rows;  // [K, slots] grouped
    std::vector<float> y;     // [M, slots] grouped
};

MatMulIdRun run_matmul_id(const tensor::TensorView& w, const std::vector<float>& xs,
                          const std::vector<int32_t>& ids, int64_t k, ThreadPool& pool,
                          bool batch_invariant = false, const tensor::TensorView* up = nullptr) {
    const int64_t K = w.ne[0], M = w.ne[1], n_expert = w.ne[2];
    const auto slots = static_cast<int64_t>(ids.size()), n = slots / k;
    MatMulIdRun r;
    r.grp.resize(static_cast<size_t>(graph::moe_group_size(n_expert, slots)));
    graph::Node gn;
    gn.op = graph::Op::MoeGroup;
    gn.meta.n_expert = static_cast<int32_t>(n_expert);
    gn.ne = {static_cast<int64_t>(r.grp.size()), 1, 1, 1};
    cpu::NodeData gd;
    gd.src = {ids.data()};
    gd.src_ne = {{k, n, 1, 1}};
    gd.out = r.grp.data();
    cpu::run_node(gn, gd, pool);
    const std::array<int64_t, 4> grp_ne{static_cast<int64_t>(r.grp.size()), 1, 1, 1};
    r.rows.resize(static_cast<size_t>(K * slots));
    graph::Node ga;
    ga.op = graph::Op::MoeGather;
    ga.ne = {K, slots, 1, 1};
    cpu::NodeData gad;
    gad.src = {xs.data(), r.grp.data()};
    gad.src_ne = {{K, n, 1, 1}, grp_ne};
    gad.out = r.rows.data();
    cpu::run_node(ga, gad, pool);
    r.y.assign(static_cast<size_t>(M * slots), std::numeric_limits<float>::quiet_NaN());
    graph::Node mm;
    mm.op = up ? graph::Op::MatMulIdSwiGLU : graph::Op::MatMulId;
    mm.ne = {M, slots, 1, 1};
    mm.weights = {&w};
    if (up) mm.weights.push_back(up);
    cpu::NodeData md;
    md.src = {r.rows.data(), r.grp.data()};
    md.src_ne = {{K, slots, 1, 1}, grp_ne};
    md.out = r.y.data();
    md.batch_invariant = batch_invariant;
    cpu::run_node(mm, md, pool);
    return r;
}

std::vector<float> random_rows(int64_t K, int64_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> g(0.0f, 1.0f);
    std::vector<float> xs(static_cast<size_t>(K * n));
    for (auto& v : xs) v = g(rng);
    return xs;
}

// 12 tokens, k = 2, 6 experts: experts 0 and 2 get 9 and 10 rows (the
// GEMM where the type has one), 3 and 5 get 2 and 3 (the dot products), 1
// and 4 none. The first 5 tokens: 3, 4 (GEMM), 1 and 2 rows.
const std::vector<int32_t> kIds12 = {0, 2, 3, 5, 2, 0, 5, 2, 0, 2, 2, 0,
                                     0, 2, 3, 2, 0, 5, 2, 0, 0, 2, 2, 0};

TEST(Moe, MatMulIdReadsOnlyChosenExpertsAndMatchesReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        ThreadPool pool(2);
        for (tensor::DType t : {tensor::DType::F32, tensor::DType::Q8_0, tensor::DType::Q4_K})
            for (bool regroup : {false, true})
                for (size_t n_ids : {size_t{10}, kIds12.size()}) {
                    if (regroup && t == tensor::DType::F32) continue;  // no f32 regrouping
                    SCOPED_TRACE(std::string(tensor::dtype_name(t)) +
                                 (regroup ? " regrouped " : " ") + std::to_string(n_ids / 2) +
                                 " tokens");
                    const int64_t K = 256, M = 32, n_expert = 6, k = 2;
                    const std::vector<int32_t> ids(kIds12.begin(), kIds12.begin() + n_ids);
                    const auto slots = static_cast<int64_t>(ids.size()), n = slots / k;
                    const ExpertTensor ex = make_experts(t, K, M, n_expert, regroup, {1, 4}, 3);
                    const std::vector<float> xs = random_rows(K, n, 4);
                    const MatMulIdRun r = run_matmul_id(ex.w, xs, ids, k, pool);
                    const graph::MoeGroupView gv(r.grp.data(), n_expert, slots);
                    // reference: dequantized expert rows times the token's x, in double
                    std::vector<float> row(static_cast<size_t>(K));
                    double worst = 0;
                    for (int64_t s = 0; s < slots; ++s) {
                        const int64_t t_ = s / k, e = ids[static_cast<size_t>(s)];
                        for (int64_t m = 0; m < M; ++m) {
                            tensor::dequantize_row(
                                t, ex.file.data() + e * ex.slice_bytes + m * tensor::row_size(t, K),
                                row.data(), K);
                            double ref = 0, scale = 0;
                            for (int64_t i = 0; i < K; ++i) {
                                const double p = static_cast<double>(row[i]) *
                                                 xs[static_cast<size_t>(t_ * K + i)];
                                ref += p;
                                scale += std::abs(p);
                            }
                            const float got = r.y[static_cast<size_t>(gv.position[s] * M + m)];
                            ASSERT_TRUE(std::isfinite(got)) << "slot " << s << " row " << m;
                            worst = std::max(worst, std::abs(got - ref) / scale);
                        }
                    }
                    // f32: float rounding of 256 products; quantized: the 8-bit
                    // activations (1/254 of a block's largest value per element)
                    EXPECT_LT(worst, t == tensor::DType::F32 ? 1e-5 : 1.5e-2);
                }
    });
}

// Every ISA level, Q8_0, Q4_K and F32 (which has no regrouped layout), the
// file layout and the regrouped one, batch-invariant or not.
template <typename Fn>
void for_each_expert_case(Fn&& fn) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        ThreadPool pool(2);
        for (tensor::DType t : {tensor::DType::Q8_0, tensor::DType::Q4_K, tensor::DType::F32})
            for (bool regroup : {false, true})
                for (bool invariant : {false, true}) {
                    if (regroup && t == tensor::DType::F32) continue;
                    SCOPED_TRACE(std::string(tensor::dtype_name(t)) +
                                 (regroup ? " regrouped" : "") +
                                 (invariant ? " batch-invariant" : ""));
                    fn(pool, t, regroup, invariant);
                }
    });
}

// Each expert's rows of MatMulId are bitwise the dense matmul of its slice
// over those rows alone (the kernels, the path for that token count and the
// threads' split are the dense matmul's), at every level, both layouts,
// batch-invariant or not.
TEST(Moe, MatMulIdRowsAreTheDenseMatmulOfTheirExpert) {
    for_each_expert_case([&](ThreadPool& pool, tensor::DType t, bool regroup, bool invariant) {
        const int64_t K = 512, M = 144, n_expert = 6, k = 2;
        const auto slots = static_cast<int64_t>(kIds12.size());
        const ExpertTensor ex = make_experts(t, K, M, n_expert, regroup, {}, 5);
        const std::vector<float> xs = random_rows(K, slots / k, 6);
        const MatMulIdRun r = run_matmul_id(ex.w, xs, kIds12, k, pool, invariant);
        const graph::MoeGroupView gv(r.grp.data(), n_expert, slots);
        for (int64_t e = 0; e < n_expert; ++e) {
            const int64_t g0 = gv.offset[e], n_e = gv.offset[e + 1] - g0;
            if (n_e == 0) continue;
            const tensor::TensorView slice = cpu::expert_slice(ex.w, e);
            const cpu::MatMulPart part{&slice, 0};
            std::vector<float> dense(static_cast<size_t>(M * n_e));
            cpu::matmul(&part, 1, r.rows.data() + g0 * K, K, n_e, dense.data(), M, pool, invariant);
            EXPECT_EQ(0,
                      std::memcmp(dense.data(), r.y.data() + g0 * M, dense.size() * sizeof(float)))
                << "expert " << e << " (" << n_e << " rows)";
        }
    });
}

// The fused MatMulIdSwiGLU is bitwise swiglu_row over the whole rows of the
// two MatMulIds it replaces, at every level, both layouts, batch-invariant or
// not, with experts on both paths (the GEMM for 7+ rows, the dot products
// for fewer) and rows cut into several items (64 or 80 rows each: the
// pass has few dot-product rows to share between the two threads).
TEST(Moe, MatMulIdSwigluIsSwigluOfTheTwoMatMulIds) {
    for_each_expert_case([&](ThreadPool& pool, tensor::DType t, bool regroup, bool invariant) {
        const int64_t K = 2048, M = 144, n_expert = 6, k = 2;
        const auto slots = static_cast<int64_t>(kIds12.size());
        const ExpertTensor gate = make_experts(t, K, M, n_expert, regroup, {1, 4}, 9);
        const ExpertTensor up = make_experts(t, K, M, n_expert, regroup, {1, 4}, 10);
        const std::vector<float> xs = random_rows(K, slots / k, 11);
        const MatMulIdRun g = run_matmul_id(gate.w, xs, kIds12, k, pool, invariant);
        const MatMulIdRun u = run_matmul_id(up.w, xs, kIds12, k, pool, invariant);
        const MatMulIdRun f = run_matmul_id(gate.w, xs, kIds12, k, pool, invariant, &up.w);
        std::vector<float> want(g.y.size());
        for (int64_t s = 0; s < slots; ++s)
            cpu::swiglu_row(g.y.data() + s * M, u.y.data() + s * M, want.data() + s * M, M);
        for (float v : want) ASSERT_TRUE(std::isfinite(v));
        EXPECT_EQ(0, std::memcmp(want.data(), f.y.data(), want.size() * sizeof(float)));
    });
}

// A token's expert rows do not depend on the tokens sharing its experts
// where the dense matmul's rows do not depend on the batch: regrouped
// weights with a group kernel (matmul_batch_invariant), or the
// batch-invariant option. Token 0 alone (its experts 1 row each, the dot
// products) against among 12 (expert 0 has 7 rows: the GEMM). A check that
// sees something: without the option, plain Q8_0 rows differ between the
// two paths (asserted below), so equal rows are not a vacuous comparison.
TEST(Moe, MatMulIdTokenAloneIsBitwiseItsRowsInABatch) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        ThreadPool pool(2);
        for (tensor::DType t : {tensor::DType::Q8_0, tensor::DType::Q4_K})
            for (bool regroup : {false, true})
                for (bool invariant : {false, true}) {
                    const int64_t K = 512, M = 144, n_expert = 6, k = 2;
                    const ExpertTensor ex = make_experts(t, K, M, n_expert, regroup, {}, 7);
                    const bool expect_equal = invariant || cpu::matmul_batch_invariant(ex.w);
                    SCOPED_TRACE(std::string(tensor::dtype_name(t)) +
                                 (regroup ? " regrouped" : "") +
                                 (invariant ? " batch-invariant" : ""));
                    const auto slots = static_cast<int64_t>(kIds12.size());
                    const std::vector<float> xs = random_rows(K, slots / k, 8);
                    const MatMulIdRun all = run_matmul_id(ex.w, xs, kIds12, k, pool, invariant);
                    const std::vector<int32_t> ids0(kIds12.begin(), kIds12.begin() + k);
                    const std::vector<float> x0(xs.begin(), xs.begin() + K);
                    const MatMulIdRun one = run_matmul_id(ex.w, x0, ids0, k, pool, invariant);
                    const graph::MoeGroupView gall(all.grp.data(), n_expert, slots);
                    const graph::MoeGroupView gone(one.grp.data(), n_expert, k);
                    bool equal = true;
                    for (int64_t j = 0; j < k; ++j)
                        equal = equal && 0 == std::memcmp(one.y.data() + gone.position[j] * M,
                                                          all.y.data() + gall.position[j] * M,
                                                          static_cast<size_t>(M) * sizeof(float));
                    if (expect_equal) {
                        EXPECT_TRUE(equal);
                    } else if (t == tensor::DType::Q8_0 && level != cpu::IsaLevel::Scalar) {
                        EXPECT_FALSE(equal) << "the dot products and the GEMM agree bitwise: "
                                               "this test no longer sees a difference";
                    }
                }
    });
}

// The whole model against the double-precision reference, every ISA level:
// f32 weights carry the architecture check (a wrong top-k, a missing
// renormalization or shared expert moves logits by far more than 1e-4),
// quantized weights the wiring of the expert slices to each type's kernels
// (bounds as tests/test_forward.cpp argues them).
TEST(Moe, ForwardMatchesDoublePrecisionReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        struct Case {
            const char* arch;
            tensor::DType type;
            bool k_quant;
            double tol;
        };
        for (const Case& c : {Case{"qwen3moe", tensor::DType::F32, false, 1e-4},
                              Case{"qwen2moe", tensor::DType::F32, false, 1e-4},
                              Case{"qwen3moe", tensor::DType::Q8_0, false, 2e-2},
                              Case{"qwen2moe", tensor::DType::Q8_0, false, 2e-2},
                              Case{"qwen3moe", tensor::DType::Q4_K, true, 3e-2},
                              Case{"qwen2moe", tensor::DType::Q6_K, true, 3e-2}}) {
            SCOPED_TRACE(std::string(c.arch) + " " + std::string(tensor::dtype_name(c.type)));
            const TinyModelSpec s =
                c.k_quant ? k_quant_moe_spec(c.arch, c.type) : moe_spec(c.arch, c.type);
            auto l = minfer::testing::load_tiny_model(s);
            const std::vector<double> ref = minfer::testing::reference_logits(l->model, kPrompt);
            EXPECT_LT(max_rel_diff(run(l->model, kPrompt), ref, l->model.hp.n_vocab), c.tol);
            if (c.type == tensor::DType::F32) continue;
            // regrouped 16 rows at a time, expert slices included: the prompt
            // (GEMM) and token by token (the 16-row decode kernels)
            ASSERT_GT(l->model.interleave_weights(), 0u);
            EXPECT_LT(max_rel_diff(run(l->model, kPrompt), ref, l->model.hp.n_vocab), c.tol);
            EXPECT_LT(max_rel_diff(minfer::testing::logits_token_by_token(l->model, kPrompt), ref,
                                   l->model.hp.n_vocab),
                      c.tol);
        }
    });
}

TEST(Moe, PromptInSeveralPassesMatchesOnePassAndFusionIsBitwise) {
    for (const char* arch : {"qwen2moe", "qwen3moe"}) {
        auto l = minfer::testing::load_tiny_model(moe_spec(arch, tensor::DType::Q8_0));
        runtime::SessionOptions whole, single, plain;
        single.n_batch = 1;
        plain.fuse = {.qkv = false, .ffn = false};
        const auto a = run(l->model, kPrompt, whole);
        EXPECT_EQ(a, run(l->model, kPrompt, plain)) << arch;
        const auto b = run(l->model, kPrompt, single);
        ASSERT_EQ(a.size(), b.size());
        for (size_t i = 0; i < a.size(); ++i)
            ASSERT_NEAR(a[i], b[i], 2e-3f * (1 + std::abs(a[i]))) << arch << " " << i;
    }
}

// A MoE sequence's logits in the engine, batched with 7 others (so its
// tokens share expert groups with theirs) and at several -b, are bitwise its
// logits alone: the grouping changes no row's sums. F32 weights (one path
// for every token count); Q8_0 regrouped as the commands load it (its
// decode kernel does the GEMM's float steps), with an F32 output matrix:
// the tiny vocabulary's 264 rows are no whole groups of 16, so a Q8_0
// output stays in the file's layout, whose one-token and GEMM paths sum in
// different orders (which is why a tiny Q8_0 model was not bitwise); and
// Q8_0 in the file's layout everywhere (--no-interleave) under the
// batch-invariant option, which the expert matmuls must honour too.
TEST(Moe, EngineLogitsAloneAndBatchedAreBitwise) {
    struct Case {
        tensor::DType weights;
        tensor::DType output;
        bool regroup;
        bool batch_invariant;
    };
    const Case cases[] = {{tensor::DType::F32, tensor::DType::F32, false, false},
                          {tensor::DType::Q8_0, tensor::DType::F32, true, false},
                          {tensor::DType::Q8_0, tensor::DType::Q8_0, false, true}};
    for (const char* arch : {"qwen3moe", "qwen2moe"})
        for (const Case& c : cases) {
            SCOPED_TRACE(std::string(arch) + " " + std::string(tensor::dtype_name(c.weights)) +
                         " output " + std::string(tensor::dtype_name(c.output)) +
                         (c.batch_invariant ? " batch-invariant" : ""));
            TinyModelSpec sp = moe_spec(arch, c.weights);
            sp.output_type = c.output;
            sp.n_ctx_train = 4096;
            // rows of several Q8_0 blocks: at K = 64 the one-token and the
            // GEMM paths happen to sum in the same order
            sp.n_embd = 128;
            sp.head_dim = 32;
            sp.n_ff_exp = 128;
            auto l = minfer::testing::load_tiny_model(sp);
            if (c.regroup) {
                ASSERT_GT(runtime::regroup_weights_for_cpu(l->model), 0u);
                bool invariant = cpu::matmul_batch_invariant(*l->model.output);
                for (const auto& L : l->model.layers)
                    for (const tensor::TensorView* w :
                         {L.wq, L.wk, L.wv, L.wo, L.ffn_gate_exps, L.ffn_up_exps, L.ffn_down_exps})
                        invariant = invariant && cpu::matmul_batch_invariant(*w);
                // where the test can expect bitwise rows without the option
                if (!c.batch_invariant && !invariant) {
                    std::printf("  (skipped at %s: Q8_0 has no group kernel)\n",
                                cpu::isa_name(cpu::isa_level()));
                    continue;
                }
            }
            const model::Model& m = l->model;
            const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
            std::mt19937 rng(11);
            std::uniform_int_distribution<int32_t> tok(0, n_vocab - 1);
            std::vector<std::vector<int32_t>> prompts;
            for (int i = 0; i < 8; ++i) {
                std::vector<int32_t> p(static_cast<size_t>(3 + 9 * i % 40));
                for (auto& x : p) x = tok(rng);
                prompts.push_back(p);
            }
            for (int64_t n_batch : {7, 512}) {
                runtime::EngineOptions o;
                o.n_ctx = 1024;
                o.n_batch = n_batch;
                o.n_parallel = 8;
                o.n_threads = 2;
                o.kv_type_k = o.kv_type_v = tensor::DType::F32;
                o.eog_ids = {-1};
                o.batch_invariant = c.batch_invariant;
                runtime::Engine e(m, o);
                std::map<std::tuple<runtime::RequestId, int64_t>, std::vector<float>> rows;
                e.impl().logits_hook = [&](runtime::RequestId id, int32_t, int64_t pos,
                                           std::span<const float> lg) {
                    rows[{id, pos}] = std::vector<float>(lg.begin(), lg.end());
                };
                std::map<runtime::RequestId, size_t> which;
                for (size_t i = 0; i < prompts.size(); ++i) {
                    runtime::GenParams gp;
                    gp.prompt = prompts[i];
                    gp.n_predict = 4;
                    gp.sampling.temp = 0.0f;
                    which[e.submit(gp, {})] = i;
                }
                for (int guard = 0; !e.idle() && guard < 1000; ++guard) e.step();
                ASSERT_TRUE(e.idle());
                for (const auto& [id, i] : which) {
                    std::vector<int32_t> toks = prompts[i];
                    std::vector<std::vector<float>> got;
                    for (auto pos = static_cast<int64_t>(toks.size()) - 1;; ++pos) {
                        auto it = rows.find({id, pos});
                        if (it == rows.end()) break;
                        got.push_back(it->second);
                        toks.push_back(runtime::argmax(it->second));
                    }
                    ASSERT_EQ(got.size(), 4u);
                    toks.pop_back();
                    runtime::SessionOptions so;
                    so.n_ctx = static_cast<int64_t>(toks.size()) + 1;
                    so.n_threads = 2;
                    so.batch_invariant = c.batch_invariant;
                    runtime::Session s(m, so);
                    const std::vector<float> ref = s.eval(toks, true);
                    for (size_t r = 0; r < got.size(); ++r) {
                        const size_t pos = prompts[i].size() - 1 + r;
                        ASSERT_EQ(0, std::memcmp(got[r].data(), ref.data() + pos * n_vocab,
                                                 static_cast<size_t>(n_vocab) * 4))
                            << "sequence " << i << " row " << r << " -b " << n_batch;
                    }
                }
            }
        }
}

// minfer info names the experts and counts the active parameters: every
// tensor but the *_exps ones, which a token reads k / n_expert of.
TEST(Moe, InfoShowsExpertsAndActiveParameters) {
    const TinyModelSpec s = moe_spec("qwen3moe");
    const std::string path = ::testing::TempDir() + "moe-info.gguf";
    minfer::testing::make_tiny_model(s).write(path);
    const auto r = minfer::testing::run_cli("info " + path + " --json --no-tensors");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    const int64_t exps = 3 * s.n_embd * s.n_ff_exp * s.n_expert * s.n_layer;
    const auto total = j["sizes"]["n_params"].get<int64_t>();
    EXPECT_EQ(j["sizes"]["n_expert"].get<int64_t>(), 8);
    EXPECT_EQ(j["sizes"]["n_expert_used"].get<int64_t>(), 2);
    EXPECT_EQ(j["sizes"]["n_params_active"].get<int64_t>(), total - exps + exps * 2 / 8);
    std::remove(path.c_str());
}

// The memory report and the viz page's records (report/observe.h) show the
// MoE nodes as they show the dense ones: per layer the router's softmax,
// the top-k, the weights, the grouping, the gather, the expert matmuls
// (fused gate+up and down), the weighted sum and (qwen2moe) the shared
// expert's gate, each with a planned buffer inside the arena counted in the
// curve, and value statistics read in the node's type: the top-k and group
// outputs are expert ids and slot indices (I32), within their ranges.
TEST(Moe, ReportAndTraceShowTheMoeNodesWithTheirBuffers) {
    auto l = minfer::testing::load_tiny_model(moe_spec("qwen2moe"));
    const int64_t n_layer = l->model.hp.n_layer, n_expert = l->model.hp.n_expert;
    runtime::SessionOptions o;
    o.n_ctx = 32;
    o.n_threads = 1;
    runtime::Session s(l->model, o);
    report::GraphRecorder rec(s, /*trace_values=*/true);
    const std::vector<int32_t> prompt(kPrompt.begin(), kPrompt.begin() + 5);
    s.eval(prompt);
    const int32_t next = 9;
    s.eval(std::span<const int32_t>(&next, 1));
    ASSERT_EQ(rec.records().size(), 2u);
    for (const nlohmann::json& r : rec.records()) {
        SCOPED_TRACE(r["kind"].get<std::string>());
        const int64_t n = r["n_tokens"];
        std::map<std::string, int64_t> count;
        for (const auto& nd : r["nodes"]) {
            const std::string op = nd["op"];
            if (op != "Softmax" && op != "TopK" && op != "MoeWeights" && op != "MoeGroup" &&
                op != "MoeGather" && op != "MatMulId" && op != "MatMulIdSwiGLU" && op != "MoeSum" &&
                op != "SigmoidScale")
                continue;
            SCOPED_TRACE(nd["name"].get<std::string>());
            if (nd["dead"].get<bool>()) {
                // only the gate and up MatMulIds the fused node replaced
                ASSERT_EQ(op, "MatMulId");
                ++count["dead MatMulId"];
                continue;
            }
            ++count[op];
            ASSERT_TRUE(nd["buffer"].is_object());
            const size_t id = nd["id"];
            EXPECT_GE(r["curve"][id].get<size_t>(), nd["buffer"]["len"].get<size_t>());
            ASSERT_TRUE(nd.contains("stats"));
            EXPECT_EQ(nd["stats"]["nan"], 0);
            EXPECT_EQ(nd["stats"]["inf"], 0);
            if (op == "TopK") {
                EXPECT_EQ(nd["type"], "i32");
                EXPECT_GE(nd["stats"]["min"].get<double>(), 0.0);
                EXPECT_LE(nd["stats"]["max"].get<double>(), double(n_expert - 1));
                // k ids per token (the last layer's rows only the output's)
                EXPECT_EQ(nd["shape"][0].get<int64_t>(), l->model.hp.n_expert_used);
                EXPECT_LE(nd["shape"][1].get<int64_t>(), n);
                EXPECT_EQ(nd["stats"]["count"].get<int64_t>(),
                          nd["shape"][0].get<int64_t>() * nd["shape"][1].get<int64_t>());
            }
        }
        for (const char* op :
             {"Softmax", "TopK", "MoeWeights", "MoeGroup", "MoeGather", "MoeSum", "SigmoidScale"})
            EXPECT_EQ(count[op], n_layer) << op;
        EXPECT_EQ(count["MatMulIdSwiGLU"], n_layer);
        EXPECT_EQ(count["MatMulId"], n_layer);  // down
        EXPECT_EQ(count["dead MatMulId"], 2 * n_layer);
    }
}
