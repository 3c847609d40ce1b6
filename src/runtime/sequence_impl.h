// A request as the engine holds it, and one sample of it (a sequence): the
// data the KV store, the scheduler and the engine's step share.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "graph/kv_pages.h"
#include "runtime/engine.h"
#include "runtime/sampler.h"

namespace minfer::runtime {

// Cells per KV page: position p of a sequence is in its page pages[p / kPageCells].
constexpr int32_t kPageCells = graph::kKvPageCells;

struct EngineRequest {
    RequestId id = 0;
    GenParams params;
    RequestCallbacks callbacks;
    std::chrono::steady_clock::time_point t_submit;
};

// One sample of a request: its tokens, the cells computed so far, its page
// table (references into the pool) and its sampler.
struct Sequence {
    enum class State { Queued, Running, Finished };
    std::shared_ptr<EngineRequest> req;
    int32_t sample = 0;
    State state = State::Queued;
    std::vector<int32_t> tokens;  // prompt, then every sampled token
    int64_t n_done = 0;           // cells computed: positions [0, n_done)
    std::vector<int32_t> pages;   // page table: position p in pages[p / kPageCells]
    int64_t n_hit_pages = 0;      // leading pages mapped from the prefix index
    int64_t cached_tokens = 0;    // prompt tokens not computed (first admission)
    int64_t generated = 0;
    uint64_t admit_order = 0;  // later admitted = preempted first
    bool ever_admitted = false;
    std::unique_ptr<SequenceSampler> sampler;  // its own seed, history, grammar state
    std::vector<float> mask_us;                // constrained: per sampled token
    std::chrono::steady_clock::time_point t_admit, t_first;

    bool running() const { return state == State::Running; }
    // Tokens not yet computed (the last one's logits are the next sample's).
    int64_t left() const { return static_cast<int64_t>(tokens.size()) - n_done; }
};

}  // namespace minfer::runtime
