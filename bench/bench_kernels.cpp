// MatMul per weight type at Qwen2.5-0.5B's FFN shapes (896 -> 4864, or
// 4864 -> 896 for the 256-block types):
// decode (1 token) reports GB/s of weight bytes streamed, prefill (64
// tokens) GOP/s (2*K*M*n multiply-adds). Run with --benchmark_filter=... and
// MINFER_BENCH_THREADS (default: physical cores).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"

using namespace minfer;
using tensor::DType;

namespace {

int bench_threads() {
    const char* e = std::getenv("MINFER_BENCH_THREADS");
    return e ? std::max(1, std::atoi(e)) : ThreadPool::physical_cores();
}

struct Fixture {
    std::vector<uint8_t> bytes;
    tensor::TensorView view;
    std::vector<float> x;
    std::vector<float> out;
};

Fixture make(DType t, int64_t K, int64_t M, int64_t n) {
    Fixture f;
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 0.05f);
    std::vector<float> row(static_cast<size_t>(K));
    const size_t rb = tensor::row_size(t, K);
    f.bytes.resize(rb * static_cast<size_t>(M));
    for (int64_t m = 0; m < M; ++m) {
        for (auto& v : row) v = g(rng);
        tensor::quantize_row(t, row.data(), f.bytes.data() + rb * static_cast<size_t>(m), K);
    }
    f.view = tensor::TensorView{
        std::string(tensor::dtype_name(t)), t, {K, M, 1, 1}, f.bytes.data(), f.bytes.size()};
    f.x.resize(static_cast<size_t>(K * n));
    for (auto& v : f.x) v = g(rng) * 20;
    f.out.resize(static_cast<size_t>(M * n));
    return f;
}

void BM_MatMul(benchmark::State& state, DType t, int64_t n) {
    // 896 is not a multiple of 256, so (as in llama.cpp's Q4_K_M files) the
    // 256-block types get the FFN-down shape 4864 -> 896: same weight bytes.
    const bool k_block = tensor::traits(t).block_size == 256;
    const int64_t K = k_block ? 4864 : 896, M = k_block ? 896 : 4864;
    Fixture f = make(t, K, M, n);
    ThreadPool pool(bench_threads());
    cpu::MatMulPart part{&f.view, 0};
    for (auto _ : state) {
        cpu::matmul(&part, 1, f.x.data(), K, n, f.out.data(), M, pool);
        benchmark::DoNotOptimize(f.out.data());
    }
    const double iters = static_cast<double>(state.iterations());
    if (n == 1) {
        state.counters["GB/s"] = benchmark::Counter(
            static_cast<double>(f.bytes.size()) * iters / 1e9, benchmark::Counter::kIsRate);
    } else {
        state.counters["GOP/s"] =
            benchmark::Counter(2.0 * K * M * n * iters / 1e9, benchmark::Counter::kIsRate);
    }
    state.counters["threads"] = pool.size();
}

void register_all() {
    const DType types[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,
                           DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,   DType::Q3_K,
                           DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};
    for (DType t : types) {
        const std::string name(tensor::dtype_name(t));
        benchmark::RegisterBenchmark(("MatMul/decode/" + name).c_str(), BM_MatMul, t, int64_t{1})
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("MatMul/prefill64/" + name).c_str(), BM_MatMul, t,
                                     int64_t{64})
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
}

// Per-op overhead of the pool: an empty run.
void BM_PoolRun(benchmark::State& state) {
    ThreadPool pool(bench_threads());
    for (auto _ : state) pool.run([](int, int) {});
}
BENCHMARK(BM_PoolRun)->UseRealTime();

}  // namespace

// The shapes are registered at start-up; benchmark_main (linked by CMake)
// runs every benchmark file's registrations.
[[maybe_unused]] const bool kRegistered = (register_all(), true);
