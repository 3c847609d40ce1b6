// One sequence on the model runner (runtime/model_runner_impl.h): its pages
// in order (the page table is the identity), each pass's inputs filled by
// name, the memory report's counters kept per pass.
#include "runtime/session.h"

#include <algorithm>

#include "backend/factory.h"
#include "graph/cache.h"
#include "graph/kv_pages.h"
#include "runtime/session_impl.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace minfer::runtime {

Session::Session(const model::Model& model, SessionOptions options)
    : model_(model), options_(std::move(options)) {
    if (options_.n_ctx < 1) throw Error("the context size must be at least 1");
    if (options_.n_batch < 1) throw Error("the batch size must be at least 1");
    if (options_.n_threads <= 0) options_.n_threads = ThreadPool::physical_cores();
    if (options_.queue_end_layer > model_.hp.n_layer)
        throw Error("--queue-layers: the model has only " + std::to_string(model_.hp.n_layer) +
                    " layers");
    impl_ = std::make_unique<Impl>(model_, options_);
}

Session::~Session() = default;

namespace {

RunnerOptions runner_options(const SessionOptions& o) {
    RunnerOptions r;
    r.n_threads = o.n_threads;
    r.batch_invariant = o.batch_invariant;
    r.planner = o.planner;
    r.queue_first_layer = o.queue_first_layer;
    r.queue_end_layer = o.queue_end_layer;
    return r;
}

// The KV regions are pools of pages (graph/kv_pages.h); this session's one
// sequence holds pages 0, 1, 2, ... in order (page table = identity).
graph::CParams session_cparams(const SessionOptions& o) {
    graph::CParams c;
    c.kv_page = graph::kKvPageCells;
    c.n_ctx = (o.n_ctx + graph::kKvPageCells - 1) / graph::kKvPageCells * graph::kKvPageCells;
    c.fuse_qkv = o.fuse.qkv;
    c.fuse_ffn = o.fuse.ffn;
    c.kv_type = o.kv_type;
    return c;
}

}  // namespace

Session::Impl::Impl(const model::Model& model, const SessionOptions& o)
    : runner(model, runner_options(o), session_cparams(o)) {
    const graph::CParams& c = runner.cparams();
    page_table.resize(static_cast<size_t>(c.n_ctx / c.kv_page));
    for (size_t i = 0; i < page_table.size(); ++i) page_table[i] = static_cast<int32_t>(i);
}

Session::Impl::~Impl() = default;

graph::Graph& Session::Impl::prepare(int64_t n_tokens, int64_t n_out, bool* rebuilt) {
    graph::GraphParams params;
    params.n_tokens = n_tokens;
    params.n_out = n_out;
    params.kind = n_tokens == 1 ? graph::kDecode : graph::kPrefill;
    params.cparams = runner.cparams();
    last_params = params;
    return runner.prepare(params, rebuilt);
}

void Session::truncate(int64_t n) {
    if (n < 0 || n > n_past_) throw Error("truncate: position out of range");
    n_past_ = n;
}

std::vector<float> Session::eval(std::span<const int32_t> tokens, bool all_logits) {
    const int64_t n_total = static_cast<int64_t>(tokens.size());
    if (n_total == 0) throw Error("eval: no tokens");
    if (n_past_ + n_total > options_.n_ctx)
        throw Error("context full: " + std::to_string(n_past_) + " cached + " +
                    std::to_string(n_total) + " new tokens exceed the context size of " +
                    std::to_string(options_.n_ctx));
    const int64_t n_vocab = model_.hp.n_vocab;
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab)
            throw Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                        std::to_string(n_vocab - 1) + ")");

    std::vector<float> out(static_cast<size_t>((all_logits ? n_total : 1) * n_vocab));
    std::vector<int32_t> positions, tail, rows;
    for (int64_t done = 0; done < n_total;) {
        const int64_t n = std::min(options_.n_batch, n_total - done);
        const bool last_pass = done + n == n_total;
        const int64_t n_out = all_logits ? n : 1;
        const size_t allocs_before = impl_->runner.pool_allocations();
        bool rebuilt = false;
        graph::Graph& g = impl_->prepare(n, n_out, &rebuilt);
        ModelRunner& runner = impl_->runner;

        positions.resize(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i)
            positions[static_cast<size_t>(i)] = static_cast<int32_t>(n_past_ + i);
        runner.fill(g, "token_ids",
                    tokens.subspan(static_cast<size_t>(done), static_cast<size_t>(n)));
        runner.fill(g, "positions", positions);
        runner.fill(g, "kv_cells", positions);  // cell = position: identity pages
        rows.assign(static_cast<size_t>(n), 0);
        runner.fill(g, "kv_rows", rows);
        runner.fill(g, "kv_pages", impl_->page_table);
        if (n_out < n) {
            tail.resize(static_cast<size_t>(n_out));
            for (int64_t i = 0; i < n_out; ++i)
                tail[static_cast<size_t>(i)] = static_cast<int32_t>(n - n_out + i);
            runner.fill(g, "tail_ids", tail);
        }
        runner.execute(g);
        for (const auto& observe : impl_->pass_observers) observe(g, impl_->last_params, rebuilt);
        if (all_logits || last_pass)
            runner.read_logits(g, 0, n_out, out.data() + (all_logits ? done * n_vocab : 0));

        // Counters for the memory report. Warm-up ends with the first
        // decode step; every later pass (prefill or decode) is counted.
        ++stats_.passes;
        if (rebuilt)
            ++stats_.graphs_built;
        else
            ++stats_.graphs_reused;
        const bool warm = stats_.decode_steps > 0;
        if (warm) {
            if (rebuilt) ++stats_.rebuilds_after_first_decode;
            stats_.allocations_after_first_decode +=
                static_cast<int64_t>(impl_->runner.pool_allocations() - allocs_before);
        }
        if (n == 1) ++stats_.decode_steps;
        const size_t held = runner.allocator().activation_bytes_held();
        stats_.activation_bytes_held = held;
        stats_.activation_bytes_peak = std::max(stats_.activation_bytes_peak, held);
        if (!warm && n == 1) stats_.activation_bytes_at_warmup = held;
        if (warm && held > stats_.activation_bytes_at_warmup)
            stats_.activation_growth_after_warmup = std::max(
                stats_.activation_growth_after_warmup, held - stats_.activation_bytes_at_warmup);
        n_past_ += n;
        done += n;
    }
    return out;
}

size_t Session::kernel_scratch_bytes() const {
    const backend::Backend* cpu = impl_->runner.cpu();
    return cpu ? cpu->scratch_bytes() : 0;
}

size_t regroup_weights_for_cpu(model::Model& m) {
    return m.interleave_weights(backend::cpu_groups_weight_rows);
}

}  // namespace minfer::runtime
