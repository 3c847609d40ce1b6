// KV pages: the pool's take/share/cache/evict accounting, attention through
// page tables bitwise the contiguous cache, and the prefix hash chain.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "cli_runner.h"
#include "graph/kv_pages.h"
#include "ir/kv_layout.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"
#include "runtime/session.h"
#include "shared_files.h"
#include "structured/constraint.h"
#include "structured/json_schema.h"
#include "tensor/dtype.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/thread_pool.h"

using namespace minfer;

TEST(KvPages, TakeShareCacheEvict) {
    graph::KvPagePool pool(3);
    const int32_t a = pool.take(), b = pool.take();
    EXPECT_EQ(pool.n_used(), 2);
    EXPECT_TRUE(pool.publish(a, 11));
    EXPECT_FALSE(pool.publish(b, 11));  // one page per hash
    EXPECT_EQ(pool.lookup(11), a);
    pool.ref(a);
    EXPECT_EQ(pool.refs(a), 2);
    pool.unref(a);
    pool.unref(a);
    // not ready: nobody finished filling it, so it is not kept
    EXPECT_EQ(pool.lookup(11), -1);
    EXPECT_EQ(pool.n_free(), 2);
    const int32_t c = pool.take();
    ASSERT_TRUE(pool.publish(c, 22));
    pool.mark_ready(c);
    pool.unref(c);
    EXPECT_EQ(pool.n_cached(), 1);
    EXPECT_EQ(pool.lookup(22), c);
    pool.check();
    // A hit takes it back from the cache.
    pool.ref(c);
    EXPECT_EQ(pool.n_cached(), 0);
    pool.unref(c);
    // Two more takes: the free page first, then the cached one is evicted.
    const int32_t d = pool.take();
    EXPECT_NE(d, c);
    const int32_t e = pool.take();
    EXPECT_EQ(e, c);
    EXPECT_EQ(pool.lookup(22), -1);
    EXPECT_EQ(pool.take(), -1);
    std::vector<int32_t> holders(3, 1);
    pool.check(&holders);
    holders[0] = 2;
    EXPECT_THROW(pool.check(&holders), Error);
    pool.unref(b);
    pool.unref(d);
    pool.unref(e);
    pool.check();
    EXPECT_EQ(pool.n_free(), 3);
}

