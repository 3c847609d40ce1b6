// Fusion rewrites the plain graph; what it orphans must be dead (no
// consumers), so that the allocator gives it no buffer.
#include <gtest/gtest.h>

#include "graph/fuse.h"
#include "model/build.h"
#include "tiny_model.h"

using namespace minfer;

namespace {

struct Fixture {
    std::vector<uint8_t> bytes;
    model::Model m;
    explicit Fixture(const char* arch) {
        minfer::testing::TinyModelSpec s;
        s.arch = arch;
        bytes = minfer::testing::make_tiny_model(s).to_bytes();
        m = model::Model::from_file(gguf::File::parse(bytes.data(), bytes.size()));
    }
    graph::Graph build(int64_t n) const {
        model::BuildParams bp;
        bp.n_tokens = n;
        bp.n_out = 1;
        bp.n_ctx = 64;
        graph::Graph g = model::build_graph(m, bp);
        for (auto& node : g.nodes) node.backend = 0;
        return g;
    }
};

int count(const graph::Graph& g, graph::Op op) {
    int c = 0;
    for (const auto& n : g.nodes) c += n.op == op;
    return c;
}

}  // namespace

// silu(gate) * up of two MatMuls of the same input becomes one
// MatMulSwiGLU reading both weights; the Silu and the gate and up MatMuls
// are dead, and the down projection reads the fused node.
TEST(Fuse, SwigluOrphansTheSiluAndTheGateAndUpMatMuls) {
    Fixture f("qwen2");
    graph::Graph g = f.build(4);
    graph::FuseStats s = graph::fuse(g, {.qkv = false, .ffn = true});
    EXPECT_EQ(s.ffn, 2);
    EXPECT_EQ(count(g, graph::Op::MatMulSwiGLU), 2);
    EXPECT_EQ(count(g, graph::Op::SwiGLU), 0);
    auto consumers = g.n_consumers();
    int live_ffn_matmuls = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        const auto& n = g.nodes[i];
        if (n.op == graph::Op::Silu) {
            EXPECT_EQ(consumers[i], 0) << n.name;
        }
        if (n.op == graph::Op::MatMul && !n.src.empty() &&
            n.weights.at(0)->name.find("ffn_") != std::string::npos) {
            ++live_ffn_matmuls;
            EXPECT_NE(n.weights[0]->name.find("ffn_down"), std::string::npos) << n.name;
            EXPECT_EQ(g.node(n.src[0]).op, graph::Op::MatMulSwiGLU) << n.name;
        }
        if (n.op == graph::Op::MatMulSwiGLU) {
            ASSERT_EQ(n.weights.size(), 2u);
            EXPECT_NE(n.weights[0]->name.find("ffn_gate"), std::string::npos);
            EXPECT_NE(n.weights[1]->name.find("ffn_up"), std::string::npos);
            EXPECT_EQ(n.ne[0], f.m.hp.n_ff);
            EXPECT_EQ(consumers[i], 1);
        }
    }
    EXPECT_EQ(live_ffn_matmuls, 2);
    EXPECT_EQ(g.topo_order().size(), g.size());
}

TEST(Fuse, QkvFusionLeavesOneProjectionWithOneConsumer) {
    for (const char* arch : {"qwen2", "qwen3"}) {
        Fixture f(arch);
        graph::Graph g = f.build(3);
        graph::FuseStats s = graph::fuse(g, {.qkv = true, .ffn = true});
        EXPECT_EQ(s.qkv, 2) << arch;
        auto consumers = g.n_consumers();
        for (size_t i = 0; i < g.size(); ++i) {
            const auto& n = g.nodes[i];
            if (n.op == graph::Op::FusedQKV) {
                EXPECT_EQ(consumers[i], 1) << n.name;  // only the epilogue: it may alias in place
                EXPECT_EQ(n.ne[0], f.m.hp.n_embd_q() + 2 * f.m.hp.n_embd_kv());
            }
            if (n.op == graph::Op::KvStore || n.op == graph::Op::Rope) {
                EXPECT_EQ(consumers[i], 0) << n.name << " should be dead after fusion";
                EXPECT_TRUE(n.src.empty());
            }
            if (n.op == graph::Op::Attn) {
                EXPECT_EQ(g.node(n.src[0]).op, graph::Op::QkvBiasRopeStore);
            }
        }
        EXPECT_EQ(count(g, graph::Op::QkvBiasRopeStore), 2);
        EXPECT_EQ(g.topo_order().size(), g.size());
    }
}

TEST(Fuse, NoFusionKeepsEveryNodeLive) {
    Fixture f("qwen3");
    graph::Graph g = f.build(2);
    graph::FuseStats s = graph::fuse(g, {.qkv = false, .ffn = false});
    EXPECT_EQ(s.dead, 0);
    EXPECT_EQ(count(g, graph::Op::SwiGLU), 0);
}

// The experts' silu(gate) * up becomes one MatMulIdSwiGLU reading gate and
// up over the same grouped rows; the two MatMulIds and the Silu it replaces
// are dead, and the down projection stays a MatMulId reading its output.
// qwen2moe's shared expert (plain matmuls) fuses to a MatMulSwiGLU.
TEST(Fuse, ExpertsSwigluReplacesGateAndUpMatMulIds) {
    for (const char* arch : {"qwen3moe", "qwen2moe"}) {
        SCOPED_TRACE(arch);
        Fixture f(arch);
        graph::Graph g = f.build(3);
        const int64_t n_layer = f.m.hp.n_layer;
        graph::FuseStats s = graph::fuse(g, {.qkv = true, .ffn = true});
        const bool shared = std::string(arch) == "qwen2moe";
        EXPECT_EQ(s.ffn, (shared ? 2 : 1) * n_layer);
        EXPECT_EQ(count(g, graph::Op::MatMulIdSwiGLU), n_layer);
        EXPECT_EQ(count(g, graph::Op::MatMulSwiGLU), shared ? n_layer : 0);
        EXPECT_EQ(count(g, graph::Op::SwiGLU), 0);
        auto consumers = g.n_consumers();
        int live_matmul_id = 0;
        for (size_t i = 0; i < g.size(); ++i) {
            const auto& n = g.nodes[i];
            if (n.op == graph::Op::MatMulId && !n.src.empty()) {
                ++live_matmul_id;
                EXPECT_EQ(g.node(n.src[0]).op, graph::Op::MatMulIdSwiGLU) << n.name;
            }
            if (n.op == graph::Op::MatMulIdSwiGLU) {
                ASSERT_EQ(n.weights.size(), 2u);
                EXPECT_NE(n.weights[0]->name.find("ffn_gate_exps"), std::string::npos);
                EXPECT_NE(n.weights[1]->name.find("ffn_up_exps"), std::string::npos);
                EXPECT_EQ(g.node(n.src[0]).op, graph::Op::MoeGather);
                EXPECT_EQ(g.node(n.src[1]).op, graph::Op::MoeGroup);
                EXPECT_EQ(n.ne[0], f.m.hp.n_ff_exp);
                EXPECT_EQ(consumers[i], 1);
            }
        }
        EXPECT_EQ(live_matmul_id, n_layer);
        EXPECT_EQ(g.topo_order().size(), g.size());
    }
}
