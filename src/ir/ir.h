// The compute graph of one forward pass: nodes in build order (every source
// is built before its consumers), ggml shapes, readable names. A pure data
// structure: no memory, no kernels. The allocator decides where each node's
// output lives; the scheduler runs the nodes in build order.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/tensor_view.h"

namespace minfer::graph {

using NodeId = int32_t;
using BackendId = int32_t;  // index into the backend list; 0 is the CPU
constexpr BackendId kNoBackend = -1;

// Shapes below are ggml order, [ne0, ne1]: ne0 is the row length, ne1 the
// number of tokens (rows). n = tokens in this pass.
enum class Op : uint8_t {
    Input,    // host-filled I32 data: token_ids / positions / tail_ids   [n]
    GetRows,  // embedding: weights[0] table [n_embd, n_vocab] (any dtype), src0 ids -> [n_embd, n]
    SelectRows,    // src0 [ne0, n], src1 row ids (I32) -> [ne0, n_ids]  (tail rows for logits)
    RmsNorm,       // src0 [ne0, n], weights[0] [ne0] f32, meta.eps -> [ne0, n]
    MatMul,        // src0 [K, n] f32 activations, weights[0] [K, M] any dtype -> [M, n]
    Add,           // src0 + src1, same shape
    AddBias,       // src0 [ne0, n] + weights[0] [ne0] broadcast over rows
    Mul,           // src0 * src1, same shape
    Silu,          // silu(src0); may run in place
    SwiGLU,        // silu(src0) * src1 (fusion of Mul(Silu(gate), up))
    MatMulSwiGLU,  // fusion of SwiGLU(MatMul gate, MatMul up) over the same src0 [K, n]:
                   // weights gate and up, both [K, M] -> [M, n] silu(x gate) * (x up)
    HeadNorm,      // per-head RMSNorm: src0 [head_dim * heads, n], weights[0] [head_dim]
    Rope,          // NEOX RoPE: src0 [head_dim * heads, n], src1 positions; may run in place
    KvStore,       // src0 k [n_kv_embd, n], src1 v [n_kv_embd, n], src2 positions, optional
                   // src3 kv_cells [n]: writes token i's rows into cell kv_cells[i] (without
                   // src3: cell = position; -1: a padding token, nothing stored) of the
                   // layer's K and V regions. Shape
                   // [n_kv_embd, n_ctx] mirrors the persistent region; its buffer *is* the
                   // K region. Cells: ir/kv_layout.h (n_ctx whole K blocks).
    Attn,          // causal GQA: src0 q rows (q in columns [0, n_head*head_dim)),
                   // src1 the layer's KvStore or QkvBiasRopeStore (ordering), src2 positions,
                   // optional src3 kv_rows [n] and src4 kv_pages [n_seqs * pages_per_seq]
                   // (meta.kv_page > 0): token t reads positions 0..pos[t] of its sequence,
                   // position p at cell kv_pages[kv_rows[t] * pages_per_seq + p / P] * P +
                   // p % P (P = meta.kv_page). Without them cell = position.
                   // -> [n_head*head_dim, n]
    FusedQKV,      // src0 x [n_embd, n], weights wq, wk, wv -> [n_q + 2*n_kv_embd, n] (q | k | v)
    QkvBiasRopeStore,  // the epilogue: src0 FusedQKV output, src1 positions, optional src2
                       // kv_cells (as KvStore's src3); weights
                       // (bq, bk, bv) for qwen2 or (q_norm, k_norm) for qwen3. Adds biases
                       // or applies the per-head norm, ropes q and k, stores k and v in the
                       // layer's regions; output = src0's shape (runs in place).
    // Mixture of experts (ir/moe_layout.h). k = experts per token, slots
    // = k * n (slot t * k + j: token t's j-th choice).
    Softmax,         // each row of src0 [ne0, n] (ggml_soft_max: exp in float, the sum in double)
    TopK,            // src0 [n_expert, n] -> I32 [k, n]: each row's k largest, largest first,
                     // ties in the order of ggml's descending argsort (std::sort)
    MoeWeights,      // src0 probs [n_expert, n], src1 TopK [k, n] -> [k, n] the chosen probs;
                     // meta.moe_norm: divided by their sum (as llama.cpp's norm_w)
    MoeGroup,        // src0 TopK [k, n] -> I32 [moe_group_size(n_expert, slots)]: the slots
                     // grouped by expert, tokens in order within an expert (meta.n_expert)
    MoeGather,       // src0 x [K, n], src1 MoeGroup -> [K, slots]: row g = x row of the
                     // token of grouped slot g (each expert's rows contiguous)
    MatMulId,        // src0 [K, slots] grouped rows, src1 MoeGroup; weights[0] [K, M, n_expert]
                     // -> [M, slots] grouped: every expert some slot chose multiplies its
                     // rows by its 2-D slice; the others are not read
    MatMulIdSwiGLU,  // fusion of SwiGLU(MatMulId gate, MatMulId up) over the same rows:
                     // weights gate [K, M, n_expert] and up (same shape and type) -> [M, slots]
    MoeSum,          // src0 [ne0, slots] grouped, src1 MoeWeights [k, n], src2 MoeGroup
                     // -> [ne0, n]: sum over j of w[t, j] * the row of slot t * k + j
    SigmoidScale,    // src0 [ne0, n], src1 [1, n] -> src0 row t * sigmoid(src1[t])
};
std::string_view op_name(Op op);

// Per-op parameters; fields an op does not use stay at their defaults.
struct NodeMeta {
    int32_t layer = -1;
    float eps = 0.0f;       // RmsNorm, HeadNorm, epilogue's q/k norm
    int32_t n_head = 0;     // query heads
    int32_t n_head_kv = 0;  // key/value heads
    int32_t head_dim = 0;
    float rope_freq_base = 10000.0f;
    int64_t n_ctx = 0;    // KV region rows = cells (KvStore, Attn, FusedQKV, epilogue)
    int32_t kv_page = 0;  // cells per KV page (Attn with page tables); n_ctx is a multiple
    tensor::DType kv_type = tensor::DType::F32;  // element type of the KV regions
    int32_t n_expert = 0;                        // MoeGroup: experts of the layer
    bool moe_norm = false;                       // MoeWeights: renormalize the k weights to sum 1
};

struct Node {
    Op op = Op::Input;
    std::string name;                         // "attn_norm.3", "token_ids"
    tensor::DType type = tensor::DType::F32;  // of the output: F32, or I32 for inputs
    std::array<int64_t, 4> ne{1, 1, 1, 1};
    std::vector<NodeId> src;
    std::vector<const tensor::TensorView*> weights;  // owned by the model; may hold nullptr
    NodeMeta meta;
    BackendId backend = kNoBackend;  // set by assignment
    bool fused = false;              // produced by the fusion pass

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    size_t nbytes() const;  // of the output
};

struct Graph {
    std::vector<Node> nodes;      // build order == execution order
    std::vector<NodeId> inputs;   // Input nodes, filled on the host before execution
    std::vector<NodeId> outputs;  // read on the host after execution (logits)
    // Identity (the design's graph.uid): fresh for every graph constructed or
    // copied, kept by a move (the cache takes its graphs by move). The
    // allocator records the uid of the graph a plan was made for.
    uint64_t uid = next_uid();

    Graph() = default;
    Graph(const Graph& o) : nodes(o.nodes), inputs(o.inputs), outputs(o.outputs) {}
    Graph& operator=(const Graph& o) {
        nodes = o.nodes;
        inputs = o.inputs;
        outputs = o.outputs;
        uid = next_uid();
        return *this;
    }
    Graph(Graph&&) noexcept = default;
    Graph& operator=(Graph&&) noexcept = default;
    static uint64_t next_uid();  // 1, 2, 3, ... process-wide, thread-safe

    NodeId add(Node n);                             // appends, returns the id
    NodeId add_input(std::string name, int64_t n);  // an I32 Input node, registered in inputs
    const Node& node(NodeId id) const { return nodes.at(static_cast<size_t>(id)); }
    Node& node(NodeId id) { return nodes.at(static_cast<size_t>(id)); }
    size_t size() const { return nodes.size(); }
    NodeId find(std::string_view name) const;  // -1 when absent
    // Kahn topological order; throws minfer::Error naming a node on a cycle
    // or a source id out of range. The allocator calls it only to validate.
    std::vector<NodeId> topo_order() const;
    // Consumers per node (how many src entries name it).
    std::vector<int32_t> n_consumers() const;
};

}  // namespace minfer::graph
