#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/host_pool.h"
#include "backend/queue/queue_backend.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::backend;

TEST(Backends, host_pool_recycles_exact_sizes_zeroed_and_aligned) {
    HostPool pool;
    const BufferId a = pool.allocate(100);
    const BufRef ra{0, a, 0, 100};
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.resolve(ra)) % 64, 0u);
    const uint8_t ones[100] = {1, 1, 1};
    pool.write(ra, ones, 100);
    pool.free(a);
    pool.free(a);                     // idempotent
    EXPECT_NE(pool.allocate(64), a);  // another size: a new buffer
    const BufferId again = pool.allocate(100);
    EXPECT_EQ(again, a);  // exact size: recycled
    uint8_t back[100];
    pool.read(ra, back, 100);
    for (uint8_t b : back) EXPECT_EQ(b, 0);  // zeroed on recycle
    pool.free(a);
    EXPECT_NE(pool.allocate_fresh(100), a);  // fresh never takes the free list
    EXPECT_TRUE(pool.is_free(a));
    const PoolStats st = pool.stats();
    EXPECT_EQ(st.n_buffers, 3u);
    EXPECT_EQ(st.bytes, 264u);
    EXPECT_EQ(st.recycled, 1u);
}

// The KV pools and the activation arena are this large: they start on a
// 2 MiB boundary, so the whole buffer can be backed by transparent huge
// pages (which the kernel may still refuse: that is not observable here).
TEST(Backends, host_pool_large_buffers_start_on_a_huge_page) {
    HostPool pool;
    for (size_t bytes : {HostPool::kHugeMin, HostPool::kHugeMin + 4096 + 3}) {
        const BufferId id = pool.allocate(bytes);
        const uint8_t* p = pool.resolve(BufRef{0, id, 0, bytes});
        EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % HostPool::kHugePage, 0u) << bytes;
        EXPECT_EQ(p[bytes - 1], 0);  // zeroed to the last byte
        pool.release(id);            // freed with the alignment it was allocated with
    }
    EXPECT_EQ(pool.stats().bytes, 0u);
}

TEST(Backends, host_access_is_bounded_by_the_window) {
    CpuBackend cpu(1);
    const BufferId id = cpu.allocate(64);
    const BufRef w{0, id, 16, 32};  // a window inside the buffer
    const float four[4] = {1, 2, 3, 4};
    cpu.write_host(w, four, 16);
    float full[16];
    cpu.read_host(BufRef{0, id, 0, 64}, full, 64);
    EXPECT_EQ(full[4], 1.0f);
    EXPECT_EQ(full[7], 4.0f);
    EXPECT_EQ(full[3], 0.0f);
    uint8_t big[33] = {};
    EXPECT_THROW(cpu.write_host(w, big, 33), Error);
    EXPECT_THROW(cpu.read_host(w, big, 33), Error);
}

namespace {
graph::Node add_node(int64_t n) {
    graph::Node node;
    node.op = graph::Op::Add;
    node.name = "add";
    node.ne = {n, 1, 1, 1};
    node.src = {0, 1};
    return node;
}
}  // namespace

TEST(Backends, cpu_executes_immediately_queue_after_synchronize) {
    const graph::Node node = add_node(4);
    const std::array<int64_t, 4> ne{4, 1, 1, 1};
    const std::array<std::array<int64_t, 4>, 2> src_ne{ne, ne};
    const float a[4] = {1, 2, 3, 4}, b[4] = {10, 20, 30, 40};
    CpuBackend cpu(2);
    QueueBackend queue;
    for (Backend* be : {static_cast<Backend*>(&cpu), static_cast<Backend*>(&queue)}) {
        BufRef ra{0, be->allocate(16), 0, 16}, rb{0, be->allocate(16), 0, 16},
            ro{0, be->allocate(16), 0, 16};
        be->write_host(ra, a, 16);
        be->write_host(rb, b, 16);
        const BufRef srcs[2] = {ra, rb};
        be->execute_node(node, srcs, ro, nullptr, src_ne);
        be->submit();
        be->synchronize();
        float out[4];
        be->read_host(ro, out, 16);
        EXPECT_EQ(out[0], 11.0f) << be->name();
        EXPECT_EQ(out[3], 44.0f) << be->name();
    }
    EXPECT_FALSE(queue.pending());
    EXPECT_EQ(queue.lists_submitted(), 1u);
}

TEST(Backends, queue_reports_kernel_errors_at_synchronize) {
    // A position past n_ctx is a user-caused data error: minfer::Error,
    // raised on the worker, delivered by synchronize().
    graph::Node store;
    store.op = graph::Op::KvStore;
    store.name = "kv_store.0";
    store.ne = {4, 2, 1, 1};
    store.src = {0, 1, 2};
    store.meta.n_head_kv = 1;
    store.meta.head_dim = 4;
    store.meta.n_ctx = 32;
    QueueBackend queue;
    const BufRef k{0, queue.allocate(16), 0, 16}, v{0, queue.allocate(16), 0, 16},
        pos{0, queue.allocate(4), 0, 4};
    const KvPair kv{BufRef{0, queue.allocate(512), 0, 512}, BufRef{0, queue.allocate(512), 0, 512}};
    const int32_t p = 35;
    queue.write_host(pos, &p, 4);
    const BufRef srcs[3] = {k, v, pos};
    const std::array<std::array<int64_t, 4>, 3> ne{{{4, 1, 1, 1}, {4, 1, 1, 1}, {1, 1, 1, 1}}};
    queue.execute_node(store, srcs, kv.k, &kv, ne);
    EXPECT_THROW(queue.synchronize(), Error);
    EXPECT_FALSE(queue.pending());
    queue.synchronize();  // the error was delivered once
}

namespace {
// Records a node on a fresh queue and reads its output without submitting
// or synchronizing: the scheduler bug the queue must catch.
void read_pending_buffer() {
    QueueBackend queue;
    const graph::Node node = add_node(4);
    const std::array<int64_t, 4> ne{4, 1, 1, 1};
    const std::array<std::array<int64_t, 4>, 2> src_ne{ne, ne};
    const BufRef ra{0, queue.allocate(16), 0, 16}, ro{0, queue.allocate(16), 0, 16};
    const BufRef srcs[2] = {ra, ra};
    queue.execute_node(node, srcs, ro, nullptr, src_ne);
    float out[4];
    queue.read_host(ro, out, 16);
}
}  // namespace

TEST(BackendsDeathTest, queue_asserts_on_host_read_of_a_pending_buffer) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_DEATH(read_pending_buffer(), "host read of a pending buffer");
}
