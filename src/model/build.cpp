// Qwen2 and Qwen3 share one decoder layer; they differ in the Q/K/V
// epilogue (biases vs. per-head RMSNorm). Every node carries the layer it
// belongs to, so that assignment can place whole layers on a backend.
#include "model/build.h"

#include <string>

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
    NodeId matmul(NodeId x, const TensorView* w, const char* name) {
        return add(Op::MatMul, name, w->ne[1], rows(x), {x}, {w});
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
        if (hp.arch == Arch::Qwen2) {
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
        NodeId gate = b.matmul(x, L.w_gate, "ffn_gate");  // [n_ff, rows]
        NodeId up = b.matmul(x, L.w_up, "ffn_up");        // [n_ff, rows]
        NodeId act = b.add(Op::Silu, "ffn_silu", hp.n_ff, b.rows(gate), {gate});
        NodeId prod = b.add(Op::Mul, "ffn_mul", hp.n_ff, b.rows(gate), {act, up});
        NodeId down = b.matmul(prod, L.w_down, "ffn_down");  // [n_embd, rows]
        h = b.add(Op::Add, "ffn_residual", hp.n_embd, b.rows(down), {h, down});
    }
    b.layer = -1;
    NodeId x = b.norm(h, model.output_norm, "output_norm");  // [n_embd, n_out]
    NodeId logits = b.matmul(x, model.output, "logits");     // [n_vocab, n_out]
    g.outputs.push_back(logits);
    return g;
}

}  // namespace minfer::model
