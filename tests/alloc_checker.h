// An allocation checker that does not trust the allocator it checks: which
// nodes may share bytes is derived from the buffers themselves and from the
// in-place rule (sole consumer, same backend, not pinned, not a KV region),
// never from GraphAllocator::is_aliased(). Free of GoogleTest so that the
// fuzz target (fuzz/fuzz_alloc.cpp) runs it too; the tests wrap it in
// check_allocation (graph_helpers.h).
#pragma once

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "graph/alloc.h"
#include "ir/ir.h"

namespace minfer::testing {

// Build-order live range of every node: [own position, last reader], with
// inputs and outputs pinned to n.
inline std::vector<size_t> build_order_last_use(const graph::Graph& g) {
    const size_t n = g.size();
    std::vector<size_t> lu(n);
    for (size_t i = 0; i < n; ++i) lu[i] = i;
    for (size_t i = 0; i < n; ++i)
        for (graph::NodeId s : g.nodes[i].src) lu[static_cast<size_t>(s)] = std::max(lu[s], i);
    for (graph::NodeId o : g.outputs) lu[static_cast<size_t>(o)] = n;
    for (graph::NodeId in : g.inputs) lu[static_cast<size_t>(in)] = n;
    return lu;
}

struct AllocAudit {
    std::vector<std::string> problems;  // empty: the plan keeps the contract
    size_t lower_bound = 0;             // most bytes live at one position (owners only)
    size_t aliased = 0;                 // nodes found in place on their src[0]
};

// The allocator's contract on one graph (the current plan of `a`):
//  - a node has a buffer exactly when it is live (read later, pinned, or a
//    KV writer with sources), on its own backend, of its own length, inside
//    the pool buffer;
//  - a KvStore's buffer is its layer's K region (offset 0); no other node's
//    buffer is a persistent region;
//  - a node shares bytes with its src[0] only as a legal in-place alias:
//    an in-place op (Silu, Rope, QkvBiasRopeStore) at the same offset, on
//    the same backend, src[0] read by nothing else, not an input or an
//    output, not a KV region;
//  - no other two nodes whose live ranges overlap (an alias chain lives as
//    long as its last member) share bytes;
//  - the plan's pool bytes >= the lower bound; is_aliased() and the plan's
//    counts agree with what the buffers show.
inline AllocAudit audit_allocation(const graph::Graph& g, const graph::GraphAllocator& a) {
    using graph::NodeId;
    using graph::Op;
    AllocAudit out;
    auto problem = [&](std::string s) { out.problems.push_back(std::move(s)); };
    auto label = [&](size_t i) {
        return "node " + std::to_string(i) + " '" + g.nodes[i].name + "'";
    };
    const size_t n = g.size();
    std::vector<size_t> lu = build_order_last_use(g);
    std::vector<bool> pinned(n, false);
    for (NodeId o : g.outputs) pinned[static_cast<size_t>(o)] = true;
    for (NodeId in : g.inputs) pinned[static_cast<size_t>(in)] = true;
    std::vector<int> readers(n, 0);
    for (const auto& node : g.nodes)
        for (NodeId s : node.src) ++readers[static_cast<size_t>(s)];

    std::vector<std::optional<graph::BufRef>> buf(n);
    for (size_t i = 0; i < n; ++i) buf[i] = a.node_buffer(static_cast<NodeId>(i));
    std::set<std::pair<int32_t, uint32_t>> persistent;
    for (const auto& p : a.persistent()) persistent.insert({p.ref.backend, p.ref.id});

    size_t dead = 0;
    for (size_t i = 0; i < n; ++i) {
        const graph::Node& node = g.nodes[i];
        const bool kv_writer =
            (node.op == Op::KvStore || node.op == Op::QkvBiasRopeStore) && !node.src.empty();
        const bool live = lu[i] > i || kv_writer;
        if (!live) ++dead;
        if (buf[i].has_value() != live) {
            problem(label(i) + (live ? " is live but has no buffer" : " is dead but has a buffer"));
            buf[i].reset();  // judge the rest without it
            continue;
        }
        if (!buf[i]) continue;
        const graph::BufRef& b = *buf[i];
        if (b.backend != graph::node_backend(node))
            problem(label(i) + " runs on backend " + std::to_string(graph::node_backend(node)) +
                    " but its buffer is on " + std::to_string(b.backend));
        if (b.len != node.nbytes())
            problem(label(i) + " needs " + std::to_string(node.nbytes()) + " bytes, got " +
                    std::to_string(b.len));
        if (b.backend >= 0 && static_cast<size_t>(b.backend) < a.n_backends() &&
            b.offset + b.len > a.backend(b.backend).buffer_bytes(b.id))
            problem(label(i) + " runs past its pool buffer");
        if (node.op == Op::KvStore) {
            const auto kv = a.kv_pair(node.meta.layer);
            if (!kv || !kv->k.same_buffer(b) || b.offset != 0)
                problem(label(i) + " does not write its layer's K region");
            else if (kv->k.len < b.len || kv->v.len < b.len)
                problem(label(i) + "'s KV regions are smaller than the store");
        } else if (persistent.count({b.backend, b.id}) != 0) {
            problem(label(i) + " lives in a persistent KV region");
        }
    }

    // Aliases as the buffers show them, each judged by the in-place rule.
    auto share_bytes = [&](size_t i, size_t j) {
        const auto &bi = *buf[i], &bj = *buf[j];
        return bi.same_buffer(bj) && bi.offset < bj.offset + bj.len &&
               bj.offset < bi.offset + bi.len;
    };
    std::vector<size_t> root(n);
    for (size_t i = 0; i < n; ++i) root[i] = i;
    for (size_t i = 0; i < n; ++i) {
        const graph::Node& node = g.nodes[i];
        bool aliased = false;
        if (buf[i] && !node.src.empty()) {
            const auto s = static_cast<size_t>(node.src[0]);
            if (buf[s] && share_bytes(i, s)) {
                const graph::Node& sn = g.nodes[s];
                std::string why;
                if (node.op != Op::Silu && node.op != Op::Rope && node.op != Op::QkvBiasRopeStore)
                    why = std::string(graph::op_name(node.op)) + " cannot run in place";
                else if (buf[i]->offset != buf[s]->offset)
                    why = "it overlaps its source at another offset";
                else if (graph::node_backend(sn) != graph::node_backend(node))
                    why = "its source runs on another backend";
                else if (readers[s] != 1)
                    why = "its source has " + std::to_string(readers[s]) + " readers";
                else if (pinned[s])
                    why = "its source is a pinned input or output";
                else if (sn.op == Op::KvStore)
                    why = "its source is a KV region";
                if (why.empty())
                    aliased = true;
                else
                    problem(label(i) + " writes into the bytes of its source " + label(s) +
                            " but may not run in place: " + why);
            }
        }
        if (aliased) {
            root[i] = root[static_cast<size_t>(node.src[0])];
            lu[root[i]] = std::max(lu[root[i]], lu[i]);
            ++out.aliased;
        }
        if (buf[i] && a.is_aliased(static_cast<NodeId>(i)) != aliased)
            problem(label(i) + ": is_aliased() says " +
                    (a.is_aliased(static_cast<NodeId>(i)) ? "in place" : "not in place") +
                    ", its buffer says otherwise");
    }
    // Chains are built front to back, so a root's deadline is final only now.
    std::vector<size_t> until(n);
    for (size_t i = 0; i < n; ++i) until[i] = lu[root[i]];

    for (size_t i = 0; i < n; ++i) {
        if (!buf[i] || g.nodes[i].op == Op::KvStore) continue;
        for (size_t j = i + 1; j < n; ++j) {
            if (!buf[j] || g.nodes[j].op == Op::KvStore || root[i] == root[j]) continue;
            if (j > until[i] || !share_bytes(i, j)) continue;  // i starts first
            problem("nodes " + label(i) + " [" + std::to_string(i) + "," +
                    std::to_string(until[i]) + "] and " + label(j) + " [" + std::to_string(j) +
                    "," + std::to_string(until[j]) + "] share bytes of buffer " +
                    std::to_string(buf[i]->id) + " while both live");
        }
    }

    for (size_t t = 0; t < n; ++t) {
        size_t live_bytes = 0;
        for (size_t i = 0; i <= t; ++i)
            if (buf[i] && root[i] == i && g.nodes[i].op != Op::KvStore && until[i] >= t)
                live_bytes += buf[i]->len;
        out.lower_bound = std::max(out.lower_bound, live_bytes);
    }
    const graph::PlanStats& st = a.plan_stats();
    if (st.pool_bytes < out.lower_bound)
        problem("pool bytes " + std::to_string(st.pool_bytes) + " < lower bound " +
                std::to_string(out.lower_bound));
    if (st.aliased_nodes != out.aliased)
        problem("plan reports " + std::to_string(st.aliased_nodes) +
                " aliased nodes, buffers show " + std::to_string(out.aliased));
    if (st.dead_nodes != dead)
        problem("plan reports " + std::to_string(st.dead_nodes) + " dead nodes, there are " +
                std::to_string(dead));
    return out;
}

}  // namespace minfer::testing
