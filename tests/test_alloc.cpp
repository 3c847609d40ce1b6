#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <set>

#include "fake_backend.h"
#include "graph/alloc.h"
#include "graph_helpers.h"
#include "model_like_graph.h"
#include "random_graph.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::graph;
using minfer::testing::add_op;
using minfer::testing::check_allocation;
using minfer::testing::FakeBackend;
using minfer::testing::overlaps;
using minfer::testing::test_planner;

namespace {

// Two fake backends: index 0 ("cpu") and 1 ("queue").
// The planner is MINFER_PLANNER's (arena by default; CTest runs these tests
// again under classes); tests of one planner's layout name it.
struct Fixture {
    FakeBackend b0{"cpu"}, b1{"queue"};
    GraphAllocator alloc;
    explicit Fixture(Planner p = test_planner()) : alloc({&b0, &b1}, p) { b1.self = 1; }
};

// The layer-0 attention block: KvStore and Attn, sized for n_kv_embd x n_ctx.
struct KvGraph {
    Graph g;
    NodeId store, attn;
};
KvGraph kv_graph(int64_t n_tokens, int64_t n_ctx) {
    KvGraph k;
    Graph& g = k.g;
    NodeId pos = g.add_input("positions", n_tokens);
    NodeId q = add_op(g, Op::Add, "q", {pos, pos}, 128, n_tokens);
    NodeId kk = add_op(g, Op::Add, "k", {pos, pos}, 64, n_tokens);
    NodeId v = add_op(g, Op::Add, "v", {pos, pos}, 64, n_tokens);
    Node st;
    st.op = Op::KvStore;
    st.name = "kv_store.0";
    st.ne = {64, n_ctx, 1, 1};
    st.src = {kk, v, pos};
    st.meta.layer = 0;
    k.store = g.add(st);
    Node at;
    at.op = Op::Attn;
    at.name = "attn.0";
    at.ne = {128, n_tokens, 1, 1};
    at.src = {q, k.store, pos};
    at.meta.layer = 0;
    at.meta.n_head = 2;
    at.meta.n_head_kv = 1;
    at.meta.head_dim = 64;
    at.meta.n_ctx = n_ctx;
    k.attn = g.add(at);
    g.outputs.push_back(k.attn);
    return k;
}

}  // namespace

TEST(Alloc, liveness_reuses_buffers_along_chain) {
    Fixture f(Planner::Classes);
    Graph g;
    NodeId x = g.add_input("x", 256);  // 1 KiB, like the f32 nodes below
    NodeId a1 = add_op(g, Op::Add, "a1", {x, x}, 256);
    NodeId a2 = add_op(g, Op::Add, "a2", {a1, x}, 256);
    NodeId a3 = add_op(g, Op::Add, "a3", {a2, x}, 256);
    NodeId a4 = add_op(g, Op::Add, "a4", {a3, x}, 256);
    g.outputs.push_back(a4);
    const PlanStats& st = f.alloc.alloc_graph(g);
    // x pinned, then one "current value" pair ping-pongs: a3 takes a1's
    // buffer (a1's last reader a2 ran before a3), a4 takes a2's.
    EXPECT_EQ(st.n_buffers, 3u);
    EXPECT_EQ(f.alloc.node_buffer(a3)->id, f.alloc.node_buffer(a1)->id);
    EXPECT_EQ(f.alloc.node_buffer(a4)->id, f.alloc.node_buffer(a2)->id);
    EXPECT_NE(f.alloc.node_buffer(a2)->id, f.alloc.node_buffer(a1)->id);
    EXPECT_EQ(st.naive_bytes, 5u * 1024);
    EXPECT_EQ(st.pool_bytes, 3u * 1024);
    check_allocation(g, f.alloc);
}

