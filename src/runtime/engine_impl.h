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
#include "graph/fuse.h"
#include "graph/kv_pages.h"
#include "graph/scheduler.h"
#include "runtime/engine.h"

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

    struct Request {
        RequestId id = 0;
        GenParams params;
        RequestCallbacks callbacks;
        std::chrono::steady_clock::time_point t_submit;
    };
    // One sample of a request: its tokens, the cells computed so far, its
    // page table (references into the pool) and its sampler.
    struct Seq {
        enum class State { Queued, Running, Finished };
        std::shared_ptr<Request> req;
        int32_t sample = 0;
        State state = State::Queued;
        std::vector<int32_t> tokens;  // prompt, then every sampled token
        int64_t n_done = 0;           // cells computed: positions [0, n_done)
        std::vector<int32_t> pages;   // page table: position p in pages[p / P]
        int64_t n_hit_pages = 0;      // leading pages mapped from the prefix index
        int64_t cached_tokens = 0;    // prompt tokens not computed (first admission)
        int64_t generated = 0;
        uint64_t admit_order = 0;  // later admitted = preempted first
        bool ever_admitted = false;
        std::unique_ptr<SequenceSampler> sampler;  // its own seed, history, grammar state
        std::vector<float> mask_us;                // constrained: per sampled token
        std::chrono::steady_clock::time_point t_admit, t_first;
    };

    graph::Graph& prepare(int64_t n_tokens, int64_t n_out);
    bool step();
    bool admit(Seq& s);
    int64_t copy_computed_cells(Seq& s);
    bool blocked(Seq& s);
    void preempt(Seq& s);
    void release_pages(Seq& s);
    std::vector<uint64_t> page_hashes(const Seq& s, int64_t n) const;
    bool index_page(const Seq& s, int64_t i, uint64_t hash);
    void mark_filled_pages_ready(const Seq& s);
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
    std::unique_ptr<backend::Backend> cpu;
    std::vector<backend::Backend*> backends;
    std::unique_ptr<graph::GraphCache> cache;
    graph::Scheduler scheduler;
    graph::CParams cparams;
    std::vector<int32_t> eog;

    int32_t n_pages = 0;     // pages of -c cells, shared by all sequences
    int32_t trash_page = 0;  // one more page: read (never written) by padding tokens
    std::unique_ptr<graph::KvPagePool> pool;
    std::vector<std::vector<int32_t>> page_tokens;  // [n_pages] tokens of indexed pages
    std::vector<std::unique_ptr<Seq>> seqs;         // admitted or queued, never finished
    uint64_t admit_counter = 0;

    static constexpr size_t kMaxGraphs = 8;  // token-count buckets kept at once
    std::map<int, uint64_t> graph_used;      // kind -> last use
    std::map<int, size_t> plan_bytes;        // kind -> activation bytes of its plan
    uint64_t tick = 0;
    int64_t graphs_built = 0;

    // Reused per step.
    std::vector<int32_t> tok_ids, positions, cells, rows, page_rows, tail;
    std::vector<float> logits_row;
    std::vector<uint8_t> copy_staging;      // copy_computed_cells' V rows or donor K page
    std::vector<uint8_t> own_page_staging;  // ... and the K page they are patched into
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
    EngineStats stats;     // step thread's
    EngineStats snapshot;  // published under mu
    int64_t finished_pending = 0;
};

}  // namespace minfer::runtime
