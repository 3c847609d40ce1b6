// The memory report, the arena planner and the forward-pass observability:
// lower bounds computed by hand on small graphs, the arena against the same
// allocation checker as the size-class planner, and the report and trace of
// a real generation with a tiny model.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "fake_backend.h"
#include "graph/alloc.h"
#include "graph/cache.h"
#include "graph_helpers.h"
#include "model/model.h"
#include "report/graph_dump.h"
#include "report/memory_report.h"
#include "report/observe.h"
#include "runtime/session.h"
#include "tiny_model.h"

using namespace minfer;
using namespace minfer::graph;
using minfer::testing::add_op;
using minfer::testing::check_allocation;
using minfer::testing::FakeBackend;

namespace {

struct Fixture {
    FakeBackend b0{"cpu"}, b1{"queue"};
    GraphAllocator alloc;
    explicit Fixture(Planner p) : alloc({&b0, &b1}, p) { b1.self = 1; }
};

const Planner kPlanners[] = {Planner::Classes, Planner::Arena};

// x (input, pinned) -> a1 -> a2 -> a3 -> a4 (output); every node 1 KiB, each
// a_k also reads x. Live bytes per position: 1, 2, 3, 3, 3 KiB.
Graph chain_graph() {
    Graph g;
    NodeId x = g.add_input("x", 256);
    NodeId a1 = add_op(g, Op::Add, "a1", {x, x}, 256);
    NodeId a2 = add_op(g, Op::Add, "a2", {a1, x}, 256);
    NodeId a3 = add_op(g, Op::Add, "a3", {a2, x}, 256);
    NodeId a4 = add_op(g, Op::Add, "a4", {a3, x}, 256);
    g.outputs.push_back(a4);
    return g;
}

// x(1K, input) -> a(1K) -> {b(2K), c(4K)} -> d(3K, output).
// Live: x [0,5] a [1,3] b [2,4] c [3,4] d [4,5].
// t=0: 1K  t=1: 2K  t=2: 4K  t=3: x+a+b+c = 8K  t=4: x+b+c+d = 10K.
Graph diamond_graph() {
    Graph g;
    NodeId x = g.add_input("x", 256);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 256);
    NodeId b = add_op(g, Op::Add, "b", {a, a}, 512);
    NodeId c = add_op(g, Op::Add, "c", {a, a}, 1024);
    NodeId d = add_op(g, Op::Add, "d", {b, c}, 768);
    g.outputs.push_back(d);
    return g;
}

// x (input) -> a -> s = silu(a) in place; b = x + x; d = s + b (output).
// a's bytes carry s through d (position 4): a [1,4], b [3,4], d [4,5].
// t=1: 2K  t=2: 2K  t=3: 3K  t=4: 4K. Counting s as its own tensor would
// give 5K at t=4: an alias counts once.
Graph alias_graph() {
    Graph g;
    NodeId x = g.add_input("x", 256);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 256);
    NodeId s = add_op(g, Op::Silu, "s", {a}, 256);
    NodeId b = add_op(g, Op::Add, "b", {x, x}, 256);
    NodeId d = add_op(g, Op::Add, "d", {s, b}, 256);
    g.outputs.push_back(d);
    return g;
}

// The lower bound by definition, straight from the plan: at each position t,
// the bytes of every non-aliased, non-KV node with a buffer whose range
// (extended through its aliases' readers) covers t.
size_t brute_force_bound(const Graph& g, const GraphAllocator& a) {
    std::vector<size_t> lu = minfer::testing::build_order_last_use(g);
    for (size_t i = 0; i < g.size(); ++i)
        if (a.node_buffer(static_cast<NodeId>(i)) && a.is_aliased(static_cast<NodeId>(i))) {
            NodeId r = minfer::testing::alias_root(g, a, static_cast<NodeId>(i));
            lu[static_cast<size_t>(r)] = std::max(lu[static_cast<size_t>(r)], lu[i]);
        }
    size_t best = 0;
    for (size_t t = 0; t < g.size(); ++t) {
        size_t live = 0;
        for (size_t i = 0; i <= t; ++i) {
            const auto b = a.node_buffer(static_cast<NodeId>(i));
            if (b && !a.is_aliased(static_cast<NodeId>(i)) && g.nodes[i].op != Op::KvStore &&
                lu[i] >= t)
                live += b->len;
        }
        best = std::max(best, live);
    }
    return best;
}

}  // namespace

