// Small graph-building helpers and the allocation checker shared by the
// allocator, cache and scheduler tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "graph/alloc.h"
#include "graph/ir.h"

namespace minfer::testing {

using graph::Graph;
using graph::Node;
using graph::NodeId;
using graph::Op;

inline NodeId add_op(Graph& g, Op op, std::string name, std::vector<NodeId> src, int64_t ne0,
                     int64_t ne1 = 1, graph::BackendId backend = graph::kNoBackend) {
    Node n;
    n.op = op;
    n.name = std::move(name);
    n.ne = {ne0, ne1, 1, 1};
    n.src = std::move(src);
    n.backend = backend;
    return g.add(std::move(n));
}

// Build-order live range of every node: [own position, last reader], with
// inputs and outputs pinned to n.
inline std::vector<size_t> build_order_last_use(const Graph& g) {
    const size_t n = g.size();
    std::vector<size_t> lu(n);
    for (size_t i = 0; i < n; ++i) lu[i] = i;
    for (size_t i = 0; i < n; ++i)
        for (NodeId s : g.nodes[i].src) lu[static_cast<size_t>(s)] = std::max(lu[s], i);
    for (NodeId o : g.outputs) lu[static_cast<size_t>(o)] = n;
    for (NodeId in : g.inputs) lu[static_cast<size_t>(in)] = n;
    return lu;
}

// The root of a node's in-place alias chain (itself when not aliased).
inline NodeId alias_root(const Graph& g, const graph::GraphAllocator& a, NodeId id) {
    while (a.is_aliased(id)) id = g.node(id).src[0];
    return id;
}

// The allocator's contract on one graph (the current plan):
//  - every live node (a consumer, an output, an input, a KV writer) has a
//    buffer; dead nodes have none;
//  - no two nodes whose build-order live ranges overlap share bytes of a
//    buffer unless they are in one in-place alias chain;
//  - no liveness buffer is a persistent region;
//  - the plan's bytes (its high-water mark) >= the lower bound: the most
//    bytes live at any one position.
inline void check_allocation(const Graph& g, const graph::GraphAllocator& a) {
    const size_t n = g.size();
    std::vector<size_t> lu = build_order_last_use(g);
    // An alias carries its root's buffer: the root must live through the
    // aliasing node's readers.
    for (size_t i = 0; i < n; ++i) {
        const NodeId id = static_cast<NodeId>(i);
        if (a.node_buffer(id) && a.is_aliased(id)) {
            NodeId r = alias_root(g, a, id);
            lu[static_cast<size_t>(r)] = std::max(lu[static_cast<size_t>(r)], lu[i]);
        }
    }
    std::set<std::pair<int32_t, uint32_t>> persistent;
    for (const auto& p : a.persistent()) persistent.insert({p.ref.backend, p.ref.id});

    for (size_t i = 0; i < n; ++i) {
        const Node& node = g.nodes[i];
        const bool live = lu[i] > i || node.op == Op::KvStore || node.op == Op::QkvBiasRopeStore;
        const auto buf = a.node_buffer(static_cast<NodeId>(i));
        ASSERT_EQ(buf.has_value(), live) << "node " << i << " " << node.name;
        if (!buf) continue;
        EXPECT_EQ(buf->backend, graph::node_backend(node)) << node.name;
        EXPECT_EQ(buf->len, node.nbytes()) << node.name;
        EXPECT_LE(buf->offset + buf->len, a.backend(buf->backend).buffer_bytes(buf->id));
        if (node.op != Op::KvStore) {
            EXPECT_EQ(persistent.count({buf->backend, buf->id}), 0u) << node.name;
        }
    }
    for (size_t i = 0; i < n; ++i) {
        const auto bi = a.node_buffer(static_cast<NodeId>(i));
        if (!bi || g.nodes[i].op == Op::KvStore) continue;
        for (size_t j = i + 1; j < n; ++j) {
            const auto bj = a.node_buffer(static_cast<NodeId>(j));
            if (!bj || !bi->same_buffer(*bj)) continue;
            const bool overlap_bytes =
                bi->offset < bj->offset + bj->len && bj->offset < bi->offset + bi->len;
            const bool overlap_time = j <= lu[i];  // i starts first
            if (!overlap_bytes || !overlap_time) continue;
            EXPECT_EQ(alias_root(g, a, static_cast<NodeId>(i)),
                      alias_root(g, a, static_cast<NodeId>(j)))
                << "nodes " << g.nodes[i].name << " [" << i << "," << lu[i] << "] and "
                << g.nodes[j].name << " [" << j << "," << lu[j] << "] share buffer " << bi->id
                << " while both live";
        }
    }
    size_t lower_bound = 0;
    for (size_t t = 0; t < n; ++t) {
        size_t live_bytes = 0;
        for (size_t i = 0; i <= t; ++i) {
            const auto b = a.node_buffer(static_cast<NodeId>(i));
            if (!b || a.is_aliased(static_cast<NodeId>(i)) || g.nodes[i].op == Op::KvStore)
                continue;
            if (lu[i] >= t) live_bytes += b->len;
        }
        lower_bound = std::max(lower_bound, live_bytes);
    }
    EXPECT_GE(a.plan_stats().pool_bytes, lower_bound);
}

}  // namespace minfer::testing
