#include "backend/queue/queue_backend.h"

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "util/error.h"

namespace minfer::backend {

QueueBackend::QueueBackend(bool batch_invariant)
    : batch_invariant_(batch_invariant), worker_([this] { worker_loop(); }) {}

QueueBackend::~QueueBackend() {
    try {
        synchronize();
    } catch (...) {
    }
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
}

bool QueueBackend::pending() const {
    std::lock_guard<std::mutex> lock(mu_);
    return !recording_.empty() || !submitted_.empty() || busy_;
}

void QueueBackend::release(BufferId id) {
    MINFER_ASSERT_MSG(!pending(), "queue backend: release() while work is pending");
    pool_.release(id);
}

BufferId QueueBackend::allocate(size_t bytes) {
    MINFER_ASSERT_MSG(!pending(), "queue backend: allocate() while work is pending");
    return pool_.allocate(bytes);
}

void QueueBackend::write_host(const BufRef& dst, const void* src, size_t nbytes) {
    MINFER_ASSERT_MSG(!pending(),
                      "queue backend: host write while work is pending (synchronize first)");
    pool_.write(dst, src, nbytes);
}

void QueueBackend::read_host(const BufRef& src, void* dst, size_t nbytes) {
    MINFER_ASSERT_MSG(!pending(),
                      "queue backend: host read of a pending buffer (synchronize first)");
    pool_.read(src, dst, nbytes);
}

void QueueBackend::execute_node(const graph::Node& node, std::span<const BufRef> srcs,
                                const BufRef& out, const KvPair* kv,
                                std::span<const std::array<int64_t, 4>> src_ne) {
    // Resolve now: the pool's vector may grow later, the memory never moves.
    cpu::NodeData data = resolve_node_data(pool_, node, srcs, out, kv, src_ne);
    data.batch_invariant = batch_invariant_;
    const graph::Node* n = &node;  // the graph outlives synchronize()
    recording_.push_back(
        [this, n, data = std::move(data)] { cpu::run_node(*n, data, kernel_threads_); });
}

void QueueBackend::submit() {
    if (recording_.empty()) return;
    {
        std::lock_guard<std::mutex> lock(mu_);
        submitted_.push_back(std::move(recording_));
        ++lists_submitted_;
    }
    recording_.clear();
    cv_.notify_all();
}

void QueueBackend::synchronize() {
    submit();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return submitted_.empty() && !busy_; });
    if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
    }
}

void QueueBackend::worker_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stop_ || !submitted_.empty(); });
        if (submitted_.empty()) return;  // stop_ and drained
        std::vector<Command> list = std::move(submitted_.front());
        submitted_.pop_front();
        busy_ = true;
        const bool skip = error_ != nullptr;
        lock.unlock();
        std::exception_ptr err;
        if (!skip) {
            for (auto& cmd : list) {
                try {
                    cmd();
                } catch (...) {
                    err = std::current_exception();
                    break;
                }
            }
        }
        lock.lock();
        if (err && !error_) error_ = err;
        busy_ = false;
        cv_.notify_all();
    }
}

}  // namespace minfer::backend
