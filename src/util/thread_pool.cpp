#include "util/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "util/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define MINFER_CPU_RELAX() _mm_pause()
#else
#define MINFER_CPU_RELAX() ((void)0)
#endif

namespace minfer {

namespace {
// Waiting has three stages. A decode step issues a few hundred runs back to
// back, microseconds apart, so a waiting thread first spins (pause, a few
// ns to ~60 ns each); then it yields, so that on an oversubscribed machine
// the thread it waits for can take its core; after kYieldsBeforeBlock
// yields (well over a millisecond) an idle worker blocks on the condition
// variable so an idle pool burns no CPU.
constexpr int kSpinBeforeYield = 1 << 10;
constexpr int kYieldsBeforeBlock = 1 << 12;

struct AlignedFree {
    void operator()(void* p) const { std::free(p); }
};
}  // namespace

struct ThreadPool::Impl {
    int n_threads = 1;
    std::vector<std::thread> workers;

    // A run is published by bumping `generation`; workers finish by
    // decrementing `pending`.
    std::atomic<uint64_t> generation{0};
    std::atomic<int> pending{0};
    const std::function<void(int, int)>* fn = nullptr;
    // run_chunks: the chunk counter, the number of workers inside the run,
    // and the generation that is closed to late joiners.
    const std::function<void(int, int64_t)>* chunk_fn = nullptr;
    int64_t n_chunks = 0;
    std::atomic<int64_t> next_chunk{0};
    std::atomic<int> active{0};
    std::atomic<uint64_t> closed{0};
    std::atomic<uint64_t> chunk_fn_generation{0};  // the generation of a run_chunks
    std::atomic<bool> stop{false};                 // published by the generation bump after it
    std::mutex mutex;
    std::condition_variable cv;

    std::mutex error_mutex;
    std::exception_ptr error;

    struct Scratch {
        std::unique_ptr<void, AlignedFree> ptr;
        size_t bytes = 0;
    };
    std::vector<Scratch> scratch;  // [n_threads + 1]
    // The largest thread slot [0, n_threads), and the size every thread
    // slot was last leveled to (level_thread_scratch).
    std::atomic<size_t> thread_peak{0};
    size_t leveled = 0;

    static void grow(Scratch& s, size_t want) {
        want = (want + 63) / 64 * 64;
        void* p = std::aligned_alloc(64, want);
        MINFER_ASSERT(p != nullptr);
        s.ptr.reset(p);
        s.bytes = want;
    }

    // Which threads join a run_chunks, and so whose slots a kernel asks
    // for, depends on timing: a worker that first joins at the 4th decode
    // step would allocate there, after the step that set the steady state.
    // So once a run is over (no thread is inside it) every thread slot is
    // grown to the largest one: what one thread needed, any thread gets.
    void level_thread_scratch() {
        const size_t peak = thread_peak.load(std::memory_order_relaxed);
        if (peak == leveled) return;
        for (int i = 0; i < n_threads; ++i) {
            Scratch& s = scratch[static_cast<size_t>(i)];
            if (s.bytes < peak) grow(s, peak);
        }
        leveled = peak;
    }

    void take_chunks(int ith) {
        try {
            for (int64_t c = next_chunk.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
                 c = next_chunk.fetch_add(1, std::memory_order_relaxed))
                (*chunk_fn)(ith, c);
        } catch (...) {
            next_chunk.store(n_chunks, std::memory_order_relaxed);  // the others stop early
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
        }
    }

    void call(int ith) {
        try {
            (*fn)(ith, n_threads);
        } catch (...) {
            std::lock_guard<std::mutex> lock(error_mutex);
            if (!error) error = std::current_exception();
        }
    }

    void worker_loop(int ith) {
        uint64_t seen = 0;
        for (;;) {
            uint64_t g = generation.load(std::memory_order_acquire);
            int spins = 0;
            while (g == seen) {
                ++spins;
                if (spins < kSpinBeforeYield) {
                    MINFER_CPU_RELAX();
                } else if (spins < kSpinBeforeYield + kYieldsBeforeBlock) {
                    std::this_thread::yield();
                } else {
                    std::unique_lock<std::mutex> lock(mutex);
                    cv.wait(lock,
                            [&] { return generation.load(std::memory_order_acquire) != seen; });
                    spins = 0;
                }
                g = generation.load(std::memory_order_acquire);
            }
            seen = g;
            if (stop.load(std::memory_order_acquire)) return;
            // A plain run waits for every worker, so if a newer run has
            // started since we saw g, g was a run_chunks: cg >= g means
            // "a run_chunks, possibly a later one than g" and we try to
            // join the latest.
            const uint64_t cg = chunk_fn_generation.load(std::memory_order_acquire);
            if (cg >= g) {
                // Join unless the caller has closed that run (Dekker-style:
                // seq_cst on both sides, so either the caller sees us in
                // `active` or we see the run closed).
                active.fetch_add(1, std::memory_order_seq_cst);
                // The re-read of chunk_fn_generation rejects a stale cg
                // whose run is over (closed has moved past it).
                if (closed.load(std::memory_order_seq_cst) != cg &&
                    chunk_fn_generation.load(std::memory_order_seq_cst) == cg)
                    take_chunks(ith);
                active.fetch_sub(1, std::memory_order_release);
                continue;
            }
            call(ith);
            pending.fetch_sub(1, std::memory_order_acq_rel);
        }
    }
};

ThreadPool::ThreadPool(int n_threads) : impl_(std::make_unique<Impl>()) {
    MINFER_ASSERT(n_threads >= 1);
    impl_->n_threads = n_threads;
    impl_->scratch.resize(static_cast<size_t>(n_threads) + 1);
    impl_->workers.reserve(static_cast<size_t>(n_threads - 1));
    for (int i = 1; i < n_threads; ++i)
        impl_->workers.emplace_back([this, i] { impl_->worker_loop(i); });
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(impl_->mutex);
        impl_->stop.store(true, std::memory_order_release);
        impl_->generation.fetch_add(1, std::memory_order_acq_rel);
    }
    impl_->cv.notify_all();
    for (auto& t : impl_->workers) t.join();
}

