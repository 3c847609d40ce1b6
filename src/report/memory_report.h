// The memory report (--mem-report): what the allocator holds for every graph
// a session built, against what it would hold naively and against the lower
// bound no planner can beat, plus the run's reuse counters. A recorder
// observes a Session; the bench command and the CLI call the same API:
//
//   report::MemoryRecorder rec(session);   // before the first eval
//   session.eval(...);
//   report::MemoryReport r = rec.report();
//   report::print_text(r, stderr);  report::to_json(r).dump(2);
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "graph/alloc.h"
#include "ir/ir.h"

namespace minfer::runtime {
class Session;
}

namespace minfer::report {

// Build-order live range of every node of the current plan, as the planner
// sees it: [own position, last reader]; inputs and outputs pinned to
// n_nodes; an in-place alias root lives through its aliases' readers.
// last[i] == i for a node nobody reads.
std::vector<size_t> live_until(const graph::Graph& g, const graph::GraphAllocator& alloc);

// Bytes live at each execution position 0..n_nodes-1: every node with a
// buffer (KV regions excluded — they are persistent, not activations) whose
// range [i, last] covers the position; an in-place alias counts once (its
// root carries it).
std::vector<size_t> live_bytes_curve(const graph::Graph& g, const graph::GraphAllocator& alloc);
// max of the curve: no plan of this graph can hold fewer bytes.
size_t lower_bound_bytes(const graph::Graph& g, const graph::GraphAllocator& alloc);

struct GraphMemory {
    std::string kind;  // "prefill" | "decode"
    int64_t n_tokens = 0;
    std::string planner;  // "arena" | "classes"
    size_t n_nodes = 0;
    size_t n_live = 0;
    size_t dead_nodes = 0;
    size_t aliased_nodes = 0;
    size_t n_buffers = 0;
    std::vector<size_t> buffers_per_backend;  // [n_backends]
    std::vector<std::string> backend_names;   // [n_backends]
    size_t pool_bytes = 0;
    size_t naive_bytes = 0;
    size_t lower_bound_bytes = 0;
    size_t staging_buffers = 0;
    double pool_over_lower_bound() const {
        return lower_bound_bytes ? static_cast<double>(pool_bytes) / lower_bound_bytes : 0.0;
    }
};

struct RunMemory {
    int64_t passes = 0;
    int64_t decode_steps = 0;
    int64_t graphs_built = 0;
    // Warm-up = every pass up to and including the first decode step; these
    // count every later pass, prefill or decode.
    int64_t rebuilds_after_first_decode = 0;
    int64_t allocations_after_first_decode = 0;
    size_t activation_bytes_held = 0;           // at the end of the run, every backend
    size_t activation_bytes_at_warmup = 0;      // after the first decode step
    size_t activation_growth_after_warmup = 0;  // peak held after warm-up minus held at it
    size_t largest_plan_bytes = 0;              // the largest plan (held can be no less)
    size_t arena_growths = 0;                   // times a shared arena was made larger
    int64_t n_layer = 0;
    size_t kv_bytes = 0;              // K and V regions of every layer
    size_t kv_bytes_per_layer = 0;    // K + V of one layer
    size_t weight_bytes = 0;          // every tensor of the file
    bool weights_moved = false;       // out of the mapped file into anonymous memory
    size_t regrouped_bytes = 0;       // of those, interleaved 16 rows at a time
    size_t kernel_scratch_bytes = 0;  // the CPU kernels' scratch (thread pool), peak
    // The KV regions as pages (graph/kv_pages.h): how many, of how many
    // cells, and how many the session's one sequence holds (pages 0..n-1).
    int64_t kv_pages = 0, kv_page_cells = 0, kv_pages_held = 0;
};

struct MemoryReport {
    std::vector<GraphMemory> graphs;  // in the order they were built
    RunMemory run;
};

// Figures of the allocator's CURRENT plan, which must be `g`'s.
GraphMemory describe_graph(const graph::Graph& g, const graph::GraphAllocator& alloc,
                           std::string kind, int64_t n_tokens);

// Observes a session from construction on: one GraphMemory per graph built
// (taken after its first execute, so staging counts are final). The session
// must outlive the recorder; recorders never detach (sessions are short).
class MemoryRecorder {
  public:
    explicit MemoryRecorder(runtime::Session& session);
    MemoryReport report() const;
    const std::vector<GraphMemory>& graphs() const { return *graphs_; }

  private:
    runtime::Session& session_;
    std::shared_ptr<std::vector<GraphMemory>> graphs_;
};

void print_text(const MemoryReport& r, std::FILE* out);
nlohmann::json to_json(const MemoryReport& r);
nlohmann::json to_json(const GraphMemory& g);

// "1.50 MiB"
std::string format_bytes(size_t bytes);

}  // namespace minfer::report
