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

TEST(Fuse, SwigluOrphansTheSilu) {
    Fixture f("qwen2");
    graph::Graph g = f.build(4);
    graph::FuseStats s = graph::fuse(g, {.qkv = false, .ffn = true});
    EXPECT_EQ(s.ffn, 2);
    EXPECT_EQ(count(g, graph::Op::SwiGLU), 2);
    auto consumers = g.n_consumers();
    for (size_t i = 0; i < g.size(); ++i) {
        if (g.nodes[i].op == graph::Op::Silu) {
            EXPECT_EQ(consumers[i], 0) << g.nodes[i].name;
        }
    }
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
