// The scheduler (§2.7, doc 08): a pure orchestrator. It cuts the graph into
// splits (maximal runs of consecutive live nodes on one backend), copies
// every source that lives on another backend into that split's staging
// buffer at the split boundary — after synchronizing the producer, never
// host-copying a pending buffer — runs the split's nodes in build order,
// and submits. All buffers come from the allocator's current plan.
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "graph/alloc.h"
#include "ir/ir.h"

namespace minfer::graph {

struct Split {
    BackendId backend = 0;
    std::vector<NodeId> nodes;  // build order; live, non-Input nodes only
};

// Input nodes (host-filled, nothing to run) and bufferless (dead) nodes are
// left out, so they neither run nor cut a split.
std::vector<Split> make_splits(const Graph& graph, const GraphAllocator& alloc);

struct SchedStats {
    size_t executes = 0;
    size_t splits = 0;  // summed over executes
    size_t copies = 0;  // cross-backend staging copies, summed
    size_t copy_bytes = 0;
    size_t nodes_run = 0;
};

class Scheduler {
  public:
    // Runs `graph` through `alloc`'s current plan (alloc_graph or the cache
    // made it current; inputs already filled) on alloc's backends, and
    // returns when every backend has finished. Kernel errors
    // (minfer::Error) propagate after all backends are drained.
    void execute(const Graph& graph, GraphAllocator& alloc);
    const SchedStats& stats() const { return stats_; }

    // A debug hook (MINFER_TRACE): called after each node has executed and
    // its backend has been synchronized, so the hook may read the node's
    // output through alloc; also called for every Input node (already
    // filled) before the first split. Slow: one sync per node.
    using NodeHook = std::function<void(const Graph&, NodeId, GraphAllocator&)>;
    void set_node_hook(NodeHook hook) { node_hook_ = std::move(hook); }

  private:
    SchedStats stats_;
    NodeHook node_hook_;
};

}  // namespace minfer::graph