TEST(Alloc, parallel_chains_do_not_share) {
    Fixture f(Planner::Classes);
    Graph g;
    NodeId a0 = g.add_input("a0", 256);
    NodeId b0 = g.add_input("b0", 256);
    NodeId sa = add_op(g, Op::Silu, "silu_a", {a0}, 256);
    NodeId sb = add_op(g, Op::Silu, "silu_b", {b0}, 256);
    NodeId a2 = add_op(g, Op::Add, "a2", {sa, a0}, 256);
    NodeId b2 = add_op(g, Op::Add, "b2", {sb, b0}, 256);
    g.outputs = {a2, b2};
    // Both branches are live at once: a0 b0 sa sb a2 all need their own
    // buffer. Only b2 may recycle one — sa's, whose last reader a2 ran
    // before b2.
    EXPECT_EQ(f.alloc.alloc_graph(g).n_buffers, 5u);
    std::set<uint32_t> ids;
    for (NodeId id : {a0, b0, sa, sb, a2}) ids.insert(f.alloc.node_buffer(id)->id);
    EXPECT_EQ(ids.size(), 5u);
    EXPECT_EQ(f.alloc.node_buffer(b2)->id, f.alloc.node_buffer(sa)->id);
    check_allocation(g, f.alloc);
}

TEST(Alloc, kv_regions_two_per_layer) {
    Fixture f;
    KvGraph k = kv_graph(4, 32);
    f.alloc.alloc_graph(k.g);
    ASSERT_EQ(f.alloc.persistent().size(), 2u);
    EXPECT_EQ(f.alloc.persistent()[0].name, "kv.0.k");
    EXPECT_EQ(f.alloc.persistent()[1].name, "kv.0.v");
    auto kv = f.alloc.kv_pair(0);
    ASSERT_TRUE(kv.has_value());
    EXPECT_FALSE(f.alloc.kv_pair(1).has_value());
    // The store's buffer is the K region; the V region is its sibling.
    EXPECT_TRUE(f.alloc.node_buffer(k.store)->same_buffer(kv->k));
    EXPECT_FALSE(kv->v.same_buffer(kv->k));
    const size_t region = 64 * 32 * sizeof(float);  // n_kv_embd x n_ctx f32
    EXPECT_EQ(kv->k.len, region);
    EXPECT_EQ(f.b0.buffer_bytes(kv->k.id), region);
    EXPECT_EQ(f.b0.buffer_bytes(kv->v.id), region);
    EXPECT_EQ(f.alloc.counters().kv_bytes, 2 * region);
    EXPECT_FALSE(f.alloc.node_buffer(k.attn)->same_buffer(kv->k));
    check_allocation(k.g, f.alloc);
}

TEST(Alloc, kv_region_sized_by_kv_type_and_checked_against_later_graphs) {
    Fixture f;
    KvGraph k = kv_graph(1, 32);
    k.g.node(k.store).type = tensor::DType::F16;
    k.g.node(k.attn).meta.kv_type = tensor::DType::F16;
    f.alloc.alloc_graph(k.g);
    EXPECT_EQ(f.alloc.kv_pair(0)->k.len, 64u * 32 * 2);
    // A later graph that needs bigger regions (n_ctx changed) is an error,
    // never a silent overflow.
    KvGraph big = kv_graph(1, 64);
    EXPECT_THROW(f.alloc.alloc_graph(big.g, 1), Error);
}

TEST(Alloc, cycle_graph_allocation_fails) {
    Fixture f;
    Graph g;
    add_op(g, Op::Add, "a", {1}, 16);
    add_op(g, Op::Add, "b", {0}, 16);
    try {
        f.alloc.alloc_graph(g);
        FAIL() << "a cycle was accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("cycle"), std::string::npos) << e.what();
    }
}

TEST(Alloc, allocator_survives_rebuild) {
    Fixture f;
    KvGraph prefill = kv_graph(7, 32);
    f.alloc.alloc_graph(prefill.g);
    const KvPair before = *f.alloc.kv_pair(0);
    const float marker = 42.5f;
    f.b0.write_host(before.v, &marker, sizeof marker);  // "KV written by the prefill"

    KvGraph decode = kv_graph(1, 32);
    f.alloc.alloc_graph(decode.g);  // same slot: the prefill plan is torn down
    const KvPair after = *f.alloc.kv_pair(0);
    EXPECT_EQ(after.k.id, before.k.id);
    EXPECT_EQ(after.v.id, before.v.id);
    EXPECT_EQ(f.alloc.persistent().size(), 2u);
    EXPECT_EQ(f.alloc.counters().kv_regions, 2u);
    EXPECT_TRUE(f.alloc.node_buffer(decode.store)->same_buffer(after.k));
    float back = 0;
    f.b0.read_host(after.v, &back, sizeof back);
    EXPECT_EQ(back, marker);  // regions are never on a free list, never zeroed
    EXPECT_FALSE(f.b0.pool.is_free(after.k.id));
    EXPECT_EQ(f.alloc.counters().graphs_allocated, 2u);
}

