// GraphCache (§2.8): reuse a built graph while the parameters that decide
// its topology are unchanged. n_past is deliberately NOT a parameter:
// positions are data, so every decode step after the first reuses one graph
// and allocates nothing. One graph is cached per kind (prefill, decode), so
// a chat's next turn reuses both. The cache owns the allocator — and so the
// persistent KV regions, which outlive every graph.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "graph/alloc.h"
#include "ir/ir.h"
#include "tensor/dtype.h"

namespace minfer::graph {

// Context parameters that shape the graph.
struct CParams {
    int64_t n_ctx = 0;                     // KV region rows; prefill and decode must agree
    bool fuse_qkv = true;                  // FusedQKV + epilogue instead of three MatMuls
    bool fuse_ffn = true;                  // SwiGLU instead of Silu + Mul
    std::vector<BackendId> layer_backend;  // [n_layer] backend per layer; empty = all on 0
    tensor::DType kv_type = tensor::DType::F32;
    int32_t kv_page = 0;  // cells per KV page (0: unpaged, cell = position)
    bool operator==(const CParams&) const = default;
};

constexpr int kPrefill = 0;
constexpr int kDecode = 1;

struct GraphParams {
    int64_t n_tokens = 0;  // tokens in this pass
    int64_t n_out = 0;     // logits rows asked for
    int64_t n_seqs = 1;    // page-table rows (paged KV): how many sequences a pass may hold
    int kind = kPrefill;   // kPrefill, kDecode, or a caller's key: one cached graph per kind
    CParams cparams;
    uint64_t weights_version = 0;
    bool operator==(const GraphParams&) const = default;
};

class GraphCache {
  public:
    // The backends must outlive the cache.
    explicit GraphCache(std::vector<backend::Backend*> backends,
                        Planner planner = Planner::Classes);

    // The cached graph of params.kind when it was built for equal params:
    // its allocation plan becomes current (nothing is allocated). nullptr
    // when the caller must build a graph and call replace().
    Graph* try_reuse(const GraphParams& params);
    // Store a freshly built (assigned, fused) graph for params.kind,
    // replacing that kind's previous graph, and allocate it. The other
    // kind's graph keeps its buffers. Rethrows the allocator's minfer::Error
    // (the kind is then left without a cached graph).
    Graph& replace(const GraphParams& params, Graph graph);

    // The graph made current by the last try_reuse/replace (nullptr if none).
    Graph* current();
    // Drop a kind's graph and give its plan's buffers back (the engine keeps
    // a bounded set of token-count buckets). No-op for an unknown kind.
    void evict(int kind);
    size_t size() const { return entries_.size(); }
    GraphAllocator& allocator() { return alloc_; }
    const GraphAllocator& allocator() const { return alloc_; }
    size_t rebuilds() const { return rebuilds_; }
    size_t reuses() const { return reuses_; }

  private:
    struct Entry {
        GraphParams params;
        std::unique_ptr<Graph> graph;  // stable address for the caller
    };
    GraphAllocator alloc_;
    std::map<int, Entry> entries_;  // kind -> graph (plan slot = kind)
    int current_kind_ = -1;
    size_t rebuilds_ = 0, reuses_ = 0;
};

}  // namespace minfer::graph
