// A session runs a model over a growing sequence: prompt passes and decode
// steps, one KV cache, graphs reused through the GraphCache. It alone orders
// prefill and decode; the CLI and the tests talk to it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ir/ir.h"
#include "ir/pass_options.h"
#include "model/model.h"

namespace minfer::graph {
class GraphAllocator;
struct GraphParams;
struct CParams;
}  // namespace minfer::graph

namespace minfer::runtime {

struct SessionOptions {
    int64_t n_ctx = 4096;   // KV rows; callers clamp it (see plan_context)
    int64_t n_batch = 512;  // tokens per forward pass at most
    int n_threads = 0;      // 0: physical cores
    graph::FuseOptions fuse = graph::fuse_options_from_env();
    // Layers [first, end) on the queue backend (a stand-in for a GPU); none by default.
    int32_t queue_first_layer = 0;
    int32_t queue_end_layer = 0;
    tensor::DType kv_type = tensor::DType::F32;
    // Activation planner: arena (default) or the design's size classes
    // (MINFER_PLANNER=classes), so both can be measured.
    graph::Planner planner = graph::planner_from_env();
    // Every matmul through the GEMM path, decode too: a token's logits do not
    // depend on the pass's token count for any weight type or layout (see
    // cpu::matmul). The CLI's default is MINFER_BATCH_INVARIANT=1.
    bool batch_invariant = false;
};

struct SessionStats {
    int64_t passes = 0;         // forward passes run
    int64_t decode_steps = 0;   // passes of one token
    int64_t graphs_built = 0;   // builds (cache misses)
    int64_t graphs_reused = 0;  // cache hits
    // Warm-up is every pass up to and including the first decode step; the
    // counters below cover EVERY later pass (a prefill of a later chat turn
    // as much as a decode step).
    int64_t rebuilds_after_first_decode = 0;
    int64_t allocations_after_first_decode = 0;  // pool buffers created after the first decode step
    size_t activation_bytes_held = 0;            // after the last pass (KV regions excluded)
    size_t activation_bytes_at_warmup = 0;       // after the first decode step
    size_t activation_bytes_peak = 0;            // max held after any pass
    // Bytes the activations grew by after warm-up: peak after it minus held at it.
    size_t activation_growth_after_warmup = 0;
};

class Session {
  public:
    Session(const model::Model& model, SessionOptions options);
    ~Session();
    Session(const Session&) = delete;
    Session& operator=(const Session&) = delete;

    // Runs `tokens` at positions n_past() .. n_past() + size - 1, in passes of
    // at most n_batch tokens. Returns the logits of the last token
    // ([n_vocab]) or, with all_logits, of every token ([size × n_vocab],
    // token-major). Throws minfer::Error when the tokens do not fit in n_ctx
    // (nothing is run then) or a token id is out of range.
    std::vector<float> eval(std::span<const int32_t> tokens, bool all_logits = false);

    int64_t n_past() const { return n_past_; }
    int64_t n_ctx() const { return options_.n_ctx; }
    int64_t n_vocab() const { return model_.hp.n_vocab; }
    // Forget positions >= n (the KV rows are overwritten by later passes).
    void truncate(int64_t n);

    const model::Model& model() const { return model_; }
    const SessionOptions& options() const { return options_; }
    // Bytes of scratch the CPU kernels hold (the thread pool's, its peak).
    size_t kernel_scratch_bytes() const;
    const SessionStats& stats() const { return stats_; }

    // What the reports (memory report, graph dump, trace, state dump) see of
    // the passes. An observer is called after every forward pass, once its
    // graph has executed (so split staging is minted), with that pass's
    // graph parameters and whether the graph was built for it (false:
    // reused from the cache).
    using PassObserver =
        std::function<void(const graph::Graph&, const graph::GraphParams&, bool rebuilt)>;
    void add_pass_observer(PassObserver observer);
    // Called after every node runs (the value trace); replaces the last hook.
    using NodeHook =
        std::function<void(const graph::Graph&, graph::NodeId, graph::GraphAllocator&)>;
    void set_node_hook(NodeHook hook);
    // The allocator of the session's graphs: node buffers, KV regions, counters.
    graph::GraphAllocator& allocator();
    // The context parameters every graph of the session is built with.
    const graph::CParams& cparams() const;

    struct Impl;
    Impl& impl() { return *impl_; }

  private:
    const model::Model& model_;
    SessionOptions options_;
    int64_t n_past_ = 0;
    SessionStats stats_;
    std::unique_ptr<Impl> impl_;
};

// The context-size rule of the design: the user's request (default 4096),
// clamped to the model's trained context with a warning, raised to fit the
// prompt; a prompt longer than the trained context is an error.
struct ContextPlan {
    int64_t n_ctx = 0;
    std::string warning;  // empty when nothing was changed that the user asked for
};
ContextPlan plan_context(int64_t requested, bool user_requested, int64_t n_ctx_train,
                         int64_t n_prompt, int64_t n_predict_hint = 0);

// Regroups the model's matmul weights (Model::interleave_weights) for the
// types this CPU has 16-row kernels for; none (no AVX-512 VNNI): nothing
// moves. Returns the bytes regrouped.
size_t regroup_weights_for_cpu(model::Model& m);

}  // namespace minfer::runtime