int ThreadPool::size() const {
    return impl_->n_threads;
}

void ThreadPool::run(const std::function<void(int, int)>& fn) {
    Impl& p = *impl_;
    p.fn = &fn;
    p.error = nullptr;
    if (p.n_threads > 1) {
        p.pending.store(p.n_threads - 1, std::memory_order_relaxed);
        {
            // The lock pairs with the predicate check of a worker about to
            // block, so a bump between its check and its wait is not lost.
            std::lock_guard<std::mutex> lock(p.mutex);
            p.generation.fetch_add(1, std::memory_order_acq_rel);
        }
        p.cv.notify_all();  // cheap when nobody waits
    }
    p.call(0);
    int spins = 0;
    while (p.pending.load(std::memory_order_acquire) != 0) {
        if (++spins < kSpinBeforeYield) {
            MINFER_CPU_RELAX();
        } else {
            std::this_thread::yield();
        }
    }
    p.fn = nullptr;
    p.level_thread_scratch();
    if (p.error) {
        std::exception_ptr e = std::exchange(p.error, nullptr);
        std::rethrow_exception(e);
    }
}

void ThreadPool::run_chunks(int64_t n_chunks, const std::function<void(int, int64_t)>& fn) {
    Impl& p = *impl_;
    if (n_chunks <= 0) return;
    p.error = nullptr;
    p.chunk_fn = &fn;
    p.n_chunks = n_chunks;
    p.next_chunk.store(0, std::memory_order_relaxed);
    uint64_t g = 0;
    if (p.n_threads > 1 && n_chunks > 1) {
        std::lock_guard<std::mutex> lock(p.mutex);
        g = p.generation.load(std::memory_order_relaxed) + 1;
        // Release: a worker that joins through chunk_fn_generation (not the
        // generation bump) must also see chunk_fn and n_chunks written above.
        p.chunk_fn_generation.store(g, std::memory_order_release);
        p.generation.store(g, std::memory_order_release);
    }
    if (g != 0) p.cv.notify_all();
    p.take_chunks(0);
    if (g != 0) {
        p.closed.store(g, std::memory_order_seq_cst);
        // Workers that joined are finishing their last chunk.
        while (p.active.load(std::memory_order_seq_cst) != 0) MINFER_CPU_RELAX();
    }
    p.chunk_fn = nullptr;
    p.level_thread_scratch();
    if (p.error) {
        std::exception_ptr e = std::exchange(p.error, nullptr);
        std::rethrow_exception(e);
    }
}

void* ThreadPool::scratch(int slot, size_t bytes) {
    MINFER_ASSERT(slot >= 0 && slot <= impl_->n_threads);
    Impl::Scratch& s = impl_->scratch[static_cast<size_t>(slot)];
    if (s.bytes < bytes || !s.ptr) {
        // Grown by half again at least: attention's scratch follows the
        // cache depth, a few bytes more every step, and a fresh multi-MB
        // block every step (its page faults, the unmap of the old one) cost
        // more than the attention itself at depth 4096.
        Impl::grow(s, std::max<size_t>({bytes, s.bytes + s.bytes / 2, 4096}));
        if (slot < impl_->n_threads) {
            size_t peak = impl_->thread_peak.load(std::memory_order_relaxed);
            while (peak < s.bytes && !impl_->thread_peak.compare_exchange_weak(
                                         peak, s.bytes, std::memory_order_relaxed)) {
            }
        }
    }
    return s.ptr.get();
}

size_t ThreadPool::scratch_bytes() const {
    size_t total = 0;
    for (const Impl::Scratch& s : impl_->scratch) total += s.ptr ? s.bytes : 0;
    return total;
}

int ThreadPool::physical_cores() {
    // Distinct (physical id, core id) pairs: hyper-threads share a core's
    // execution units, and matmul threads beyond the cores only contend.
    std::ifstream in("/proc/cpuinfo");
    std::set<std::pair<int, int>> cores;
    int physical = 0, core = -1;
    bool have_core = false;
    std::string line;
    auto value = [](const std::string& l) {
        size_t c = l.find(':');
        return c == std::string::npos ? -1 : std::atoi(l.c_str() + c + 1);
    };
    while (std::getline(in, line)) {
        if (line.rfind("physical id", 0) == 0) {
            physical = value(line);
        } else if (line.rfind("core id", 0) == 0) {
            core = value(line);
            have_core = true;
        } else if (line.empty()) {
            if (have_core) cores.insert({physical, core});
            physical = 0;
            have_core = false;
        }
    }
    if (have_core) cores.insert({physical, core});
    if (!cores.empty()) return static_cast<int>(cores.size());
    unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : static_cast<int>(hc);
}

}  // namespace minfer
