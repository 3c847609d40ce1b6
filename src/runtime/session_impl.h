// Session internals, visible to the reports (memory report, graph dump,
// visual page) but not part of the public session API.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "graph/cache.h"
#include "runtime/model_runner_impl.h"
#include "runtime/session.h"

namespace minfer::runtime {

struct Session::Impl {
    Impl(const model::Model& model, const SessionOptions& options);
    ~Impl();

    // The graph for a pass of n_tokens with n_out logits rows (the runner's
    // prepare); keeps its parameters for the observers.
    graph::Graph& prepare(int64_t n_tokens, int64_t n_out, bool* rebuilt);

    ModelRunner runner;
    std::vector<int32_t> page_table;  // [n_ctx / kv_page]: the one sequence's pages, in order

    // Observers for the reports (memory report, graph dump, trace, visual
    // page): called after every forward pass, once its graph has executed
    // (so split staging is minted), with that pass's graph parameters and
    // whether the graph was built for it (false: reused from the cache).
    using PassObserver =
        std::function<void(const graph::Graph&, const graph::GraphParams&, bool rebuilt)>;
    std::vector<PassObserver> pass_observers;
    graph::GraphParams last_params;  // of the last prepare()
};

}  // namespace minfer::runtime