TEST(Report, lower_bound_of_a_chain) {
    for (Planner p : kPlanners) {
        Fixture f(p);
        Graph g = chain_graph();
        f.alloc.alloc_graph(g);
        EXPECT_EQ(report::live_bytes_curve(g, f.alloc),
                  (std::vector<size_t>{1024, 2048, 3072, 3072, 3072}));
        EXPECT_EQ(report::lower_bound_bytes(g, f.alloc), 3072u);
        // Both planners reach the bound here (one "current value" pair).
        EXPECT_EQ(f.alloc.plan_stats().pool_bytes, 3072u) << planner_name(p);
        check_allocation(g, f.alloc);
    }
}

TEST(Report, lower_bound_of_a_diamond) {
    for (Planner p : kPlanners) {
        Fixture f(p);
        Graph g = diamond_graph();
        f.alloc.alloc_graph(g);
        EXPECT_EQ(report::live_bytes_curve(g, f.alloc),
                  (std::vector<size_t>{1024, 2048, 4096, 8192, 10240}));
        EXPECT_EQ(report::lower_bound_bytes(g, f.alloc), 10240u);
        EXPECT_GE(f.alloc.plan_stats().pool_bytes, 10240u);
        check_allocation(g, f.alloc);
    }
    // Greedy by size places c 0..4K, d 4..7K, b 7..9K, x 9..10K and a in
    // the gap 4..5K (a is dead before d starts): exactly the bound.
    Fixture f(Planner::Arena);
    Graph g = diamond_graph();
    f.alloc.alloc_graph(g);
    EXPECT_EQ(f.alloc.plan_stats().pool_bytes, 10240u);
    EXPECT_EQ(f.alloc.node_buffer(g.find("c"))->offset, 0u);
    EXPECT_EQ(f.alloc.node_buffer(g.find("d"))->offset, 4096u);
    EXPECT_EQ(f.alloc.node_buffer(g.find("b"))->offset, 7168u);
    EXPECT_EQ(f.alloc.node_buffer(g.find("x"))->offset, 9216u);
    EXPECT_EQ(f.alloc.node_buffer(g.find("a"))->offset, 4096u);
    // Classes: one buffer per size class alive at once -> 1+1+2+4+4 KiB
    // (d's 3 KiB rounds up to the 4 KiB class).
    Fixture fc(Planner::Classes);
    fc.alloc.alloc_graph(g);
    EXPECT_EQ(fc.alloc.plan_stats().pool_bytes, 12288u);
}

TEST(Report, lower_bound_counts_an_alias_once) {
    for (Planner p : kPlanners) {
        Fixture f(p);
        Graph g = alias_graph();
        f.alloc.alloc_graph(g);
        ASSERT_TRUE(f.alloc.is_aliased(g.find("s"))) << planner_name(p);
        EXPECT_EQ(report::live_until(g, f.alloc)[static_cast<size_t>(g.find("a"))], 4u);
        EXPECT_EQ(report::live_bytes_curve(g, f.alloc),
                  (std::vector<size_t>{1024, 2048, 2048, 3072, 4096}));
        EXPECT_EQ(report::lower_bound_bytes(g, f.alloc), 4096u);
        // In place = the same bytes: same buffer, same offset.
        EXPECT_TRUE(
            f.alloc.node_buffer(g.find("s"))->same_buffer(*f.alloc.node_buffer(g.find("a"))));
        EXPECT_EQ(f.alloc.node_buffer(g.find("s"))->offset,
                  f.alloc.node_buffer(g.find("a"))->offset);
        check_allocation(g, f.alloc);
    }
}