TEST(Alloc, inputs_never_share_a_buffer) {
    // Bug 2b: token_ids' last reader is position 1, positions is built after
    // it with the same size; without pinning, positions would take
    // token_ids' buffer and its host fill would clobber the token ids.
    Fixture f;
    Graph g;
    NodeId tok = g.add_input("token_ids", 4);
    NodeId emb = add_op(g, Op::Add, "emb", {tok, tok}, 4);
    NodeId pos = g.add_input("positions", 4);
    NodeId r = add_op(g, Op::Add, "r", {emb, pos}, 4);
    g.outputs.push_back(r);
    f.alloc.alloc_graph(g);
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(tok), *f.alloc.node_buffer(pos)));
    const std::vector<int32_t> ids{11, 12, 13, 14}, ps{0, 1, 2, 3};
    f.alloc.fill_input(g, "token_ids", ids);
    f.alloc.fill_input(g, "positions", ps);
    std::vector<int32_t> back(4);
    f.b0.read_host(*f.alloc.node_buffer(tok), back.data(), 16);
    EXPECT_EQ(back, ids);
    f.b0.read_host(*f.alloc.node_buffer(pos), back.data(), 16);
    EXPECT_EQ(back, ps);
    // The fill names the input at fault.
    const std::vector<int32_t> three{1, 2, 3};
    try {
        f.alloc.fill_input(g, "positions", three);
        FAIL();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("'positions' holds 4 values, got 3"),
                  std::string::npos)
            << e.what();
    }
    EXPECT_THROW(f.alloc.fill_input(g, "tail_ids", ids), Error);
    check_allocation(g, f.alloc);
}

TEST(Alloc, outputs_pinned_to_end) {
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId early = add_op(g, Op::Add, "early_out", {x, x}, 64);  // no reader
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64);
    NodeId b = add_op(g, Op::Add, "b", {a, x}, 64);
    NodeId c = add_op(g, Op::Add, "c", {b, x}, 64);
    NodeId d = add_op(g, Op::Add, "d", {c, x}, 64);
    g.outputs = {early, d};
    f.alloc.alloc_graph(g);
    ASSERT_TRUE(f.alloc.node_buffer(early).has_value());  // not dead
    for (NodeId id : {a, b, c, d})
        EXPECT_FALSE(overlaps(*f.alloc.node_buffer(id), *f.alloc.node_buffer(early)));
    EXPECT_EQ(f.alloc.plan_stats().dead_nodes, 0u);
    check_allocation(g, f.alloc);
}

TEST(Alloc, liveness_follows_build_order) {
    // The G3 bug. Kahn order is x m a r b c out (r only needs m, so it is
    // ready early); build order puts r after b and c. Kahn liveness frees m
    // after r and gives b m's buffer — but in build order b runs before r,
    // which still has to read m.
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 256);
    NodeId m = add_op(g, Op::Add, "m", {x, x}, 256);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 256);
    NodeId b = add_op(g, Op::Add, "b", {a, a}, 256);
    NodeId c = add_op(g, Op::Add, "c", {b, b}, 256);
    NodeId r = add_op(g, Op::Add, "r", {m, m}, 256);
    NodeId out = add_op(g, Op::Add, "out", {c, r}, 256);
    g.outputs.push_back(out);
    const std::vector<NodeId> kahn = g.topo_order();
    ASSERT_EQ(kahn, (std::vector<NodeId>{x, m, a, r, b, c, out}));  // differs from build order
    f.alloc.alloc_graph(g);
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(b), *f.alloc.node_buffer(m)));
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(c), *f.alloc.node_buffer(m)));
    check_allocation(g, f.alloc);
}

