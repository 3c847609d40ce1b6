// An asynchronous backend shaped like a GPU command queue, on host memory:
// execute_node only records the node (pointers resolved now — pool ids never
// move memory) into the current command list; submit() hands the list to the
// backend's own worker thread; synchronize() waits for the worker to drain.
// Host access (read_host / write_host) while anything is recorded or running
// is a scheduler bug and aborts: the "never host-copy a pending buffer"
// invariant is checked for real, not just assumed.
#pragma once

#include <array>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

#include "backend/cpu/host_pool.h"
#include "ir/backend.h"
#include "util/thread_pool.h"

namespace minfer::backend {

class QueueBackend : public Backend {
  public:
    // batch_invariant: as CpuBackend's.
    explicit QueueBackend(bool batch_invariant = false);
    ~QueueBackend() override;  // drains the queue (errors dropped), stops the worker

    std::string_view name() const override { return "queue"; }
    // Recycling zeroes the buffer: only while the queue is idle.
    BufferId allocate(size_t bytes) override;
    BufferId allocate_fresh(size_t bytes) override { return pool_.allocate_fresh(bytes); }
    void free(BufferId id) override { pool_.free(id); }
    // Only while the queue is idle (a recorded command may hold the pointer).
    void release(BufferId id) override;
    size_t buffer_bytes(BufferId id) const override { return pool_.buffer_bytes(id); }
    PoolStats stats() const override { return pool_.stats(); }
    void write_host(const BufRef& dst, const void* src, size_t nbytes) override;
    void read_host(const BufRef& src, void* dst, size_t nbytes) override;
    bool supports_op(const graph::Node& node) const override { return true; }
    void execute_node(const graph::Node& node, std::span<const BufRef> srcs, const BufRef& out,
                      const KvPair* kv,
                      std::span<const std::array<int64_t, 4>> src_ne = {}) override;
    void submit() override;
    // Waits for every submitted list (submitting the open one first) and
    // rethrows the first kernel error (minfer::Error) raised since the last
    // synchronize; the lists after a failed node were skipped.
    void synchronize() override;

    // Anything recorded, queued or running.
    bool pending() const;
    size_t lists_submitted() const { return lists_submitted_; }

  private:
    using Command = std::function<void()>;
    void worker_loop();

    HostPool pool_;
    const bool batch_invariant_;
    std::vector<Command> recording_;  // the open command list (host thread only)

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::vector<Command>> submitted_;  // guarded by mu_
    bool busy_ = false;                           // guarded by mu_
    bool stop_ = false;                           // guarded by mu_
    std::exception_ptr error_;                    // guarded by mu_
    size_t lists_submitted_ = 0;

    ThreadPool kernel_threads_{1};  // used only by the worker
    std::thread worker_;            // last: starts after everything above exists
};

}  // namespace minfer::backend
