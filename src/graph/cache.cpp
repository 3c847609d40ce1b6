#include "graph/cache.h"

namespace minfer::graph {

GraphCache::GraphCache(std::vector<backend::Backend*> backends, Planner planner)
    : alloc_(std::move(backends), planner) {}

Graph* GraphCache::try_reuse(const GraphParams& params) {
    auto it = entries_.find(params.kind);
    if (it == entries_.end() || !(it->second.params == params)) return nullptr;
    alloc_.use_plan(params.kind);
    current_kind_ = params.kind;
    ++reuses_;
    return it->second.graph.get();
}

Graph& GraphCache::replace(const GraphParams& params, Graph graph) {
    auto stored = std::make_unique<Graph>(std::move(graph));
    entries_.erase(params.kind);
    current_kind_ = -1;
    try {
        alloc_.alloc_graph(*stored, params.kind);
    } catch (...) {
        alloc_.release_plan(params.kind);
        throw;
    }
    ++rebuilds_;
    current_kind_ = params.kind;
    Graph& g = *stored;
    entries_[params.kind] = Entry{params, std::move(stored)};
    return g;
}

void GraphCache::evict(int kind) {
    if (entries_.erase(kind) == 0) return;
    alloc_.release_plan(kind);
    if (current_kind_ == kind) current_kind_ = -1;
}

Graph* GraphCache::current() {
    auto it = entries_.find(current_kind_);
    return it == entries_.end() ? nullptr : it->second.graph.get();
}

}  // namespace minfer::graph
