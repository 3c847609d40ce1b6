// Engine internals, visible to the tests (page accounting, logits hook) and
// the reports (KV pages beside the activation buffers), not part of the
// public engine API.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "graph/cache.h"
#include "graph/kv_pages.h"
#include "runtime/engine.h"
#include "runtime/kv_store_impl.h"
#include "runtime/model_runner_impl.h"
#include "runtime/scheduler_impl.h"
#include "runtime/sequence_impl.h"

namespace minfer::runtime {

// The constrained sequences' masks for the next sample, computed on a thread
// of their own while the forward pass that gives the logits runs (a mask
// depends only on its sequence's grammar state, known once the previous
// token was sampled). Started on first use: an engine that never sees a
// constraint has no such thread.
class MaskThread {
  public:
    ~MaskThread();
    // Starts prepare_mask() of each sampler; returns at once.
    void start(std::vector<SequenceSampler*> samplers);
    // Waits until the masks started last are computed.
    void wait();

  private:
    void loop();
    std::thread thread_;
    std::mutex mu_;
    std::condition_variable cv_;
    std::vector<SequenceSampler*> jobs_;
    bool busy_ = false, stop_ = false;
};

struct Engine::Impl {
    Impl(const model::Model& model, const EngineOptions& options);
    ~Impl();

    using Request = EngineRequest;
    using Seq = Sequence;

    graph::Graph& prepare(int64_t n_tokens, int64_t n_out);
    bool step();
    // What one pass computed: the sequences whose last token it ran (each
    // samples from its logits row) and the graph that holds the rows.
    struct PassResult {
        std::vector<std::pair<Seq*, int64_t>> want;  // (sequence, token index in the pass)
        int64_t n_tok = 0, n_out = 0;
        graph::Graph* g = nullptr;
    };
    // Intake: new requests queued as sequences, cancels applied. Returns
    // whether anything happened.
    bool take_incoming();
    void enqueue(const std::shared_ptr<Request>& req);
    // The plan's inputs filled, its pass run (the masks computed beside it).
    PassResult run(const StepPlan& plan);
    void fill_inputs(const StepPlan& plan, PassResult& pass);
    void sample_pass(const PassResult& pass);
    void finish(Seq& s, FinishReason reason, std::string error = "");
    void deliver_finished();
    void apply_cancels(const std::vector<RequestId>& ids);
    void retire();
    bool sample(Seq& s, const float* logits);
    void publish_stats();
    // Throws minfer::Error when the page accounting is broken: a page lost,
    // held by more sequences than its reference count says, a sequence
    // writing a page someone else holds.
    void check_pages() const;

    const model::Model& model;
    EngineOptions opt;
    std::vector<int32_t> eog;

    KvStore kv;                              // pages of -c cells, shared by all sequences
    ModelRunner runner;                      // graphs per token-count bucket; its allocator
                                             // holds the KV regions (attached to kv)
    std::vector<std::unique_ptr<Seq>> seqs;  // admitted or queued, never finished

    // Reused per step.
    std::vector<int32_t> tok_ids, positions, cells, rows, page_rows, tail;
    std::vector<float> logits_row;
    std::vector<std::pair<std::shared_ptr<Request>, RequestResult>> finished;

    MaskThread mask_thread;
    std::vector<SequenceSampler*> mask_jobs;

    // Tests: every logits row the engine samples from (request, sample,
    // position of the token, logits).
    std::function<void(RequestId, int32_t, int64_t, std::span<const float>)> logits_hook;

    // Shared with other threads.
    mutable std::mutex mu;  // incoming, cancels, snapshot
    std::mutex step_mu;     // held by step(); cancel() frees at once when it is free
    std::atomic<std::thread::id> stepping_thread{};
    std::condition_variable cv;
    std::vector<std::shared_ptr<Request>> incoming;
    std::vector<RequestId> cancels;
    std::vector<std::pair<std::shared_ptr<Request>, RequestResult>> cancelled_queued;
    RequestId next_id = 1;
    EngineStats stats;  // step thread's
    Scheduler sched{opt, kv, stats, [this](Seq& s) { return kv.copy_computed_cells(s, seqs); }};
    EngineStats snapshot;  // published under mu
    int64_t finished_pending = 0;
};

}  // namespace minfer::runtime
