// The engine's scheduler: turns the queue and the running sequences into the
// plan of one step (ARCHITECTURE.md "Growing it"): admission in order,
// growth of the decoding sequences' page tables (preempting when the pool is
// empty), packing (decode tokens first, prompt chunks within n_batch) and
// the token-count bucket of the pass. It runs nothing and samples nothing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "runtime/engine.h"
#include "runtime/kv_store_impl.h"
#include "runtime/sequence_impl.h"

namespace minfer::runtime {

// Tokens [from, from + n) of one sequence, computed in this step's pass.
struct SeqWork {
    Sequence* seq;
    int64_t from, n;
};

struct StepPlan {
    std::vector<SeqWork> work;        // decode tokens first, then prompt chunks
    int64_t n_real = 0;               // tokens of the work
    int64_t n_decode = 0;             // of which decode tokens (one per sequence)
    int64_t n_tok = 0;                // the pass's token-count bucket (>= n_real)
    std::vector<Sequence*> rejected;  // queued, can never fit the pool: to finish
};

class Scheduler {
  public:
    // copy_cells: at admission, copies the cells of s's prompt another
    // running sequence has computed into s's pages; returns the cells copied.
    using CopyCells = std::function<int64_t(Sequence& s)>;
    Scheduler(const EngineOptions& opt, KvStore& kv, EngineStats& stats, CopyCells copy_cells);

    // The plan of the next step; admits, grows and preempts sequences (their
    // pages and states), touches nothing else.
    StepPlan schedule(std::vector<std::unique_ptr<Sequence>>& seqs);
    // Gives s's pages back and puts it first in the queue (recomputed later).
    void preempt(Sequence& s);

  private:
    void admit_in_order(std::vector<std::unique_ptr<Sequence>>& seqs, StepPlan& plan);
    bool admit(Sequence& s);
    void grow(std::vector<std::unique_ptr<Sequence>>& seqs);
    void pack(std::vector<std::unique_ptr<Sequence>>& seqs, StepPlan& plan);
    void cut_to_bucket(StepPlan& plan) const;
    // A running sequence that still waits for shared pages: true while one
    // of them is not ready. A page its filler gave up on is dropped with
    // every page after it and fresh pages claimed to recompute them; when
    // the pool has none, s is preempted (and true returned).
    bool claim_pages_or_preempt(Sequence& s);

    const EngineOptions& opt_;
    KvStore& kv_;
    EngineStats& stats_;
    CopyCells copy_cells_;
    uint64_t admit_counter_ = 0;
};

}  // namespace minfer::runtime