namespace {
// One Attn node over a cache of n_pages pages: two sequences' tokens in
// one call (kv_rows pick their page tables) must give bitwise what each
// gives alone over a contiguous cache (cell = position), on the SIMD and
// the scalar paths, for f32 and f16 caches.
void paged_attention_case(tensor::DType kvt, bool scalar) {
    const int32_t n_head = 14, n_head_kv = 2, hd = 64, P = graph::kKvPageCells, n_pages = 8;
    const int64_t kv = int64_t{n_head_kv} * hd, nq = int64_t{n_head} * hd;
    const int64_t n_ctx = int64_t{n_pages} * P;
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const bool f16 = kvt == tensor::DType::F16;
    const size_t esz = f16 ? 2 : 4;
    // a cell's row as the kernels store it: V row-major, K element-major
    // in blocks (ir/kv_layout.h)
    auto fill_row = [&](std::vector<uint8_t>& region, bool is_k, int64_t cell, const float* src) {
        for (int64_t i = 0; i < kv; ++i) {
            const int64_t at = is_k ? graph::k_index(cell, i, kv) : cell * kv + i;
            if (f16) {
                const uint16_t h = tensor::fp32_to_fp16(src[i]);
                std::memcpy(region.data() + at * 2, &h, 2);
            } else {
                std::memcpy(region.data() + at * 4, &src[i], 4);
            }
        }
    };
    // Sequence a: 70 positions in pages {5, 0, 3}; b: 40 in pages {6, 1}.
    const std::vector<int32_t> pages_a{5, 0, 3}, pages_b{6, 1};
    const int64_t len_a = 70, len_b = 40;
    std::vector<std::vector<float>> ka(len_a), va(len_a), kb(len_b), vb(len_b);
    for (auto* rowset : {&ka, &va, &kb, &vb})
        for (auto& r : *rowset) {
            r.resize(static_cast<size_t>(kv));
            for (auto& x : r) x = u(rng);
        }
    std::vector<uint8_t> K(static_cast<size_t>(n_ctx * kv) * esz), V(K.size());
    for (int64_t p = 0; p < len_a; ++p) {
        const int64_t cell = int64_t{pages_a[size_t(p / P)]} * P + p % P;
        fill_row(K, true, cell, ka[size_t(p)].data());
        fill_row(V, false, cell, va[size_t(p)].data());
    }
    for (int64_t p = 0; p < len_b; ++p) {
        const int64_t cell = int64_t{pages_b[size_t(p / P)]} * P + p % P;
        fill_row(K, true, cell, kb[size_t(p)].data());
        fill_row(V, false, cell, vb[size_t(p)].data());
    }
    // The batch: 3 tokens of a (positions 67..69), then 2 of b (38, 39).
    const std::vector<int32_t> pos{67, 68, 69, 38, 39}, rows{0, 0, 0, 1, 1};
    const int64_t n = 5;
    std::vector<int32_t> table(static_cast<size_t>(2 * n_pages), 0);
    std::copy(pages_a.begin(), pages_a.end(), table.begin());
    std::copy(pages_b.begin(), pages_b.end(), table.begin() + n_pages);
    std::vector<float> q(static_cast<size_t>(nq * n));
    for (auto& x : q) x = u(rng);

    graph::Node node;
    node.op = graph::Op::Attn;
    node.name = "attn";
    node.ne = {nq, n, 1, 1};
    node.meta.n_head = n_head;
    node.meta.n_head_kv = n_head_kv;
    node.meta.head_dim = hd;
    node.meta.n_ctx = n_ctx;
    node.meta.kv_type = kvt;
    node.meta.kv_page = P;
    node.src = {0, 1, 2, 3, 4};  // q, store, positions, kv_rows, kv_pages (ids unused here)
    ThreadPool pool(2);
    if (scalar) setenv("MINFER_SCALAR_ATTN", "1", 1);
    std::vector<float> paged(static_cast<size_t>(nq * n));
    cpu::NodeData d{
        {q.data(), nullptr, pos.data(), rows.data(), table.data()},
        paged.data(),
        K.data(),
        V.data(),
        {{nq, n, 1, 1}, {kv, n_ctx, 1, 1}, {n, 1, 1, 1}, {n, 1, 1, 1}, {2 * n_pages, 1, 1, 1}}};
    cpu::run_node(node, d, pool);
    // Each token alone over a contiguous cache of its own sequence.
    for (int64_t t = 0; t < n; ++t) {
        const bool is_a = t < 3;
        const auto& ks = is_a ? ka : kb;
        const auto& vs = is_a ? va : vb;
        std::vector<uint8_t> Kc(static_cast<size_t>(n_ctx * kv) * esz), Vc(Kc.size());
        for (size_t p = 0; p < ks.size(); ++p) {
            fill_row(Kc, true, static_cast<int64_t>(p), ks[p].data());
            fill_row(Vc, false, static_cast<int64_t>(p), vs[p].data());
        }
        graph::Node one = node;
        one.ne = {nq, 1, 1, 1};
        one.meta.kv_page = 0;
        one.src = {0, 1, 2};
        std::vector<float> out(static_cast<size_t>(nq));
        const int32_t p1 = pos[size_t(t)];
        cpu::NodeData d1{{q.data() + t * nq, nullptr, &p1},
                         out.data(),
                         Kc.data(),
                         Vc.data(),
                         {{nq, 1, 1, 1}, {kv, n_ctx, 1, 1}, {1, 1, 1, 1}}};
        cpu::run_node(one, d1, pool);
        ASSERT_EQ(0, std::memcmp(out.data(), paged.data() + t * nq, static_cast<size_t>(nq) * 4))
            << "token " << t << " " << tensor::dtype_name(kvt) << (scalar ? " scalar" : " simd");
    }
    unsetenv("MINFER_SCALAR_ATTN");
    // A page table naming a page outside the cache is an error, not a read.
    table[1] = n_pages;
    EXPECT_THROW(cpu::run_node(node, d, pool), Error);
}
}  // namespace

TEST(KvPages, AttentionThroughPagesIsBitwiseTheContiguousOne) {
    for (tensor::DType t : {tensor::DType::F32, tensor::DType::F16})
        for (bool scalar : {false, true}) paged_attention_case(t, scalar);
}

TEST(KvPages, HashChainCoversThePrefix) {
    const std::vector<int32_t> t1{1, 2, 3, 4}, t2{1, 2, 3, 5};
    EXPECT_EQ(graph::page_hash(0, t1.data(), 4), graph::page_hash(0, t1.data(), 4));
    EXPECT_NE(graph::page_hash(0, t1.data(), 4), graph::page_hash(0, t2.data(), 4));
    EXPECT_NE(graph::page_hash(1, t1.data(), 4), graph::page_hash(0, t1.data(), 4));
}
