#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "backend/cpu/cpu_backend.h"
#include "fake_backend.h"
#include "graph/cache.h"
#include "graph/scheduler.h"
#include "graph_helpers.h"
#include "model_like_graph.h"
#include "tensor/quants.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::graph;
using minfer::testing::check_allocation;
using minfer::testing::FakeBackend;
using minfer::testing::model_like_graph;
using minfer::testing::test_planner;

namespace {

GraphParams params(int kind, int64_t n_tokens) {
    GraphParams p;
    p.kind = kind;
    p.n_tokens = n_tokens;
    p.n_out = 1;
    p.cparams.n_ctx = 32;
    return p;
}

// Buffers a plan's nodes use, KV regions excluded.
std::set<std::pair<int32_t, uint32_t>> plan_buffers(const Graph& g, const GraphAllocator& a) {
    std::set<std::pair<int32_t, uint32_t>> out;
    for (size_t i = 0; i < g.size(); ++i) {
        const auto b = a.node_buffer(static_cast<NodeId>(i));
        if (b && g.nodes[i].op != Op::KvStore) out.insert({b->backend, b->id});
    }
    return out;
}

}  // namespace

TEST(Cache, reuse_requires_equal_params_but_not_n_past) {
    FakeBackend cpu;
    GraphCache cache({&cpu}, test_planner());
    const GraphParams p = params(kDecode, 1);
    EXPECT_EQ(cache.try_reuse(p), nullptr);
    Graph& g = cache.replace(p, model_like_graph(1));
    EXPECT_EQ(cache.try_reuse(p), &g);  // the next step: n_past moved, params did not
    GraphParams other = p;
    other.cparams.fuse_ffn = false;
    EXPECT_EQ(cache.try_reuse(other), nullptr);
    other = p;
    other.weights_version = 2;
    EXPECT_EQ(cache.try_reuse(other), nullptr);
    other = p;
    other.n_out = 2;
    EXPECT_EQ(cache.try_reuse(other), nullptr);
    EXPECT_EQ(cache.rebuilds(), 1u);
    EXPECT_EQ(cache.reuses(), 1u);
    EXPECT_EQ(cache.current(), &g);
}

TEST(Cache, no_allocation_after_first_decode) {
    // Every pool allocate call counts: a new buffer (allocations) and one
    // served from the free list (recycled). The graph really runs.
    FakeBackend cpu;
    GraphCache cache({&cpu}, test_planner());
    Scheduler sched;
    const GraphParams dec = params(kDecode, 1);
    Graph& g = cache.replace(dec, model_like_graph(1));
    check_allocation(g, cache.allocator());
    auto step = [&](Graph& graph, int32_t pos) {
        const std::vector<int32_t> tok{5}, p{pos};
        cache.allocator().fill_input(graph, "token_ids", tok);
        cache.allocator().fill_input(graph, "positions", p);
        sched.execute(graph, cache.allocator());
    };
    step(g, 0);  // the first decode
    const auto after_first = cpu.stats();
    const size_t ran = cpu.executed.size();
    for (int32_t t = 1; t <= 10; ++t) {
        Graph* again = cache.try_reuse(dec);
        ASSERT_EQ(again, &g);
        step(*again, t);
    }
    EXPECT_EQ(cpu.executed.size(), 11 * ran);  // every step ran the whole graph
    EXPECT_EQ(cpu.stats().allocations, after_first.allocations);
    EXPECT_EQ(cpu.stats().recycled, after_first.recycled);
    EXPECT_EQ(cache.rebuilds(), 1u);
    EXPECT_EQ(cache.reuses(), 10u);
}

TEST(Cache, no_allocation_nor_scratch_growth_after_first_decode_with_real_kernels) {
    // The same on the CPU backend with kernels that take thread-pool
    // scratch (a Q8_0 matmul quantizes its activations there): after the
    // first decode neither the pool nor the scratch grows.
    const int64_t n_embd = 64, n_out = 32, n_vocab = 10;
    std::vector<float> table(static_cast<size_t>(n_embd * n_vocab));
    for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.37f * static_cast<float>(i));
    std::vector<float> wf(static_cast<size_t>(n_embd * n_out));
    for (size_t i = 0; i < wf.size(); ++i) wf[i] = std::cos(0.11f * static_cast<float>(i));
    const size_t row = tensor::row_size(tensor::DType::Q8_0, n_embd);
    std::vector<uint8_t> wq(row * static_cast<size_t>(n_out));
    for (int64_t r = 0; r < n_out; ++r)
        tensor::quantize_row(tensor::DType::Q8_0, wf.data() + r * n_embd, wq.data() + r * row,
                             n_embd);
    const tensor::TensorView tv{
        "table", tensor::DType::F32, {n_embd, n_vocab, 1, 1}, table.data(), table.size() * 4};
    const tensor::TensorView wv{
        "w", tensor::DType::Q8_0, {n_embd, n_out, 1, 1}, wq.data(), wq.size()};
    auto build = [&](int64_t n) {
        Graph g;
        const NodeId tok = g.add_input("token_ids", n);
        const NodeId e = minfer::testing::add_op(g, Op::GetRows, "embd", {tok}, n_embd, n);
        g.node(e).weights = {&tv};
        const NodeId m = minfer::testing::add_op(g, Op::MatMul, "proj", {e}, n_out, n);
        g.node(m).weights = {&wv};
        const NodeId s = minfer::testing::add_op(g, Op::Silu, "act", {m}, n_out, n);
        g.outputs.push_back(s);
        return g;
    };
    backend::CpuBackend cpu(2);
    GraphCache cache({&cpu}, test_planner());
    Scheduler sched;
    const GraphParams dec = params(kDecode, 1);
    Graph& g = cache.replace(dec, build(1));
    check_allocation(g, cache.allocator());
    backend::PoolStats first;
    size_t first_scratch = 0;
    for (int32_t t = 0; t <= 10; ++t) {
        Graph* again = t == 0 ? &g : cache.try_reuse(dec);
        ASSERT_EQ(again, &g);
        cache.allocator().fill_input(*again, "token_ids", std::vector<int32_t>{t % 10});
        sched.execute(*again, cache.allocator());
        if (t == 0) {
            first = cpu.stats();
            first_scratch = cpu.threads().scratch_bytes();
            EXPECT_GT(first_scratch, 0u);  // the matmul did use scratch
            continue;
        }
        EXPECT_EQ(cpu.stats().allocations, first.allocations) << "step " << t;
        EXPECT_EQ(cpu.stats().recycled, first.recycled) << "step " << t;
        EXPECT_EQ(cpu.threads().scratch_bytes(), first_scratch) << "step " << t;
    }
    EXPECT_EQ(cache.rebuilds(), 1u);
    EXPECT_EQ(cache.reuses(), 10u);
}