TEST(Report, arena_one_buffer_per_backend_shared_by_every_slot) {
    Fixture f(Planner::Arena);
    Graph g;
    NodeId x = g.add_input("x", 64);
    NodeId a = add_op(g, Op::Add, "a", {x, x}, 64, 1, 0);
    NodeId b = add_op(g, Op::Add, "b", {a, a}, 64, 1, 1);
    NodeId c = add_op(g, Op::Add, "c", {b, b}, 64, 1, 1);
    NodeId d = add_op(g, Op::Add, "d", {c, a}, 64, 1, 0);
    g.outputs.push_back(d);
    const PlanStats& st = f.alloc.alloc_graph(g, kPrefill);
    EXPECT_EQ(st.n_buffers, 2u);
    EXPECT_EQ(st.buffers_per_backend, (std::vector<size_t>{1, 1}));
    EXPECT_EQ(f.alloc.node_buffer(b)->backend, 1);
    check_allocation(g, f.alloc);
    std::set<std::pair<int32_t, uint32_t>> prefill_bufs;
    for (const auto& r : f.alloc.plan_buffers()) prefill_bufs.insert({r.backend, r.id});
    // A second cached graph is placed in the same arenas (plans of
    // different slots never run at once): nothing new is allocated.
    const size_t before = f.b0.stats().allocations + f.b1.stats().allocations;
    f.alloc.alloc_graph(g, kDecode);
    for (const auto& r : f.alloc.plan_buffers())
        EXPECT_EQ(prefill_bufs.count({r.backend, r.id}), 1u);
    check_allocation(g, f.alloc);
    f.alloc.alloc_graph(g, kDecode);
    EXPECT_EQ(f.b0.stats().allocations + f.b1.stats().allocations, before);
    EXPECT_EQ(f.alloc.activation_bytes_held(), f.alloc.arena_bytes(0) + f.alloc.arena_bytes(1));
}

namespace {
// A chain whose width follows n_tokens, like a forward pass: every
// activation is [64, n_tokens] f32, and the output [32, n_tokens].
Graph pass_graph(int64_t n_tokens) {
    Graph g;
    NodeId x = g.add_input("x", 64 * n_tokens);
    NodeId h = x;
    // Appended, not "a" + to_string(l): GCC 12's false -Wrestrict (PR 105651).
    const auto named = [](char prefix, int l) {
        std::string s(1, prefix);
        s += std::to_string(l);
        return s;
    };
    for (int l = 0; l < 4; ++l) {
        NodeId a = add_op(g, Op::Add, named('a', l), {h, x}, 64 * n_tokens);
        h = add_op(g, Op::Mul, named('m', l), {a, h}, 64 * n_tokens);
    }
    NodeId out = add_op(g, Op::Add, "out", {h, h}, 32 * n_tokens);
    g.outputs.push_back(out);
    return g;
}
}  // namespace

TEST(Report, arena_held_is_the_largest_plan_and_nothing_is_allocated_after_it) {
    Fixture f(Planner::Arena);
    // Chat-like: prompt lengths rising, falling and repeating, decode steps in
    // between, on two slots. The arena grows only when a plan needs more.
    const int64_t lengths[] = {20, 1, 380, 1, 57, 1, 300, 1, 9, 1, 380, 1, 133, 1};
    size_t largest = 0;
    size_t growths = 0, last_arena = 0;
    for (int64_t n : lengths) {
        Graph g = pass_graph(n);
        const PlanStats& st = f.alloc.alloc_graph(g, n == 1 ? kDecode : kPrefill);
        check_allocation(g, f.alloc);
        largest = std::max(largest, st.pool_bytes);
        // Held: exactly the largest plan so far (one backend used here).
        EXPECT_EQ(f.alloc.activation_bytes_held(), largest) << "n_tokens " << n;
        EXPECT_EQ(f.alloc.counters().largest_plan_bytes, largest);
        if (f.alloc.arena_bytes(0) != last_arena) ++growths;
        last_arena = f.alloc.arena_bytes(0);
        // The pool holds the arena alone: every outgrown arena was released.
        EXPECT_EQ(f.b0.stats().bytes, largest) << "n_tokens " << n;
    }
    // 20 (and the decode inside it), then 380: two growths, no more.
    EXPECT_EQ(growths, 2u);
    EXPECT_EQ(f.alloc.counters().arena_growths, 2u);
    EXPECT_EQ(f.b0.stats().released, 1u);
    // Warmed up by the largest pass: any further mix allocates nothing.
    const size_t allocs = f.b0.stats().allocations;
    std::mt19937 rng(7);
    for (int i = 0; i < 40; ++i) {
        const int64_t n = i % 3 == 0 ? 1 : 1 + static_cast<int64_t>(rng() % 380);
        Graph g = pass_graph(n);
        f.alloc.alloc_graph(g, n == 1 ? kDecode : kPrefill);
        check_allocation(g, f.alloc);
    }
    EXPECT_EQ(f.b0.stats().allocations, allocs);
    EXPECT_EQ(f.alloc.activation_bytes_held(), largest);
}