TEST(Alloc, alias_only_with_sole_consumer) {
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64);
    NodeId s = add_op(g, Op::Silu, "silu_a", {a}, 64);  // a's only reader
    NodeId a2 = add_op(g, Op::Add, "a2", {x, x}, 64);
    NodeId s2 = add_op(g, Op::Silu, "silu_a2", {a2}, 64);
    NodeId t = add_op(g, Op::Add, "t", {a2, s2}, 64);    // a2 read twice
    NodeId sx = add_op(g, Op::Silu, "silu_x", {x}, 64);  // never alias an input
    NodeId o = add_op(g, Op::Add, "o", {s, t}, 64);
    NodeId o2 = add_op(g, Op::Add, "o2", {o, sx}, 64);
    g.outputs.push_back(o2);
    f.alloc.alloc_graph(g);
    EXPECT_TRUE(f.alloc.is_aliased(s));
    EXPECT_TRUE(f.alloc.node_buffer(s)->same_buffer(*f.alloc.node_buffer(a)));
    EXPECT_EQ(f.alloc.node_buffer(s)->offset, f.alloc.node_buffer(a)->offset);
    EXPECT_FALSE(f.alloc.is_aliased(s2));
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(s2), *f.alloc.node_buffer(a2)));
    EXPECT_FALSE(f.alloc.is_aliased(sx));
    EXPECT_EQ(f.alloc.plan_stats().aliased_nodes, 1u);
    check_allocation(g, f.alloc);
}

TEST(Alloc, alias_refused_across_backends) {
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64, 1, 0);
    NodeId s = add_op(g, Op::Silu, "silu", {a}, 64, 1, 1);  // sole reader, other backend
    g.outputs.push_back(s);
    f.alloc.alloc_graph(g);
    EXPECT_FALSE(f.alloc.is_aliased(s));
    EXPECT_EQ(f.alloc.node_buffer(s)->backend, 1);
    EXPECT_EQ(f.alloc.node_buffer(a)->backend, 0);
    check_allocation(g, f.alloc);
}

TEST(Alloc, alias_extends_live_range) {
    // s aliases a (a's last reader is s, at position 2). Unless the buffer's
    // deadline moves to s's last reader (d, position 5), the sweep at 3
    // would hand it to b and clobber s.
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 256);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 256);
    NodeId s = add_op(g, Op::Silu, "s", {a}, 256);
    NodeId b = add_op(g, Op::Add, "b", {x, x}, 256);
    NodeId c = add_op(g, Op::Add, "c", {b, b}, 256);
    NodeId d = add_op(g, Op::Add, "d", {s, c}, 256);
    g.outputs.push_back(d);
    f.alloc.alloc_graph(g);
    ASSERT_TRUE(f.alloc.is_aliased(s));
    const BufRef sb = *f.alloc.node_buffer(s);
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(b), sb));
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(c), sb));
    check_allocation(g, f.alloc);
}

TEST(Alloc, dead_nodes_get_no_buffer) {
    // The Silu orphaned by SwiGLU fusion: no reader, not an output.
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId gate = add_op(g, Op::Add, "gate", {x, x}, 64);
    NodeId orphan = add_op(g, Op::Silu, "ffn_silu", {gate}, 64);
    NodeId sw = add_op(g, Op::SwiGLU, "ffn_swiglu", {gate, x}, 64);
    g.outputs.push_back(sw);
    f.alloc.alloc_graph(g);
    EXPECT_FALSE(f.alloc.node_buffer(orphan).has_value());
    EXPECT_EQ(f.alloc.plan_stats().dead_nodes, 1u);
    EXPECT_EQ(f.alloc.counters().dead_nodes, 1u);
    check_allocation(g, f.alloc);
}

TEST(Alloc, staging_never_drawn_from_free_list) {
    Fixture f(Planner::Classes);
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64, 1, 0);
    NodeId s = add_op(g, Op::Add, "b", {a, a}, 64, 1, 1);
    g.outputs.push_back(s);
    f.alloc.alloc_graph(g);
    // A free buffer of exactly the staging size on the destination pool.
    const BufferId loose = f.b1.allocate(class_size(256));
    f.b1.free(loose);
    const BufRef st = f.alloc.cross_staging(a, 1);
    EXPECT_NE(st.id, loose);
    EXPECT_TRUE(f.b1.pool.is_free(loose));
    EXPECT_EQ(st.backend, 1);
    EXPECT_EQ(st.len, 256u);
    EXPECT_EQ(f.b1.n_fresh, 1);
    // One per (node, destination) per graph: the next execute reuses it.
    const BufRef again = f.alloc.cross_staging(a, 1);
    EXPECT_TRUE(again.same_buffer(st));
    EXPECT_EQ(f.b1.n_fresh, 1);
    EXPECT_EQ(f.alloc.plan_stats().staging_buffers, 1u);
    // Its memory goes back to the system at the next rebuild of this slot
    // (staging is always minted fresh, so on the free list it would pile up).
    const size_t held = f.b1.stats().bytes;
    f.alloc.alloc_graph(g);
    EXPECT_TRUE(f.b1.pool.is_released(st.id));
    EXPECT_FALSE(f.alloc.node_buffer(s)->same_buffer(st));
    EXPECT_EQ(f.b1.stats().bytes, held - 256);
}

