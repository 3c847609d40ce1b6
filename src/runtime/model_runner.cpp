#include <algorithm>

#include "backend/factory.h"
#include "graph/fuse.h"
#include "model/build.h"
#include "runtime/model_runner_impl.h"
#include "util/error.h"

namespace minfer::runtime {

ModelRunner::ModelRunner(const model::Model& model, const RunnerOptions& o, graph::CParams cparams)
    : model_(model), cparams_(std::move(cparams)), max_graphs_(o.max_graphs) {
    cpu_ = backend::make_cpu_backend(o.n_threads, o.batch_invariant);
    backends_.push_back(cpu_.get());
    if (o.queue_end_layer > o.queue_first_layer) {
        queue_ = backend::make_queue_backend(o.batch_invariant);
        backends_.push_back(queue_.get());
        cparams_.layer_backend.assign(static_cast<size_t>(model.hp.n_layer), 0);
        for (int32_t l = o.queue_first_layer; l < o.queue_end_layer; ++l)
            cparams_.layer_backend[static_cast<size_t>(l)] = 1;
    }
    cache_ = std::make_unique<graph::GraphCache>(backends_, o.planner);
    placement_.first_layer = o.queue_first_layer;
    placement_.end_layer = o.queue_end_layer;
    placement_.backend = 1;
}

ModelRunner::~ModelRunner() = default;

graph::Graph& ModelRunner::prepare(graph::GraphParams params, bool* rebuilt) {
    params.cparams = cparams_;
    graph_used_[params.kind] = ++tick_;
    if (graph::Graph* g = cache_->try_reuse(params)) {
        if (rebuilt) *rebuilt = false;
        return *g;
    }
    // Keep a bounded set of graphs: evict the least recently used.
    while (max_graphs_ > 0 && cache_->size() >= max_graphs_) {
        auto victim =
            std::min_element(graph_used_.begin(), graph_used_.end(),
                             [&](const auto& a, const auto& b) { return a.second < b.second; });
        cache_->evict(victim->first);
        plan_bytes_.erase(victim->first);
        graph_used_.erase(victim);
    }
    model::BuildParams bp;
    bp.n_tokens = params.n_tokens;
    bp.n_out = params.n_out;
    bp.n_ctx = cparams_.n_ctx;
    bp.kv_type = cparams_.kv_type;
    bp.kv_page = cparams_.kv_page;
    bp.n_seqs = params.n_seqs;
    graph::Graph g = model::build_graph(model_, bp);
    graph::assign_backends(g, backends_, placement_);
    graph::fuse(g, {.qkv = cparams_.fuse_qkv, .ffn = cparams_.fuse_ffn});
    graph::Graph& stored = cache_->replace(params, std::move(g));
    plan_bytes_[params.kind] = cache_->allocator().plan_stats().pool_bytes;
    ++graphs_built_;
    if (rebuilt) *rebuilt = true;
    return stored;
}

void ModelRunner::fill(graph::Graph& g, std::string_view name, std::span<const int32_t> values) {
    cache_->allocator().fill_input(g, name, values);
}

void ModelRunner::execute(graph::Graph& g) {
    scheduler_.execute(g, cache_->allocator());
}

void ModelRunner::read_logits(const graph::Graph& g, int64_t first_row, int64_t n_rows,
                              float* dst) {
    graph::GraphAllocator& alloc = cache_->allocator();
    const auto n_vocab = static_cast<size_t>(model_.hp.n_vocab);
    backend::BufRef ref = *alloc.node_buffer(g.outputs.at(0));
    ref.offset += static_cast<size_t>(first_row) * n_vocab * sizeof(float);
    ref.len = static_cast<size_t>(n_rows) * n_vocab * sizeof(float);
    alloc.backend(ref.backend).read_host(ref, dst, ref.len);
}

size_t ModelRunner::pool_allocations() const {
    size_t n = 0;
    for (const backend::Backend* b : backends_) n += b->stats().allocations;
    return n;
}

size_t ModelRunner::plan_bytes() const {
    size_t n = 0;
    for (const auto& [kind, bytes] : plan_bytes_) n += bytes;
    return n;
}

}  // namespace minfer::runtime