TEST(Report, arena_growth_repoints_the_other_slots_plan) {
    Fixture f(Planner::Arena);
    Graph dec = pass_graph(1);
    f.alloc.alloc_graph(dec, kDecode);
    const BufferId small = f.alloc.node_buffer(dec.find("out"))->id;
    Graph pre = pass_graph(200);
    f.alloc.alloc_graph(pre, kPrefill);  // grows the arena: the old one is released
    EXPECT_TRUE(f.b0.pool.is_released(small));
    f.alloc.use_plan(kDecode);
    // The decode plan now names the new arena, at its old offsets.
    for (size_t i = 0; i < dec.size(); ++i) {
        const auto ref = f.alloc.node_buffer(static_cast<NodeId>(i));
        ASSERT_TRUE(ref.has_value());
        EXPECT_EQ(ref->id, f.alloc.node_buffer(dec.find("out"))->id);
        EXPECT_NE(ref->id, small);
    }
    check_allocation(dec, f.alloc);
    // Its buffers resolve (a released id would assert).
    for (const auto& r : f.alloc.plan_buffers()) EXPECT_NE(f.b0.pool.resolve(r), nullptr);
}

TEST(Report, arena_keeps_kv_regions_outside) {
    Fixture f(Planner::Arena);
    Graph g;
    NodeId pos = g.add_input("positions", 2);
    NodeId q = add_op(g, Op::Add, "q", {pos, pos}, 128, 2);
    NodeId k = add_op(g, Op::Add, "k", {pos, pos}, 64, 2);
    NodeId v = add_op(g, Op::Add, "v", {pos, pos}, 64, 2);
    Node st;
    st.op = Op::KvStore;
    st.name = "kv_store.0";
    st.ne = {64, 32, 1, 1};
    st.src = {k, v, pos};
    st.meta.layer = 0;
    NodeId store = g.add(st);
    Node at;
    at.op = Op::Attn;
    at.name = "attn.0";
    at.ne = {128, 2, 1, 1};
    at.src = {q, store, pos};
    at.meta = {.layer = 0, .n_head = 2, .n_head_kv = 1, .head_dim = 64, .n_ctx = 32};
    NodeId attn = g.add(at);
    g.outputs.push_back(attn);
    f.alloc.alloc_graph(g);
    const KvPair kv = *f.alloc.kv_pair(0);
    EXPECT_TRUE(f.alloc.node_buffer(store)->same_buffer(kv.k));
    ASSERT_EQ(f.alloc.plan_buffers().size(), 1u);
    EXPECT_FALSE(f.alloc.plan_buffers()[0].same_buffer(kv.k));
    EXPECT_FALSE(f.alloc.plan_buffers()[0].same_buffer(kv.v));
    // The KV regions are not activations. Live: positions [0,6], q [1,5],
    // k [2,4], v [3,4], (store 4: the K region), attn [5,6]: t=3 and t=4
    // hold positions + q + k + v, t=5 positions + q + attn — all 2056 bytes.
    EXPECT_EQ(report::lower_bound_bytes(g, f.alloc), 8u + 1024 + 512 + 512);
    EXPECT_EQ(report::live_bytes_curve(g, f.alloc),
              (std::vector<size_t>{8, 1032, 1544, 2056, 2056, 2056}));
    check_allocation(g, f.alloc);
}

