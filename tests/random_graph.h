// Random build-order graphs for the allocator: element-wise ops (some in
// place) with mixed sizes over one or two backends, plus the attention
// shapes that touch the KV regions — an unfused KvStore + Attn, and a fused
// Q/K/V projection with the bias-RoPE-store epilogue (leaving, like the
// fusion pass, a KvStore with no sources behind). Random outputs. Shared by
// the randomized test (test_alloc.cpp) and the fuzz target (fuzz/fuzz_alloc.cpp);
// `rnd(bound)` returns a value in [0, bound).
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace minfer::testing {

// Layer l's KV regions live on backend l % n_backends with one fixed size,
// so graphs allocated one after another by one allocator agree on them.
constexpr int32_t kRandomLayers = 4;
constexpr int32_t kRandHeadDim = 16, kRandHeads = 2, kRandHeadsKv = 1;
constexpr int64_t kRandCtx = 8;

template <class Rand>
graph::Graph random_graph(Rand&& rnd, int n_backends, int max_ops = 45) {
    using graph::Graph;
    using graph::Node;
    using graph::NodeId;
    using graph::Op;
    Graph g;
    const int64_t widths[] = {8, 100, 1000, 4096, 5000};
    const int64_t n_tok = 1 + rnd(3);
    const NodeId pos = g.add_input("positions", n_tok);
    const int n_in = static_cast<int>(rnd(3));
    for (int i = 0; i < n_in; ++i) g.add_input("in" + std::to_string(i), widths[rnd(5)]);
    auto add = [&](Op op, std::string name, std::vector<NodeId> src, int64_t ne0, int64_t ne1,
                   graph::BackendId b, int32_t layer = -1) {
        Node n;
        n.op = op;
        n.name = std::move(name);
        n.ne = {ne0, ne1, 1, 1};
        n.src = std::move(src);
        n.backend = b;
        n.meta.layer = layer;
        if (layer >= 0) {
            n.meta.n_head = kRandHeads;
            n.meta.n_head_kv = kRandHeadsKv;
            n.meta.head_dim = kRandHeadDim;
            n.meta.n_ctx = kRandCtx;
        }
        return g.add(std::move(n));
    };
    // Mostly recent sources (chains), sometimes far back (long ranges).
    auto pick = [&] {
        const size_t n = g.size();
        const size_t back = rnd(4) == 0 ? rnd(static_cast<uint32_t>(n))
                                        : rnd(static_cast<uint32_t>(std::min<size_t>(n, 3)));
        return static_cast<NodeId>(n - 1 - back);
    };
    const int64_t n_q = kRandHeads * kRandHeadDim, n_kv = kRandHeadsKv * kRandHeadDim;
    const int n_ops = 5 + static_cast<int>(rnd(static_cast<uint32_t>(std::max(1, max_ops - 5))));
    for (int i = 0; i < n_ops; ++i) {
        const std::string tag = std::to_string(i);
        const graph::BackendId b =
            (n_backends > 1 && rnd(4) == 0) ? static_cast<graph::BackendId>(1) : 0;
        const uint32_t kind = rnd(10);
        if (kind < 2) {
            const int32_t layer = static_cast<int32_t>(rnd(kRandomLayers));
            const graph::BackendId lb = layer % n_backends;
            if (kind == 0) {  // unfused: k, v, q -> KvStore -> Attn
                const NodeId x = pick();
                const NodeId k = add(Op::Add, "k" + tag, {x, pick()}, n_kv, n_tok, lb);
                const NodeId kr = add(Op::Rope, "k_rope" + tag, {k, pos}, n_kv, n_tok, lb);
                const NodeId v = add(Op::Add, "v" + tag, {x, pick()}, n_kv, n_tok, lb);
                const NodeId q = add(Op::Add, "q" + tag, {x, pick()}, n_q, n_tok, lb);
                const NodeId qr = add(Op::Rope, "q_rope" + tag, {q, pos}, n_q, n_tok, lb);
                const NodeId st =
                    add(Op::KvStore, "kv_store" + tag, {kr, v, pos}, n_kv, kRandCtx, lb, layer);
                add(Op::Attn, "attn" + tag, {qr, st, pos}, n_q, n_tok, lb, layer);
            } else {  // fused: FusedQKV -> epilogue (in place) -> Attn
                const NodeId qkv =
                    add(Op::FusedQKV, "qkv" + tag, {pick()}, n_q + 2 * n_kv, n_tok, lb, layer);
                add(Op::KvStore, "kv_store_cut" + tag, {}, n_kv, kRandCtx, lb, layer);
                const NodeId ep = add(Op::QkvBiasRopeStore, "qkv_epilogue" + tag, {qkv, pos},
                                      n_q + 2 * n_kv, n_tok, lb, layer);
                add(Op::Attn, "attn" + tag, {ep, ep, pos}, n_q, n_tok, lb, layer);
            }
            continue;
        }
        const Op ops[] = {Op::Add, Op::Mul, Op::Silu, Op::Rope, Op::SwiGLU};
        const Op op = ops[rnd(5)];
        std::vector<NodeId> src{pick()};
        if (op != Op::Silu) src.push_back(pick());
        // In-place ops keep their source's shape, so aliasing can apply.
        const auto& s0 = g.node(src[0]).ne;
        const bool same = op == Op::Silu || op == Op::Rope;
        add(op, "n" + tag, src, same ? s0[0] : widths[rnd(5)], same ? s0[1] : 1, b);
    }
    for (size_t i = 0; i < g.size(); ++i)
        if (rnd(8) == 0) g.outputs.push_back(static_cast<NodeId>(i));
    g.outputs.push_back(static_cast<NodeId>(g.size() - 1));
    return g;
}

}  // namespace minfer::testing
