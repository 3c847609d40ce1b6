// The model runner: the one pass path of Session and Engine (ARCHITECTURE.md
// "One decode step"): the graph of a pass reused from the cache, else built,
// assigned, fused and allocated; its inputs filled by name; executed; its
// logits rows read. It owns the backends and the graph cache (and so the
// persistent KV regions, the allocator's). It knows token counts, not
// sequences: which sequence a token belongs to reaches the graph as inputs.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "graph/assign.h"
#include "graph/cache.h"
#include "graph/scheduler.h"
#include "ir/backend.h"
#include "model/model.h"

namespace minfer::runtime {

struct RunnerOptions {
    int32_t n_threads = 1;
    bool batch_invariant = false;
    graph::Planner planner = graph::Planner::Classes;
    // Layers [queue_first_layer, queue_end_layer) on the queue backend
    // (empty range: none, and no queue backend made).
    int32_t queue_first_layer = 0, queue_end_layer = 0;
    // Graphs kept at once (least recently used evicted first); 0: unbounded.
    size_t max_graphs = 0;
};

class ModelRunner {
  public:
    // cparams.layer_backend is set here when a queue backend is made.
    ModelRunner(const model::Model& model, const RunnerOptions& options, graph::CParams cparams);
    ~ModelRunner();

    // The graph for a pass of `params` (its cparams are the runner's):
    // reused from the cache when its parameters match, else built for
    // `n_seqs` page-table rows, assigned, fused and allocated. *rebuilt
    // (when given) tells which.
    graph::Graph& prepare(graph::GraphParams params, bool* rebuilt = nullptr);
    // Fills a named input of a prepared graph.
    void fill(graph::Graph& g, std::string_view name, std::span<const int32_t> values);
    void execute(graph::Graph& g);
    // n_rows logits rows from `first_row` of the graph's output into dst
    // ([n_vocab, n_rows]).
    void read_logits(const graph::Graph& g, int64_t first_row, int64_t n_rows, float* dst);

    const graph::CParams& cparams() const { return cparams_; }
    graph::GraphAllocator& allocator() { return cache_->allocator(); }
    graph::Scheduler& scheduler() { return scheduler_; }
    backend::Backend* cpu() const { return cpu_.get(); }
    // Buffers the backends allocated so far (the memory report's reuse counter).
    size_t pool_allocations() const;
    // Activation bytes of the plans of the graphs kept now.
    size_t plan_bytes() const;
    int64_t graphs_built() const { return graphs_built_; }

  private:
    const model::Model& model_;
    std::unique_ptr<backend::Backend> cpu_;
    std::unique_ptr<backend::Backend> queue_;  // only with queue layers
    std::vector<backend::Backend*> backends_;
    std::unique_ptr<graph::GraphCache> cache_;
    graph::Scheduler scheduler_;
    graph::CParams cparams_;
    graph::Placement placement_;
    size_t max_graphs_ = 0;
    std::map<int, uint64_t> graph_used_;  // kind -> last use
    std::map<int, size_t> plan_bytes_;    // kind -> activation bytes of its plan
    uint64_t tick_ = 0;
    int64_t graphs_built_ = 0;
};

}  // namespace minfer::runtime
