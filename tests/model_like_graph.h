// A graph shaped like a Qwen2 forward pass (fused QKV + epilogue, attention,
// SwiGLU FFN, an orphaned Silu, logits of the last row), small sizes. Only
// shapes and wiring matter to the allocator and the cache.
#pragma once

#include "graph_helpers.h"
#include "ir/ir.h"

namespace minfer::testing {

struct ModelDims {
    int64_t n_embd = 64, n_ff = 160, n_vocab = 100, n_ctx = 32;
    int32_t n_head = 4, n_head_kv = 2, head_dim = 16, n_layer = 2;
};

inline Graph model_like_graph(int64_t n_tokens, const ModelDims& d = {},
                              graph::BackendId second_half_backend = 0) {
    Graph g;
    const NodeId tok = g.add_input("token_ids", n_tokens);
    const NodeId pos = g.add_input("positions", n_tokens);
    NodeId h = add_op(g, Op::GetRows, "tok_embd", {tok}, d.n_embd, n_tokens);
    const int64_t n_q = d.n_head * d.head_dim, n_kv = d.n_head_kv * d.head_dim;
    for (int32_t l = 0; l < d.n_layer; ++l) {
        const graph::BackendId b = l >= d.n_layer / 2 ? second_half_backend : 0;
        // Appended, not "." + to_string(l): GCC 12 reports a false -Wrestrict
        // in operator+(const char*, string&&) (GCC PR 105651).
        std::string L = ".";
        L += std::to_string(l);
        auto op = [&](Op o, const char* name, std::vector<NodeId> src, int64_t ne0) {
            const NodeId id = add_op(g, o, name + L, std::move(src), ne0, n_tokens, b);
            auto& m = g.node(id).meta;
            m.layer = l;
            m.n_head = d.n_head;
            m.n_head_kv = d.n_head_kv;
            m.head_dim = d.head_dim;
            m.n_ctx = d.n_ctx;
            return id;
        };
        const NodeId x = op(Op::RmsNorm, "attn_norm", {h}, d.n_embd);
        const NodeId qkv = op(Op::FusedQKV, "qkv", {x}, n_q + 2 * n_kv);
        const NodeId ep = op(Op::QkvBiasRopeStore, "qkv_epilogue", {qkv, pos}, n_q + 2 * n_kv);
        const NodeId at = op(Op::Attn, "attn", {ep, ep, pos}, n_q);
        const NodeId o = op(Op::MatMul, "attn_out", {at}, d.n_embd);
        h = op(Op::Add, "attn_residual", {h, o}, d.n_embd);
        const NodeId f = op(Op::RmsNorm, "ffn_norm", {h}, d.n_embd);
        const NodeId gate = op(Op::MatMul, "ffn_gate", {f}, d.n_ff);
        const NodeId up = op(Op::MatMul, "ffn_up", {f}, d.n_ff);
        op(Op::Silu, "ffn_silu_orphan", {gate}, d.n_ff);  // left behind by SwiGLU fusion
        const NodeId sw = op(Op::SwiGLU, "ffn_swiglu", {gate, up}, d.n_ff);
        const NodeId down = op(Op::MatMul, "ffn_down", {sw}, d.n_embd);
        h = op(Op::Add, "ffn_residual", {h, down}, d.n_embd);
    }
    const NodeId tail = add_op(g, Op::SelectRows, "tail", {h, pos}, d.n_embd, 1);
    const NodeId norm = add_op(g, Op::RmsNorm, "output_norm", {tail}, d.n_embd, 1);
    const NodeId logits = add_op(g, Op::MatMul, "logits", {norm}, d.n_vocab, 1);
    g.outputs.push_back(logits);
    return g;
}

}  // namespace minfer::testing
