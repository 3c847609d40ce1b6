#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "util/thread_pool.h"

using minfer::ThreadPool;

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
    for (int n : {1, 2, 3, 5}) {
        ThreadPool pool(n);
        EXPECT_EQ(pool.size(), n);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_nth{0};
        pool.run([&](int ith, int nth) {
            if (nth != n) bad_nth++;
            hits[static_cast<size_t>(ith)]++;
        });
        EXPECT_EQ(bad_nth.load(), 0);
        for (auto& h : hits) EXPECT_EQ(h.load(), 1);
    }
}

TEST(ThreadPool, RepeatedRunsSeeEachOthersWrites) {
    // Thousands of back-to-back runs (like a decode step's ~400 ops). Run r
    // reads every thread's cell written in run r - 1 (double-buffered, so
    // no two threads touch a cell in the same run): a missing barrier or
    // missing memory ordering shows up as a stale value.
    ThreadPool pool(2);
    std::vector<int64_t> cells[2] = {std::vector<int64_t>(2, 0), std::vector<int64_t>(2, 0)};
    const int kRuns = 2000;
    std::atomic<int> stale{0};
    for (int r = 0; r < kRuns; ++r) {
        pool.run([&](int ith, int nth) {
            const auto& prev = cells[r % 2];
            for (int j = 0; j < nth; ++j)
                if (prev[static_cast<size_t>(j)] != r) stale++;
            cells[(r + 1) % 2][static_cast<size_t>(ith)] = prev[static_cast<size_t>(ith)] + 1;
        });
    }
    EXPECT_EQ(stale.load(), 0);
    for (int64_t c : cells[kRuns % 2]) EXPECT_EQ(c, kRuns);
}

TEST(ThreadPool, SplitsWorkOfAnySizeOverThreads) {
    // Work sizes smaller than, equal to and larger than the thread count:
    // every item is done once by the range split the kernels use.
    ThreadPool pool(4);
    for (int64_t n_items : {0, 1, 3, 4, 7, 1000, 4097}) {
        std::vector<std::atomic<int>> done(static_cast<size_t>(n_items));
        pool.run([&](int ith, int nth) {
            const int64_t per = (n_items + nth - 1) / nth;
            for (int64_t i = per * ith; i < std::min(n_items, per * (ith + 1)); ++i)
                done[static_cast<size_t>(i)]++;
        });
        for (auto& d : done) EXPECT_EQ(d.load(), 1) << n_items;
    }
}

TEST(ThreadPool, RethrowsAWorkerException) {
    ThreadPool pool(2);
    EXPECT_THROW(pool.run([](int ith, int) {
        if (ith == 1) throw std::runtime_error("boom");
    }),
                 std::runtime_error);
    // still usable afterwards
    std::atomic<int> count{0};
    pool.run([&](int, int) { count++; });
    EXPECT_EQ(count.load(), 2);
}

TEST(ThreadPool, ScratchIsAlignedAndKept) {
    ThreadPool pool(2);
    void* a = pool.scratch(2, 1000);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
    EXPECT_EQ(pool.scratch(2, 500), a);  // smaller request reuses the block
}

TEST(ThreadPool, AThreadThatJoinsLaterFindsItsScratchAlreadyGrown) {
    // Which workers join a run_chunks depends on timing: a run in which
    // only thread 0 took scratch must leave every thread's slot that large,
    // so a later run whose chunks land on another thread allocates nothing.
    ThreadPool pool(3);
    pool.run([&](int ith, int) {
        if (ith == 0) pool.scratch(0, 10000);
    });
    const size_t after_first = pool.scratch_bytes();
    EXPECT_EQ(after_first, 3 * size_t{10048});  // 10000 rounded up to 64, in each thread slot
    std::vector<void*> seen(3);
    pool.run([&](int ith, int) { seen[static_cast<size_t>(ith)] = pool.scratch(ith, 10000); });
    EXPECT_EQ(pool.scratch_bytes(), after_first);
    pool.run([&](int ith, int) {
        EXPECT_EQ(pool.scratch(ith, 9000), seen[static_cast<size_t>(ith)]) << "thread " << ith;
    });
    // The shared slot is the caller's alone and is not leveled.
    pool.scratch(3, 100);
    EXPECT_EQ(pool.scratch_bytes(), after_first + 4096);
}

TEST(ThreadPool, PhysicalCoresIsPositive) {
    EXPECT_GE(ThreadPool::physical_cores(), 1);
}
