// Forward-pass observability (design doc §4): the graph as data. A record of
// one built graph — every node in build order with its op, shape, backend,
// buffer window, live range and flags; the buffers of its plan (arena or
// size-class buffers, KV regions, staging); the bytes live per position —
// serves --dump-graph (text), --dump-graph-json, MINFER_TRACE (with value
// statistics per node) and the visual page.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graph/alloc.h"
#include "ir/ir.h"

namespace minfer::report {

// Summary of a node's output values (read after the node executed).
struct ValueStats {
    size_t count = 0;
    double min = 0, max = 0, mean = 0;
    size_t nan = 0, inf = 0;
};
ValueStats value_stats(const float* x, size_t n);
ValueStats value_stats_i32(const int32_t* x, size_t n);
nlohmann::json to_json(const ValueStats& s);

// The record of `g` under alloc's CURRENT plan (which must be g's). Fields:
// kind, n_tokens, planner, n_nodes, backends[], nodes[] {id, name, op, type,
// shape[4], backend, layer, buffer {backend, id, offset, len} | null,
// live [first, last], aliased, dead, fused, input, output, kv}, buffers[]
// {backend, id, bytes, kind: arena|pool|kv|staging, name}, curve[] (bytes
// live per position), lower_bound_bytes, pool_bytes.
nlohmann::json graph_record(const graph::Graph& g, const graph::GraphAllocator& alloc,
                            const std::string& kind, int64_t n_tokens);

// One line per node, build order, for a person (--dump-graph).
void print_graph_record(const nlohmann::json& record, std::FILE* out);

}  // namespace minfer::report
