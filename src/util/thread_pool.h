// A persistent pool of worker threads (created once, reused by every op):
// run(fn) calls fn(ith, nth) on nth threads — the caller's thread is thread
// 0 — and returns when all have finished. Kernels split their rows by ith.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>

namespace minfer {

class ThreadPool {
  public:
    explicit ThreadPool(int n_threads);  // n_threads >= 1; 1 means no extra threads
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    int size() const;
    // Calls fn(ith, nth) for ith in [0, size()) and waits for all. An
    // exception thrown by fn is rethrown here (the first one) after every
    // thread has finished. Not reentrant: fn must not call run().
    void run(const std::function<void(int ith, int nth)>& fn);

    // Calls fn(ith, chunk) once for every chunk in [0, n_chunks), handing
    // chunks out by an atomic counter to whichever threads are running: the
    // caller starts at once, and a worker that wakes after every chunk is
    // taken stays out. So a worker descheduled by another process delays
    // nothing (with run(), every op waits for the slowest thread to wake).
    // Returns when every chunk has finished. Exceptions as for run().
    void run_chunks(int64_t n_chunks, const std::function<void(int ith, int64_t chunk)>& fn);

    // Scratch memory owned by the pool, 64-byte aligned, grown on demand and
    // kept between runs (so steady-state decode allocates nothing). Slot ith
    // in [0, size()) belongs to thread ith (call it from that thread inside
    // run); slot size() is shared and may be taken only by the caller outside
    // run (e.g. quantized activations every thread reads). A call may
    // invalidate earlier pointers of the same slot. When a run returns,
    // every thread slot holds as much as the largest: which workers join a
    // run_chunks depends on timing, and one that joins late must not
    // allocate then.
    void* scratch(int slot, size_t bytes);
    // Bytes of scratch held now, all slots (they only grow: the peak).
    size_t scratch_bytes() const;

    // Number of physical cores (the -t default), at least 1.
    static int physical_cores();

  private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace minfer
