// Qwen2 and Qwen3 share one decoder layer; they differ in the Q/K/V
// epilogue (biases vs. per-head RMSNorm). qwen2moe and qwen3moe take their
// attention and replace the SwiGLU by a mixture of experts (moe_ffn). Every
// node carries the layer it belongs to, so that assignment can place whole
// layers on a backend.
#include "model/build.h"

#include <string>

#include "ir/moe_layout.h"
#include "util/error.h"

namespace minfer::model {

namespace {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::Op;
using tensor::TensorView;

// Small helpers in the spirit of llama.cpp's build_norm / build_attn / build_ffn.
struct Builder {
    Graph& g;
    const HParams& hp;
    int32_t layer = -1;

    NodeId add(Op op, std::string name, int64_t ne0, int64_t ne1, std::vector<NodeId> src,
               std::vector<const TensorView*> w = {}) {
        Node n;
        n.op = op;
        n.name = layer >= 0 ? name + "." + std::to_string(layer) : name;
        n.ne = {ne0, ne1, 1, 1};
        n.src = std::move(src);
        n.weights = std::move(w);
        n.meta.layer = layer;
        n.meta.eps = hp.rms_eps;
        n.meta.n_head = static_cast<int32_t>(hp.n_head);
        n.meta.n_head_kv = static_cast<int32_t>(hp.n_head_kv);
        n.meta.head_dim = static_cast<int32_t>(hp.head_dim);
        n.meta.rope_freq_base = hp.rope_freq_base;
        return g.add(std::move(n));
    }
    int64_t rows(NodeId id) const { return g.node(id).ne[1]; }
    int64_t width(NodeId id) const { return g.node(id).ne[0]; }

    NodeId norm(NodeId x, const TensorView* w, const char* name) {
        return add(Op::RmsNorm, name, width(x), rows(x), {x}, {w});
    }
    NodeId matmul(NodeId x, const TensorView* w, const std::string& name) {
        return add(Op::MatMul, name, w->ne[1], rows(x), {x}, {w});
    }
    // silu(gate(x)) * up(x) -> down (the fusion pass makes the pair a SwiGLU)
    NodeId swiglu_ffn(NodeId x, const TensorView* w_gate, const TensorView* w_up,
                      const TensorView* w_down, const std::string& p) {
        NodeId gate = matmul(x, w_gate, p + "gate");  // [n_ff, rows]
        NodeId up = matmul(x, w_up, p + "up");        // [n_ff, rows]
        NodeId act = add(Op::Silu, p + "silu", width(gate), rows(gate), {gate});
        NodeId prod = add(Op::Mul, p + "mul", width(gate), rows(gate), {act, up});
        return matmul(prod, w_down, p + "down");  // [n_embd, rows]
    }