TEST(Alloc, size_classes) {
    EXPECT_EQ(class_size(1), 1u);
    EXPECT_EQ(class_size(3), 4u);
    EXPECT_EQ(class_size(1000), 1024u);
    EXPECT_EQ(class_size(4096), 4096u);
    EXPECT_EQ(class_size(16384), 16384u);
    EXPECT_EQ(class_size(16385), 32768u);
    EXPECT_EQ(class_size(40000), 49152u);
    EXPECT_EQ(class_size(49152), 49152u);
    // The pool buffer is the class; the BufRef keeps the real length, so two
    // shapes of one class share a buffer across a rebuild.
    Fixture f(Planner::Classes);
    Graph g1;
    NodeId x1 = g1.add_input("x", 250);  // 1000 bytes
    g1.outputs.push_back(x1);
    f.alloc.alloc_graph(g1);
    const BufRef r1 = *f.alloc.node_buffer(x1);
    EXPECT_EQ(r1.len, 1000u);
    EXPECT_EQ(f.b0.buffer_bytes(r1.id), 1024u);
    Graph g2;
    NodeId x2 = g2.add_input("x", 240);  // 960 bytes, same class
    g2.outputs.push_back(x2);
    f.alloc.alloc_graph(g2);
    EXPECT_TRUE(f.alloc.node_buffer(x2)->same_buffer(r1));
    EXPECT_EQ(f.alloc.node_buffer(x2)->len, 960u);
    EXPECT_EQ(f.b0.stats().allocations, 1u);
}

TEST(Alloc, randomized_dags_satisfy_the_checker) {
    // Random build-order DAGs (tests/random_graph.h): element-wise ops with
    // mixed sizes on two backends, unfused KV stores + attention, fused
    // Q/K/V with the bias-RoPE-store epilogue; 300 graphs, each checked by
    // the independent checker.
    std::mt19937 rng(1234);
    Fixture f;
    auto rnd = [&](uint32_t bound) { return static_cast<uint32_t>(rng() % bound); };
    size_t kv_graphs = 0;
    for (int trial = 0; trial < 300; ++trial) {
        Graph g = minfer::testing::random_graph(rnd, 2);
        f.alloc.alloc_graph(g, trial % 2);  // two live plans, like the cache
        SCOPED_TRACE(::testing::Message() << "trial " << trial);
        check_allocation(g, f.alloc);
        if (HasFatalFailure() || HasNonfatalFailure()) break;
        for (const Node& n : g.nodes) kv_graphs += n.op == Op::QkvBiasRopeStore;
    }
    // The generator exercised aliasing, dead nodes and both KV shapes.
    EXPECT_GT(f.alloc.counters().aliased_nodes, 0u);
    EXPECT_GT(f.alloc.counters().dead_nodes, 0u);
    EXPECT_GT(kv_graphs, 0u);
    EXPECT_EQ(f.alloc.counters().kv_regions, 2u * minfer::testing::kRandomLayers);
}

