#include "graph/scheduler.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "util/error.h"

namespace minfer::graph {

std::vector<Split> make_splits(const Graph& graph, const GraphAllocator& alloc) {
    std::vector<Split> splits;
    for (size_t i = 0; i < graph.size(); ++i) {
        const Node& node = graph.nodes[i];
        const NodeId id = static_cast<NodeId>(i);
        if (node.op == Op::Input || !alloc.node_buffer(id)) continue;
        const BackendId b = node_backend(node);
        if (splits.empty() || splits.back().backend != b) splits.push_back(Split{b, {}});
        splits.back().nodes.push_back(id);
    }
    return splits;
}

namespace {

bool uses_kv(Op op) {
    return op == Op::KvStore || op == Op::Attn || op == Op::FusedQKV || op == Op::QkvBiasRopeStore;
}

void run_splits(const Graph& graph, GraphAllocator& alloc, const std::vector<Split>& splits,
                std::vector<bool>& dirty, SchedStats& stats, const Scheduler::NodeHook& hook) {
    std::vector<uint8_t> tmp;
    std::vector<BufRef> srcs;
    std::vector<std::array<int64_t, 4>> src_ne;
    for (const Split& split : splits) {
        const BackendId b = split.backend;
        backend::Backend& be = alloc.backend(b);

        // Split boundary: every source living on another backend is copied
        // into this backend's staging buffer for it.
        std::vector<NodeId> crossed;
        for (NodeId id : split.nodes)
            for (NodeId s : graph.node(id).src) {
                const auto ref = alloc.node_buffer(s);
                MINFER_ASSERT_MSG(ref.has_value(), "a live node reads a bufferless node");
                if (ref->backend != b &&
                    std::find(crossed.begin(), crossed.end(), s) == crossed.end())
                    crossed.push_back(s);
            }
        if (!crossed.empty()) {
            // Producers first: a host read of a buffer whose kernel is still
            // queued would read stale memory (the Phase-3 KV bug). This
            // backend too: its queue may still run an earlier split while we
            // write into its pool.
            for (NodeId s : crossed) {
                const BackendId a = alloc.node_buffer(s)->backend;
                if (dirty[static_cast<size_t>(a)]) {
                    alloc.backend(a).synchronize();
                    dirty[static_cast<size_t>(a)] = false;
                }
            }
            if (dirty[static_cast<size_t>(b)]) {
                be.synchronize();
                dirty[static_cast<size_t>(b)] = false;
            }
            for (NodeId s : crossed) {
                const BufRef from = *alloc.node_buffer(s);
                const BufRef to = alloc.cross_staging(s, b);
                tmp.resize(from.len);
                alloc.backend(from.backend).read_host(from, tmp.data(), from.len);
                be.write_host(to, tmp.data(), from.len);
                ++stats.copies;
                stats.copy_bytes += from.len;
            }
        }

        for (NodeId id : split.nodes) {
            const Node& node = graph.node(id);
            srcs.clear();
            src_ne.clear();
            for (NodeId s : node.src) {
                src_ne.push_back(graph.node(s).ne);
                const BufRef ref = *alloc.node_buffer(s);
                srcs.push_back(ref.backend == b ? ref : alloc.cross_staging(s, b));
            }
            std::optional<KvPair> kv;
            if (uses_kv(node.op)) {
                kv = alloc.kv_pair(node.meta.layer);
                MINFER_ASSERT_MSG(kv.has_value(), "KV op without regions (alloc_graph makes them)");
                MINFER_ASSERT_MSG(kv->k.backend == b, "KV regions live on another backend");
            }
            dirty[static_cast<size_t>(b)] = true;
            be.execute_node(node, srcs, *alloc.node_buffer(id), kv ? &*kv : nullptr, src_ne);
            ++stats.nodes_run;
            if (hook) {
                be.submit();
                be.synchronize();
                dirty[static_cast<size_t>(b)] = false;
                hook(graph, id, alloc);
            }
        }
        be.submit();
        ++stats.splits;
    }
}

}  // namespace

void Scheduler::execute(const Graph& graph, GraphAllocator& alloc) {
    const std::vector<Split> splits = make_splits(graph, alloc);
    std::vector<bool> dirty(alloc.n_backends(), false);
    if (node_hook_)
        for (NodeId in : graph.inputs)
            if (alloc.node_buffer(in)) node_hook_(graph, in, alloc);
    try {
        run_splits(graph, alloc, splits, dirty, stats_, node_hook_);
    } catch (...) {
        // Drain every queue before the error leaves: nothing may still be
        // writing into buffers the caller will reuse or read.
        for (size_t i = 0; i < alloc.n_backends(); ++i) {
            try {
                alloc.backend(static_cast<BackendId>(i)).synchronize();
            } catch (...) {
            }
        }
        throw;
    }
    for (size_t i = 0; i < alloc.n_backends(); ++i)
        alloc.backend(static_cast<BackendId>(i)).synchronize();
    ++stats_.executes;
}

}  // namespace minfer::graph