TEST(Report, pool_never_below_the_bound_on_random_dags) {
    // The allocator test's generator, both planners: every plan passes the
    // checker (which also asserts pool >= bound), the report's bound equals
    // the brute-force definition, and the arena never needs more than the
    // size classes.
    for (Planner p : kPlanners) {
        std::mt19937 rng(99);
        Fixture f(p);
        for (int trial = 0; trial < 200; ++trial) {
            Graph g;
            const int64_t widths[] = {8, 100, 1000, 4096, 5000};
            for (int i = 0, n_in = 1 + static_cast<int>(rng() % 3); i < n_in; ++i)
                g.add_input("in" + std::to_string(i), widths[rng() % 5]);
            for (int i = 0, n_ops = 5 + static_cast<int>(rng() % 40); i < n_ops; ++i) {
                const Op ops[] = {Op::Add, Op::Mul, Op::Silu, Op::Rope, Op::SwiGLU};
                const Op op = ops[rng() % 5];
                const size_t n = g.size();
                auto pick = [&] {
                    const size_t back =
                        (rng() % 4 == 0) ? rng() % n : rng() % std::min<size_t>(n, 3);
                    return static_cast<NodeId>(n - 1 - back);
                };
                std::vector<NodeId> src{pick()};
                if (op != Op::Silu) src.push_back(pick());
                const BackendId b = (rng() % 4 == 0) ? 1 : 0;
                const int64_t w =
                    (op == Op::Silu || op == Op::Rope) ? g.node(src[0]).ne[0] : widths[rng() % 5];
                char name[24];  // (a char buffer: GCC 12 gives a -Wrestrict false positive on "n" +
                                // s)
                std::snprintf(name, sizeof name, "n%d", static_cast<int>(i));
                add_op(g, op, name, src, w, 1, b);
            }
            g.outputs.push_back(static_cast<NodeId>(g.size() - 1));
            const PlanStats& st = f.alloc.alloc_graph(g, trial % 2);
            SCOPED_TRACE(::testing::Message() << planner_name(p) << " trial " << trial);
            check_allocation(g, f.alloc);
            const size_t lb = report::lower_bound_bytes(g, f.alloc);
            EXPECT_EQ(lb, brute_force_bound(g, f.alloc));
            EXPECT_GE(st.pool_bytes, lb);
            if (HasFailure()) return;
        }
    }
}

namespace {

// A tiny qwen2 model, parsed from memory (the bytes outlive the model).
struct TinyModel {
    std::vector<uint8_t> bytes;
    model::Model m;
    explicit TinyModel(const char* arch = "qwen2") {
        minfer::testing::TinyModelSpec s;
        s.arch = arch;
        bytes = minfer::testing::make_tiny_model(s).to_bytes();
        m = model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size(), "tiny.gguf"));
    }
};

// Prompt of 5 tokens, then `steps` greedy decode steps.
void run_generation(runtime::Session& s, int steps) {
    std::vector<int32_t> prompt{104, 101, 108, 108, 111};
    std::vector<float> logits = s.eval(prompt);
    for (int i = 0; i < steps; ++i) {
        int32_t next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        logits = s.eval(std::span<const int32_t>(&next, 1));
    }
}

// A 64-cell context on one thread with planner p.
runtime::SessionOptions one_thread_options(Planner p) {
    runtime::SessionOptions o;
    o.n_ctx = 64;
    o.n_threads = 1;
    o.planner = p;
    return o;
}

}  // namespace