TEST(Alloc, alias_refused_on_a_pinned_output_and_a_kv_region) {
    Fixture f;
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64);
    NodeId s = add_op(g, Op::Silu, "silu_a", {a}, 64);  // a's only reader, but a is an output
    NodeId o = add_op(g, Op::Add, "o", {s, x}, 64);
    g.outputs = {a, o};
    f.alloc.alloc_graph(g);
    EXPECT_FALSE(f.alloc.is_aliased(s));
    EXPECT_FALSE(overlaps(*f.alloc.node_buffer(s), *f.alloc.node_buffer(a)));
    check_allocation(g, f.alloc);

    // Rope on a KvStore's output (the K region): never in place.
    KvGraph k = kv_graph(2, 16);
    const NodeId pos = k.g.find("positions");
    NodeId r = add_op(k.g, Op::Rope, "rope_on_kv", {k.store, pos}, 64, 16);
    NodeId o2 = add_op(k.g, Op::Add, "o2", {r, r}, 64, 16);
    k.g.outputs.push_back(o2);
    f.alloc.alloc_graph(k.g, 1);
    EXPECT_FALSE(f.alloc.is_aliased(r));
    EXPECT_FALSE(f.alloc.node_buffer(r)->same_buffer(f.alloc.kv_pair(0)->k));
    check_allocation(k.g, f.alloc);
}

TEST(Alloc, arena_within_ten_percent_of_the_bound_and_never_above_classes_on_model_graphs) {
    // The lower bound (most bytes live at once) holds for any plan; the
    // upper one is the planner's promise: greedy-by-size offsets plus the
    // arena's 1/16 rounding stay within 10% of it on transformer graphs,
    // and never take more than one buffer per size class.
    struct Case {
        int64_t n_tokens;
        minfer::testing::ModelDims d;
    };
    minfer::testing::ModelDims big;
    big.n_embd = 896;
    big.n_ff = 4864;
    big.n_vocab = 1000;
    big.n_head = 14;
    big.n_head_kv = 2;
    big.head_dim = 64;
    big.n_layer = 4;
    big.n_ctx = 512;
    for (const Case& c :
         {Case{1, {}}, Case{9, {}}, Case{32, {}}, Case{1, big}, Case{7, big}, Case{128, big}}) {
        SCOPED_TRACE(::testing::Message() << "n_tokens " << c.n_tokens << " n_embd " << c.d.n_embd);
        Graph g = minfer::testing::model_like_graph(c.n_tokens, c.d);
        Fixture arena(Planner::Arena), classes(Planner::Classes);
        const size_t arena_bytes = arena.alloc.alloc_graph(g).pool_bytes;
        const size_t classes_bytes = classes.alloc.alloc_graph(g).pool_bytes;
        const size_t bound = check_allocation(g, arena.alloc);
        check_allocation(g, classes.alloc);
        EXPECT_GE(arena_bytes, bound);
        EXPECT_LE(static_cast<double>(arena_bytes), 1.10 * static_cast<double>(bound))
            << "arena " << arena_bytes << " bytes, bound " << bound;
        EXPECT_LE(arena_bytes, classes_bytes);
        std::printf(
            "model graph n_embd %lld n_tokens %lld: bound %zu, arena %zu (%.3fx), classes %zu "
            "(%.3fx)\n",
            static_cast<long long>(c.d.n_embd), static_cast<long long>(c.n_tokens), bound,
            arena_bytes, double(arena_bytes) / double(bound), classes_bytes,
            double(classes_bytes) / double(bound));
    }
}

TEST(Alloc, fill_input_checks_the_graph_identity_not_its_size) {
    // Two graphs of the same size and input names: filling the one that was
    // not planned is a bug, caught by the uid — the node count cannot tell.
    Fixture f;
    auto make = [] {
        Graph g;
        NodeId x = g.add_input("x", 4);
        g.outputs.push_back(add_op(g, Op::Add, "a", {x, x}, 4));
        return g;
    };
    Graph planned = make(), other = make();
    ASSERT_EQ(planned.size(), other.size());
    EXPECT_NE(planned.uid, other.uid);
    Graph copy = planned;  // a copy is another graph
    EXPECT_NE(copy.uid, planned.uid);
    f.alloc.alloc_graph(planned);
    const std::vector<int32_t> v{1, 2, 3, 4};
    f.alloc.fill_input(planned, "x", v);
    EXPECT_DEATH(f.alloc.fill_input(other, "x", v), "not the graph the current plan was made for");
    EXPECT_DEATH(f.alloc.fill_input(copy, "x", v), "not the graph the current plan was made for");
    // A moved graph keeps its identity (the cache takes graphs by move).
    const uint64_t uid = planned.uid;
    Graph moved = std::move(planned);
    EXPECT_EQ(moved.uid, uid);
    f.alloc.fill_input(moved, "x", v);
}
