// Small graph-building helpers and the allocation checker (alloc_checker.h)
// shared by the allocator, cache and scheduler tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "alloc_checker.h"
#include "graph/alloc.h"
#include "ir/ir.h"

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

// The planner these tests run under: MINFER_PLANNER, like the session
// (arena by default). CTest runs the allocator, cache, scheduler and forward
// tests a second time with MINFER_PLANNER=classes (the ".classes" tests).
inline graph::Planner test_planner() {
    return graph::planner_from_env();
}

// True when two windows share bytes (same pool buffer, ranges intersect):
// what "do not share" means for the arena planner, whose plan is one buffer.
inline bool overlaps(const graph::BufRef& a, const graph::BufRef& b) {
    return a.same_buffer(b) && a.offset < b.offset + b.len && b.offset < a.offset + a.len;
}

// The root of a node's in-place alias chain as the allocator reports it
// (itself when not aliased). For reports only: check_allocation does not
// trust is_aliased().
inline NodeId alias_root(const Graph& g, const graph::GraphAllocator& a, NodeId id) {
    while (a.is_aliased(id)) id = g.node(id).src[0];
    return id;
}

// The allocator's contract on one graph (see audit_allocation); returns the
// lower bound of the plan's bytes.
inline size_t check_allocation(const Graph& g, const graph::GraphAllocator& a) {
    const AllocAudit audit = audit_allocation(g, a);
    for (const auto& p : audit.problems) ADD_FAILURE() << planner_name(a.planner()) << ": " << p;
    return audit.lower_bound;
}

}  // namespace minfer::testing