TEST(Report, real_generation_allocates_nothing_after_the_first_decode) {
    TinyModel tm;
    for (Planner p : kPlanners) {
        runtime::Session s(tm.m, one_thread_options(p));
        report::MemoryRecorder rec(s);
        run_generation(s, 6);
        const report::MemoryReport r = rec.report();
        ASSERT_EQ(r.graphs.size(), 2u);
        EXPECT_EQ(r.graphs[0].kind, "prefill");
        EXPECT_EQ(r.graphs[0].n_tokens, 5);
        EXPECT_EQ(r.graphs[1].kind, "decode");
        EXPECT_EQ(r.graphs[1].n_tokens, 1);
        EXPECT_EQ(r.run.decode_steps, 6);
        EXPECT_EQ(r.run.rebuilds_after_first_decode, 0);
        EXPECT_EQ(r.run.allocations_after_first_decode, 0);
        // 2 layers x (K + V) x n_kv_embd 32 x n_ctx 64 x f32.
        EXPECT_EQ(r.run.kv_bytes, 2u * 2 * 32 * 64 * 4);
        EXPECT_EQ(r.run.kv_bytes_per_layer, 2u * 32 * 64 * 4);
        EXPECT_EQ(r.run.weight_bytes, tm.m.weight_bytes);
        for (const auto& g : r.graphs) {
            EXPECT_GE(g.pool_bytes, g.lower_bound_bytes);
            EXPECT_GT(g.naive_bytes, g.pool_bytes);
            EXPECT_GT(g.dead_nodes, 0u);  // fusion orphans
            EXPECT_EQ(g.planner, planner_name(p));
            if (p == Planner::Arena) {
                EXPECT_EQ(g.n_buffers, 1u);
            }
        }

        const nlohmann::json j = report::to_json(r);
        ASSERT_TRUE(j.contains("graphs") && j.contains("run"));
        for (const char* k : {"kind", "n_tokens", "n_nodes", "n_buffers", "pool_bytes",
                              "naive_bytes", "lower_bound_bytes", "dead_nodes", "aliased_nodes",
                              "staging_buffers", "pool_over_lower_bound", "buffers_per_backend"})
            EXPECT_TRUE(j["graphs"][0].contains(k)) << k;
        for (const char* k : {"decode_steps", "rebuilds_after_first_decode",
                              "allocations_after_first_decode", "kv_bytes", "weight_bytes"})
            EXPECT_TRUE(j["run"].contains(k)) << k;
        EXPECT_EQ(j["run"]["allocations_after_first_decode"], 0);
        EXPECT_EQ(j["graphs"][1]["kind"], "decode");
    }
}

TEST(Report, a_prefill_after_decoding_began_is_counted_with_the_activation_growth) {
    // A second chat turn: its prompt (20 tokens, longer than the first turn's
    // 5) is a new prefill shape after decoding began. Its rebuild, the pool
    // buffer it needs (a larger arena, or larger size classes) and the bytes
    // the activations grew by must all show in the report — counting decode
    // steps alone would report zeros here.
    TinyModel tm;
    for (Planner p : kPlanners) {
        SCOPED_TRACE(planner_name(p));
        runtime::Session s(tm.m, one_thread_options(p));
        report::MemoryRecorder rec(s);
        run_generation(s, 3);
        const report::MemoryReport warm = rec.report();
        EXPECT_EQ(warm.run.rebuilds_after_first_decode, 0);
        EXPECT_EQ(warm.run.allocations_after_first_decode, 0);
        EXPECT_EQ(warm.run.activation_growth_after_warmup, 0u);
        EXPECT_GT(warm.run.activation_bytes_at_warmup, 0u);

        std::vector<int32_t> turn(20);
        for (size_t i = 0; i < turn.size(); ++i) turn[i] = static_cast<int32_t>(100 + i);
        std::vector<float> logits = s.eval(turn);
        int32_t next =
            static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
        s.eval(std::span<const int32_t>(&next, 1));  // the decode graph is reused

        const report::MemoryReport r = rec.report();
        EXPECT_EQ(r.run.decode_steps, 4);
        EXPECT_EQ(r.run.rebuilds_after_first_decode, 1);
        EXPECT_GE(r.run.allocations_after_first_decode, 1);
        EXPECT_EQ(r.run.activation_bytes_at_warmup, warm.run.activation_bytes_at_warmup);
        EXPECT_GT(r.run.activation_bytes_held, r.run.activation_bytes_at_warmup);
        EXPECT_EQ(r.run.activation_growth_after_warmup,
                  r.run.activation_bytes_held - r.run.activation_bytes_at_warmup);
        const nlohmann::json j = report::to_json(r);
        EXPECT_EQ(j["run"]["activation_growth_after_warmup"], r.run.activation_growth_after_warmup);
        EXPECT_EQ(j["run"]["rebuilds_after_first_decode"], 1);
    }
}