    // llama.cpp's build_moe_ffn for qwen2moe / qwen3moe, as graph nodes:
    // router logits -> softmax over every expert -> top k -> their weights
    // (renormalized for qwen3moe); the token rows grouped by expert, each
    // chosen expert's SwiGLU over its rows, the k outputs summed with the
    // weights; qwen2moe adds its shared expert times sigmoid(gate . x).
    NodeId moe_ffn(NodeId x, const LayerWeights& L) {
        const int64_t n = rows(x), k = hp.n_expert_used, slots = k * n;
        NodeId logits = matmul(x, L.ffn_gate_inp, "ffn_moe_logits");  // [n_expert, n]
        NodeId probs = add(Op::Softmax, "ffn_moe_probs", hp.n_expert, n, {logits});
        NodeId ids = add(Op::TopK, "ffn_moe_topk", k, n, {probs});  // [k, n] I32
        g.node(ids).type = tensor::DType::I32;
        NodeId weights = add(Op::MoeWeights, "ffn_moe_weights", k, n, {probs, ids});  // [k, n]
        g.node(weights).meta.moe_norm = hp.moe_norm_weights();
        NodeId group =
            add(Op::MoeGroup, "ffn_moe_group", graph::moe_group_size(hp.n_expert, slots), 1, {ids});
        g.node(group).type = tensor::DType::I32;
        g.node(group).meta.n_expert = static_cast<int32_t>(hp.n_expert);
        NodeId xs = add(Op::MoeGather, "ffn_moe_rows", hp.n_embd, slots, {x, group});
        NodeId gate = add(Op::MatMulId, "ffn_moe_gate", hp.n_ff_exp, slots, {xs, group},
                          {L.ffn_gate_exps});  // [n_ff_exp, slots] grouped
        NodeId up =
            add(Op::MatMulId, "ffn_moe_up", hp.n_ff_exp, slots, {xs, group}, {L.ffn_up_exps});
        NodeId act = add(Op::Silu, "ffn_moe_silu", hp.n_ff_exp, slots, {gate});
        NodeId prod = add(Op::Mul, "ffn_moe_mul", hp.n_ff_exp, slots, {act, up});
        NodeId down = add(Op::MatMulId, "ffn_moe_down", hp.n_embd, slots, {prod, group},
                          {L.ffn_down_exps});  // [n_embd, slots] grouped
        NodeId out = add(Op::MoeSum, "ffn_moe_out", hp.n_embd, n, {down, weights, group});
        if (!L.ffn_gate_inp_shexp) return out;
        NodeId sh = swiglu_ffn(x, L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp, "ffn_shexp_");
        NodeId sh_gate = matmul(x, L.ffn_gate_inp_shexp, "ffn_shexp_gate_inp");  // [1, n]
        sh = add(Op::SigmoidScale, "ffn_shexp_out", hp.n_embd, n, {sh, sh_gate});
        return add(Op::Add, "ffn_out", hp.n_embd, n, {out, sh});
    }
};

}  // namespace

Graph build_graph(const Model& model, const BuildParams& bp) {
    const HParams& hp = model.hp;
    MINFER_ASSERT(bp.n_tokens >= 1 && bp.n_out >= 1 && bp.n_out <= bp.n_tokens);
    Graph g;
    Builder b{g, hp};
    const int64_t n = bp.n_tokens;

    const NodeId token_ids = g.add_input("token_ids", n);  // [n]
    const NodeId positions = g.add_input("positions", n);  // [n]
    const bool select_tail = bp.n_out < n;
    const NodeId tail_ids = select_tail ? g.add_input("tail_ids", bp.n_out) : -1;  // [n_out]
    const bool paged = bp.kv_page > 0;
    if (paged) MINFER_ASSERT(bp.n_ctx % bp.kv_page == 0 && bp.n_seqs >= 1);
    // [n] the cell each token's K/V row goes to; [n] its sequence's page-table
    // row; [n_seqs, pages_per_seq] the page tables
    const NodeId kv_cells = paged ? g.add_input("kv_cells", n) : -1;
    const NodeId kv_rows = paged ? g.add_input("kv_rows", n) : -1;
    const NodeId kv_pages =
        paged ? g.add_input("kv_pages", bp.n_seqs * (bp.n_ctx / bp.kv_page)) : -1;

    NodeId h = b.add(Op::GetRows, "token_embd", hp.n_embd, n, {token_ids}, {model.tok_embd});
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const LayerWeights& L = model.layers[static_cast<size_t>(il)];
        b.layer = static_cast<int32_t>(il);
        const bool last = il == hp.n_layer - 1;

        NodeId x = b.norm(h, L.attn_norm, "attn_norm");  // [n_embd, n]
        NodeId q = b.matmul(x, L.wq, "q");               // [n_embd_q, n]
        NodeId k = b.matmul(x, L.wk, "k");               // [n_embd_kv, n]
        NodeId v = b.matmul(x, L.wv, "v");               // [n_embd_kv, n]
        if (hp.qkv_bias()) {
            q = b.add(Op::AddBias, "q_bias", b.width(q), n, {q}, {L.bq});
            k = b.add(Op::AddBias, "k_bias", b.width(k), n, {k}, {L.bk});
            v = b.add(Op::AddBias, "v_bias", b.width(v), n, {v}, {L.bv});
        } else {
            q = b.add(Op::HeadNorm, "q_norm", b.width(q), n, {q}, {L.q_norm});
            k = b.add(Op::HeadNorm, "k_norm", b.width(k), n, {k}, {L.k_norm});
        }
        q = b.add(Op::Rope, "q_rope", b.width(q), n, {q, positions});
        k = b.add(Op::Rope, "k_rope", b.width(k), n, {k, positions});
        // The store's shape mirrors the persistent region so the allocator can size it.
        std::vector<NodeId> store_src{k, v, positions}, attn_src;
        if (paged) store_src.push_back(kv_cells);
        NodeId store = b.add(Op::KvStore, "kv_store", hp.n_embd_kv(), bp.n_ctx, store_src);
        g.node(store).type = bp.kv_type;
        attn_src = {q, store, positions};
        if (paged) attn_src.insert(attn_src.end(), {kv_rows, kv_pages});
        NodeId attn = b.add(Op::Attn, "attn", hp.n_embd_q(), n, attn_src);
        for (NodeId id : {store, attn}) {
            g.node(id).meta.n_ctx = bp.n_ctx;
            g.node(id).meta.kv_type = bp.kv_type;
            g.node(id).meta.kv_page = bp.kv_page;
        }
        NodeId o = b.matmul(attn, L.wo, "attn_out");  // [n_embd, n]
        if (last && select_tail) {
            // Only the rows that get logits go on: the last layer's FFN and the
            // output head run on n_out rows instead of n (llama.cpp's inp_out_ids).
            o = b.add(Op::SelectRows, "attn_out_tail", hp.n_embd, bp.n_out, {o, tail_ids});
            h = b.add(Op::SelectRows, "residual_tail", hp.n_embd, bp.n_out, {h, tail_ids});
        }
        h = b.add(Op::Add, "attn_residual", hp.n_embd, b.rows(o), {h, o});

        x = b.norm(h, L.ffn_norm, "ffn_norm");
        NodeId down =
            hp.moe() ? b.moe_ffn(x, L) : b.swiglu_ffn(x, L.w_gate, L.w_up, L.w_down, "ffn_");
        h = b.add(Op::Add, "ffn_residual", hp.n_embd, b.rows(down), {h, down});
    }
    b.layer = -1;
    NodeId x = b.norm(h, model.output_norm, "output_norm");  // [n_embd, n_out]
    NodeId logits = b.matmul(x, model.output, "logits");     // [n_vocab, n_out]
    g.outputs.push_back(logits);
    return g;
}

}  // namespace minfer::model
