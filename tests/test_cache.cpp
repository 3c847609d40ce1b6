#include <gtest/gtest.h>

#include <set>

#include "fake_backend.h"
#include "graph/cache.h"
#include "graph_helpers.h"
#include "model_like_graph.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::graph;
using minfer::testing::check_allocation;
using minfer::testing::FakeBackend;
using minfer::testing::model_like_graph;

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
    GraphCache cache({&cpu});
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
    FakeBackend cpu;
    GraphCache cache({&cpu});
    const GraphParams dec = params(kDecode, 1);
    Graph& g = cache.replace(dec, model_like_graph(1));
    check_allocation(g, cache.allocator());
    const size_t created = cpu.stats().allocations;
    const size_t recycled = cpu.stats().recycled;
    for (int step = 0; step < 10; ++step) {
        Graph* again = cache.try_reuse(dec);
        ASSERT_EQ(again, &g);
        const std::vector<int32_t> tok{5}, pos{step};
        cache.allocator().fill_input(*again, "token_ids", tok);
        cache.allocator().fill_input(*again, "positions", pos);
    }
    EXPECT_EQ(cpu.stats().allocations, created);
    EXPECT_EQ(cpu.stats().recycled, recycled);
    EXPECT_EQ(cache.rebuilds(), 1u);
    EXPECT_EQ(cache.reuses(), 10u);
}

TEST(Cache, alternating_prefill_and_decode_allocates_nothing_once_both_exist) {
    FakeBackend cpu;
    GraphCache cache({&cpu});
    const GraphParams pre = params(kPrefill, 9), dec = params(kDecode, 1);
    Graph& gp = cache.replace(pre, model_like_graph(9));
    const KvPair kv0 = *cache.allocator().kv_pair(0);
    Graph& gd = cache.replace(dec, model_like_graph(1));
    // Both plans alive at once: no buffer of one is a buffer of the other
    // (each keeps its own), and both use the same KV regions.
    cache.allocator().use_plan(kPrefill);
    const auto bp = plan_buffers(gp, cache.allocator());
    check_allocation(gp, cache.allocator());
    cache.allocator().use_plan(kDecode);
    const auto bd = plan_buffers(gd, cache.allocator());
    check_allocation(gd, cache.allocator());
    for (const auto& b : bd) EXPECT_EQ(bp.count(b), 0u) << "buffer " << b.second << " in both";
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
    GraphCache cache({&cpu});
    GraphParams p = params(kDecode, 1);
    cache.replace(p, model_like_graph(1));
    const auto persistent = cache.allocator().persistent();
    const float marker = 3.25f;
    cpu.write_host(persistent[1].ref, &marker, sizeof marker);
    // A toggle flips: same kind, new graph, same allocator and KV regions.
    p.cparams.fuse_qkv = false;
    ASSERT_EQ(cache.try_reuse(p), nullptr);
    Graph& g2 = cache.replace(p, model_like_graph(1));
    ASSERT_EQ(cache.allocator().persistent().size(), persistent.size());
    for (size_t i = 0; i < persistent.size(); ++i) {
        EXPECT_EQ(cache.allocator().persistent()[i].name, persistent[i].name);
        EXPECT_TRUE(cache.allocator().persistent()[i].ref.same_buffer(persistent[i].ref));
    }
    float back = 0;
    cpu.read_host(persistent[1].ref, &back, sizeof back);
    EXPECT_EQ(back, marker);
    // The old decode plan's buffers went back to the pool and were recycled
    // by the new one: the pool did not grow.
    EXPECT_GT(cpu.stats().recycled, 0u);
    check_allocation(g2, cache.allocator());
}

TEST(Cache, failed_replace_leaves_the_kind_empty) {
    FakeBackend cpu;
    GraphCache cache({&cpu});
    const GraphParams p = params(kPrefill, 4);
    Graph bad;
    bad.add(Node{});
    bad.nodes[0].src = {0};  // a self-cycle
    EXPECT_THROW(cache.replace(p, std::move(bad)), Error);
    EXPECT_EQ(cache.try_reuse(p), nullptr);
    EXPECT_EQ(cache.current(), nullptr);
}