TEST(Report, trace_records_every_node_with_value_statistics) {
    TinyModel tm("qwen3");
    runtime::SessionOptions o;
    o.n_ctx = 32;
    o.n_threads = 1;
    runtime::Session s(tm.m, o);
    report::GraphRecorder rec(s, /*trace_values=*/true);
    std::vector<int32_t> prompt{1, 2, 3};
    const std::vector<float> logits = s.eval(prompt);
    int32_t next = 7;
    s.eval(std::span<const int32_t>(&next, 1));
    ASSERT_EQ(rec.records().size(), 2u);
    const nlohmann::json& pre = rec.records()[0];
    EXPECT_EQ(pre["kind"], "prefill");
    EXPECT_EQ(pre["nodes"].size(), pre["n_nodes"].get<size_t>());
    size_t with_stats = 0;
    for (const auto& nd : pre["nodes"]) {
        EXPECT_EQ(nd.contains("stats"), !nd["dead"].get<bool>()) << nd["name"];
        if (nd.contains("stats")) {
            ++with_stats;
            EXPECT_EQ(nd["stats"]["nan"], 0) << nd["name"];
        }
    }
    EXPECT_GT(with_stats, 10u);
    // The inputs' statistics are the filled values: positions 0, 1, 2.
    const auto& positions = pre["nodes"][static_cast<size_t>(1)];
    ASSERT_EQ(positions["name"], "positions");
    EXPECT_EQ(positions["stats"]["min"], 0.0);
    EXPECT_EQ(positions["stats"]["max"], 2.0);
    EXPECT_EQ(positions["stats"]["mean"], 1.0);
    // The output's statistics are those of the logits the session returned.
    const auto& out = pre["nodes"].back();
    ASSERT_TRUE(out["output"].get<bool>());
    EXPECT_EQ(out["stats"]["max"].get<double>(), *std::max_element(logits.begin(), logits.end()));
    EXPECT_EQ(out["stats"]["min"].get<double>(), *std::min_element(logits.begin(), logits.end()));
    // Buffers: the arena, then the KV regions (2 layers x K, V).
    size_t kv = 0, arena = 0;
    for (const auto& b : pre["buffers"]) {
        kv += b["kind"] == "kv";
        arena += b["kind"] == "arena";
    }
    EXPECT_EQ(kv, 4u);
    EXPECT_EQ(arena, 1u);
    EXPECT_EQ(pre["curve"].size(), pre["n_nodes"].get<size_t>());
    // Every live node's window lies in its buffer; live ranges start at the node.
    for (const auto& nd : pre["nodes"]) EXPECT_EQ(nd["live"][0], nd["id"]);
}

TEST(Report, state_dump_writes_logits_and_kv_regions) {
    TinyModel tm;
    runtime::SessionOptions o;
    o.n_ctx = 16;
    o.n_threads = 1;
    runtime::Session s(tm.m, o);
    std::vector<int32_t> prompt{5, 6};
    const std::vector<float> logits = s.eval(prompt);
    const auto dir = std::filesystem::temp_directory_path() / "minfer_test_state_dump";
    std::filesystem::remove_all(dir);
    report::dump_state(s, logits, 1, dir.string());
    std::ifstream idx(dir / "index.json");
    nlohmann::json j;
    idx >> j;
    EXPECT_EQ(j["n_past"], 2);
    EXPECT_EQ(j["logits"]["shape"], nlohmann::json({264, 1}));
    EXPECT_EQ(std::filesystem::file_size(dir / "logits.f32"), 264u * 4);
    ASSERT_EQ(j["kv"].size(), 4u);
    EXPECT_EQ(j["kv"][0]["name"], "kv.0.k");
    // The regions hold whole KV pages: n_ctx 16 rounded up to one 32-cell page.
    EXPECT_EQ(j["kv"][0]["shape"], nlohmann::json({32, 32}));
    EXPECT_EQ(std::filesystem::file_size(dir / "kv.0.k.f32"), 32u * 32 * 4);
    // The first two rows were written by the prompt; the rest still zero.
    std::vector<float> k(32 * 32);
    std::ifstream(dir / "kv.0.k.f32", std::ios::binary)
        .read(reinterpret_cast<char*>(k.data()), k.size() * 4);
    float row0 = 0, row5 = 0;
    for (int i = 0; i < 32; ++i) row0 += std::abs(k[i]), row5 += std::abs(k[5 * 32 + i]);
    EXPECT_GT(row0, 0.0f);
    EXPECT_EQ(row5, 0.0f);
    std::filesystem::remove_all(dir);
}