TEST(Cache, alternating_prefill_and_decode_allocates_nothing_once_both_exist) {
    FakeBackend cpu;
    GraphCache cache({&cpu}, test_planner());
    const GraphParams pre = params(kPrefill, 9), dec = params(kDecode, 1);
    Graph& gp = cache.replace(pre, model_like_graph(9));
    const KvPair kv0 = *cache.allocator().kv_pair(0);
    Graph& gd = cache.replace(dec, model_like_graph(1));
    // Both plans alive at once, both on the same KV regions. Under the size
    // classes no buffer of one is a buffer of the other (each keeps its own);
    // the arena planner places both in the one shared activation arena (a
    // pass's inputs are filled, it runs and its outputs are read before the
    // next pass starts, so the plans may overlap in bytes).
    cache.allocator().use_plan(kPrefill);
    const auto bp = plan_buffers(gp, cache.allocator());
    check_allocation(gp, cache.allocator());
    cache.allocator().use_plan(kDecode);
    const auto bd = plan_buffers(gd, cache.allocator());
    check_allocation(gd, cache.allocator());
    if (cache.allocator().planner() == Planner::Arena) {
        EXPECT_EQ(bp, bd) << "the arena planner keeps one arena for both slots";
        EXPECT_EQ(bp.size(), 1u);
    } else {
        for (const auto& b : bd) EXPECT_EQ(bp.count(b), 0u) << "buffer " << b.second << " in both";
    }
    EXPECT_EQ(cache.allocator().kv_pair(0)->k.id, kv0.k.id);
    EXPECT_EQ(cache.allocator().persistent().size(), 4u);  // 2 layers x (K, V)

    const auto before = cpu.stats();
    for (int turn = 0; turn < 5; ++turn) {
        ASSERT_EQ(cache.try_reuse(pre), &gp);
        ASSERT_EQ(cache.try_reuse(dec), &gd);
        ASSERT_EQ(cache.try_reuse(dec), &gd);
    }
    EXPECT_EQ(cpu.stats().allocations, before.allocations);
    EXPECT_EQ(cpu.stats().recycled, before.recycled);
    EXPECT_EQ(cache.rebuilds(), 2u);
    EXPECT_EQ(cache.reuses(), 15u);
    EXPECT_EQ(cache.allocator().counters().graphs_allocated, 2u);
}

TEST(Cache, allocator_survives_rebuild) {
    FakeBackend cpu;
    GraphCache cache({&cpu}, test_planner());
    GraphParams p = params(kDecode, 1);
    cache.replace(p, model_like_graph(1));
    const auto persistent = cache.allocator().persistent();
    const float marker = 3.25f;
    cpu.write_host(persistent[1].ref, &marker, sizeof marker);
    // A toggle flips: same kind, new graph, same allocator and KV regions.
    p.cparams.fuse_qkv = false;
    ASSERT_EQ(cache.try_reuse(p), nullptr);
    const auto before = cpu.stats();
    Graph& g2 = cache.replace(p, model_like_graph(1));
    ASSERT_EQ(cache.allocator().persistent().size(), persistent.size());
    for (size_t i = 0; i < persistent.size(); ++i) {
        EXPECT_EQ(cache.allocator().persistent()[i].name, persistent[i].name);
        EXPECT_TRUE(cache.allocator().persistent()[i].ref.same_buffer(persistent[i].ref));
    }
    float back = 0;
    cpu.read_host(persistent[1].ref, &back, sizeof back);
    EXPECT_EQ(back, marker);
    // The pool did not grow: the size classes recycle the old decode plan's
    // buffers; the arena planner places the new plan in the arena it has.
    EXPECT_EQ(cpu.stats().allocations, before.allocations);
    if (cache.allocator().planner() == Planner::Classes) {
        EXPECT_GT(cpu.stats().recycled, before.recycled);
    } else {
        EXPECT_EQ(cpu.stats().recycled, before.recycled);
    }
    check_allocation(g2, cache.allocator());
}

TEST(Cache, failed_replace_leaves_the_kind_empty) {
    FakeBackend cpu;
    GraphCache cache({&cpu}, test_planner());
    const GraphParams p = params(kPrefill, 4);
    Graph bad;
    bad.add(Node{});
    bad.nodes[0].src = {0};  // a self-cycle
    EXPECT_THROW(cache.replace(p, std::move(bad)), Error);
    EXPECT_EQ(cache.try_reuse(p), nullptr);
    EXPECT_EQ(cache.current(), nullptr);
}
