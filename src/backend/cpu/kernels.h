// CPU kernels: one entry point that runs a graph node on host memory, and
// the individual kernels it dispatches to (each tested against a scalar
// reference in tests/). Knows ops and dtypes, never model architectures.
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "ir/ir.h"
#include "util/thread_pool.h"

namespace minfer::cpu {

// Host pointers for one node, already resolved from its buffers.
struct NodeData {
    std::vector<const void*> src;  // one per node.src, at the start of the window
    void* out = nullptr;
    void* k = nullptr;  // the layer's K region [n_kv_embd, n_ctx] (KV ops only)
    void* v = nullptr;  // the layer's V region
    // ne of each node.src[i] (ggml order). Needed by Attn (the row stride of
    // q: the fused path passes whole q|k|v rows), KvStore (the number of
    // tokens: the node's own shape mirrors the KV region) and SelectRows
    // (bounds of the row ids); the other ops only use node.ne.
    std::vector<std::array<int64_t, 4>> src_ne;
    // Matmuls take the GEMM path at every token count (cpu::matmul's
    // batch_invariant): the backend's option, not a property of the node.
    bool batch_invariant = false;
};

// Runs node on the pool's threads. Throws minfer::Error for a data error a
// user can cause (a position >= n_ctx, a token id >= n_vocab).
void run_node(const graph::Node& node, const NodeData& data, ThreadPool& pool);

}  // namespace minfer::cpu
