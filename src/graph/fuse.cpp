#include "graph/fuse.h"

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace minfer::graph {

namespace {

// "blk.3.ffn_mul" -> "blk.3.ffn_swiglu": a fused node keeps its layer's name.
void rename_part(Node& n, std::string_view from, std::string_view to) {
    if (auto p = n.name.find(from); p != std::string::npos) n.name.replace(p, from.size(), to);
}

// silu(gate) * up, where gate and up are matmuls of one input and one
// weight shape (dense MatMuls, or the experts' MatMulIds over the same rows
// and group), as one MatMulSwiGLU / MatMulIdSwiGLU: the input is quantized
// once, and each tile of gate and up rows meets the SwiGLU while it is still
// in cache instead of both whole outputs going to memory and back.
bool fuse_matmul_swiglu(Graph& g, Node& mul, const Node& act) {
    const Node& gate = g.node(act.src[0]);
    const Node& up = g.node(mul.src[1]);
    const bool experts = gate.op == Op::MatMulId;
    if ((gate.op != Op::MatMul && !experts) || up.op != gate.op || gate.src != up.src) return false;
    if (gate.backend != mul.backend || up.backend != mul.backend) return false;
    const tensor::TensorView* wg = gate.weights.at(0);
    const tensor::TensorView* wu = up.weights.at(0);
    if (wg == nullptr || wu == nullptr || wg->ne != wu->ne) return false;
    // The experts' kernel reads both slices through one path.
    if (experts && (wg->type != wu->type || wg->layout != wu->layout)) return false;
    mul.op = experts ? Op::MatMulIdSwiGLU : Op::MatMulSwiGLU;
    mul.src = gate.src;
    mul.weights = {wg, wu};
    mul.fused = true;
    if (experts)
        rename_part(mul, "ffn_moe_mul", "ffn_moe_swiglu");
    else
        rename_part(mul, "ffn_mul", "ffn_swiglu");
    return true;
}

// silu(gate) * up -> MatMulSwiGLU or MatMulIdSwiGLU when both are matmuls of
// one input, else SwiGLU(gate, up); the Silu (and the two matmuls) are
// orphaned.
int fuse_ffn(Graph& g) {
    int made = 0;
    for (auto& n : g.nodes) {
        if (n.op != Op::Mul || n.src.size() != 2) continue;
        const Node& act = g.node(n.src[0]);
        if (act.op != Op::Silu || act.backend != n.backend) continue;
        if (fuse_matmul_swiglu(g, n, act)) {
            ++made;
            continue;
        }
        n.op = Op::SwiGLU;
        n.src = {act.src[0], n.src[1]};
        n.fused = true;
        rename_part(n, "ffn_mul", "ffn_swiglu");
        ++made;
    }
    return made;
}

// One layer's chain
//   q = MatMul(x, wq) -> AddBias | HeadNorm -> Rope ---------------------> Attn.src0
//   k = MatMul(x, wk) -> AddBias | HeadNorm -> Rope -> KvStore(k, v, pos) -> Attn.src1
//   v = MatMul(x, wv) [-> AddBias] -------------------^
// becomes
//   qkv = FusedQKV(x; wq, wk, wv) -> QkvBiasRopeStore(qkv, pos) -> Attn.src0 and src1
// The epilogue takes the q-Rope's place in build order, so it still runs
// after every projection and before attention.
bool fuse_qkv_layer(Graph& g, NodeId attn_id) {
    Node& attn = g.node(attn_id);
    if (attn.src.size() != 3 && attn.src.size() != 5) return false;
    const NodeId q_rope = attn.src[0], store = attn.src[1], positions = attn.src[2];
    if (g.node(q_rope).op != Op::Rope || g.node(store).op != Op::KvStore) return false;
    const Node& st = g.node(store);
    // Paged KV: the store's cells input and attention's page tables move along.
    if ((st.src.size() == 4) != (attn.src.size() == 5)) return false;
    const std::vector<NodeId> page_src(attn.src.begin() + 3, attn.src.end());
    const NodeId kv_cells = st.src.size() == 4 ? st.src[3] : -1;
    const NodeId k_rope = st.src[0];
    NodeId v_last = st.src[1];
    if (g.node(k_rope).op != Op::Rope) return false;
    const NodeId q_pre = g.node(q_rope).src[0], k_pre = g.node(k_rope).src[0];
    const Op pre = g.node(q_pre).op;
    if ((pre != Op::AddBias && pre != Op::HeadNorm) || g.node(k_pre).op != pre) return false;
    const NodeId mq = g.node(q_pre).src[0], mk = g.node(k_pre).src[0];
    std::vector<const tensor::TensorView*> epilogue_w;
    NodeId mv = v_last;
    if (pre == Op::AddBias) {
        if (g.node(v_last).op != Op::AddBias) return false;
        mv = g.node(v_last).src[0];
        epilogue_w = {g.node(q_pre).weights[0], g.node(k_pre).weights[0],
                      g.node(v_last).weights[0]};
    } else {
        epilogue_w = {g.node(q_pre).weights[0], g.node(k_pre).weights[0]};
    }
    for (NodeId m : {mq, mk, mv})
        if (g.node(m).op != Op::MatMul) return false;
    const NodeId x = g.node(mq).src[0];
    if (g.node(mk).src[0] != x || g.node(mv).src[0] != x) return false;
    const BackendId be = attn.backend;
    for (NodeId id : {q_rope, store, k_rope, q_pre, k_pre, mq, mk, mv, v_last})
        if (g.node(id).backend != be) return false;

    Node& fq = g.node(mq);
    const int64_t n_q = fq.ne[0], n_kv = g.node(mk).ne[0];
    fq.op = Op::FusedQKV;
    fq.weights = {g.node(mq).weights[0], g.node(mk).weights[0], g.node(mv).weights[0]};
    fq.ne[0] = n_q + 2 * n_kv;  // [q | k | v, n]
    fq.meta.n_ctx = st.meta.n_ctx;
    fq.meta.kv_type = st.meta.kv_type;
    fq.fused = true;
    fq.name = "qkv." + std::to_string(fq.meta.layer);

    Node& ep = g.node(q_rope);
    ep.op = Op::QkvBiasRopeStore;
    ep.src = {mq, positions};
    if (kv_cells >= 0) ep.src.push_back(kv_cells);
    ep.weights = epilogue_w;
    ep.ne = g.node(mq).ne;
    ep.meta.n_ctx = st.meta.n_ctx;
    ep.meta.kv_type = st.meta.kv_type;
    ep.meta.kv_page = st.meta.kv_page;
    ep.fused = true;
    ep.name = "qkv_epilogue." + std::to_string(ep.meta.layer);

    // Attention reads q from the epilogue's output (columns [0, n_q)); wiring
    // both sources to it keeps the projection buffer's consumer count at one,
    // so the epilogue may run in place (the alias rule).
    g.node(attn_id).src = {q_rope, q_rope, positions};
    for (NodeId s : page_src) g.node(attn_id).src.push_back(s);
    return true;
}

}  // namespace

int eliminate_dead(Graph& g) {
    std::vector<char> live(g.size(), 0);
    std::vector<NodeId> stack(g.outputs.begin(), g.outputs.end());
    while (!stack.empty()) {
        NodeId id = stack.back();
        stack.pop_back();
        if (live[static_cast<size_t>(id)]) continue;
        live[static_cast<size_t>(id)] = 1;
        for (NodeId s : g.node(id).src) stack.push_back(s);
    }
    for (NodeId id : g.inputs) live[static_cast<size_t>(id)] = 1;
    int dead = 0;
    for (size_t i = 0; i < g.size(); ++i) {
        if (live[i]) continue;
        g.nodes[i].src.clear();
        ++dead;
    }
    return dead;
}

FuseStats fuse(Graph& g, const FuseOptions& opt) {
    FuseStats s;
    if (opt.ffn) s.ffn = fuse_ffn(g);
    if (opt.qkv) {
        for (size_t i = 0; i < g.size(); ++i)
            if (g.nodes[i].op == Op::Attn && fuse_qkv_layer(g, static_cast<NodeId>(i))) ++s.qkv;
    }
    s.dead = eliminate_dead(g);
    return s;
}

}  // namespace minfer::graph
