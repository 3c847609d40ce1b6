// A persistent pool of worker threads (created once, reused by every op):
// run(fn) calls fn(ith, nth) on nth threads — the caller's thread is thread
// 0 — and returns when all have finished. Kernels split their rows by ith.
#pragma once

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
    void run(const std::function<void(int ith, int nth)>& fn);

    // Number of physical cores (the -t default), at least 1.
    static int physical_cores();

private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

}  // namespace minfer
