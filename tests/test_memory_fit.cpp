#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>

#include "report/memory_report.h"
#include "runtime/memory_fit.h"
#include "runtime/session.h"
#include "tiny_model.h"

namespace {

using namespace minfer;

// Sets an environment variable for one scope.
struct ScopedEnv {
    std::string name;
    ScopedEnv(const char* n, const char* v) : name(n) { ::setenv(n, v, 1); }
    ~ScopedEnv() { ::unsetenv(name.c_str()); }
};

// The estimate against what a session really holds: the KV regions exactly,
// the weights as the file's tensors, and no less than the largest planned
// pass (a prompt of n_batch tokens with every row's logits).
TEST(MemoryFit, EstimateCoversWhatASessionHolds) {
    for (const char* arch : {"qwen3", "qwen3moe", "qwen2moe"}) {
        SCOPED_TRACE(arch);
        minfer::testing::TinyModelSpec sp;
        sp.arch = arch;
        sp.tied_output = false;
        auto l = minfer::testing::load_tiny_model(sp);
        const model::Model& m = l->model;
        runtime::SessionOptions o;
        o.n_ctx = 64;
        o.n_batch = 32;
        o.n_threads = 2;
        runtime::Session s(m, o);
        report::MemoryRecorder rec(s);
        std::vector<int32_t> ids(32);
        std::iota(ids.begin(), ids.end(), 5);
        s.eval(ids, true);
        const report::MemoryReport r = rec.report();
        const runtime::MemoryNeed need =
            runtime::estimate_memory(m.hp, m.weight_bytes, o.n_ctx, o.n_batch, 32, o.kv_type);
        EXPECT_EQ(need.weights, m.weight_bytes);
        EXPECT_EQ(need.kv, r.run.kv_bytes);
        EXPECT_GT(r.run.largest_plan_bytes, 0u);
        EXPECT_GE(need.activations, r.run.largest_plan_bytes);
        EXPECT_EQ(need.total(), need.weights + need.kv + need.activations);
    }
}

TEST(MemoryFit, RefusesWhatDoesNotFitNamingNeedAndAvailable) {
    runtime::MemoryNeed need;
    need.weights = size_t{6000} << 20;
    need.kv = size_t{384} << 20;
    need.activations = size_t{100} << 20;
    const runtime::AvailableMemory enough{need.total(), "MemAvailable"};
    EXPECT_NO_THROW(runtime::check_fits(need, enough, "big.gguf"));
    const runtime::AvailableMemory short_by_one{need.total() - 1, "MemAvailable"};
    try {
        runtime::check_fits(need, short_by_one, "big.gguf");
        FAIL() << "a file one byte too large was accepted";
    } catch (const Error& e) {
        const std::string msg = e.what();
        for (const char* part : {"'big.gguf' does not fit in memory", "needs 6484 MiB",
                                 "6000 MiB of weights", "384 MiB of KV cache",
                                 "100 MiB of activations", "6484 MiB is available (MemAvailable)"})
            EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
    }
}

TEST(MemoryFit, AvailableMemoryIsMemAvailableOrTheOverride) {
    {
        ScopedEnv env("MINFER_MEM_AVAILABLE", "8G");
        const auto a = runtime::available_memory();
        ASSERT_TRUE(a.has_value());
        EXPECT_EQ(a->bytes, size_t{8} << 30);
        EXPECT_STREQ(a->source, "MINFER_MEM_AVAILABLE");
    }
    {
        ScopedEnv env("MINFER_MEM_AVAILABLE", "12x");
        EXPECT_THROW(runtime::available_memory(), Error);
    }
    const auto a = runtime::available_memory();
    ASSERT_TRUE(a.has_value());  // Linux: /proc/meminfo has MemAvailable since 3.14
    EXPECT_GT(a->bytes, 0u);
    EXPECT_STREQ(a->source, "MemAvailable");
}

}  // namespace
