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

#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/vec_ops.h"
#include "ir/kv_layout.h"
#include "tensor/dtype.h"
#include "tensor/interleave.h"
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

void BM_MatMul(benchmark::State& state, DType t, int64_t n, bool interleaved, bool output) {
    // 896 is not a multiple of 256, so (as in llama.cpp's Q4_K_M files) the
    // 256-block types get the FFN-down shape 4864 -> 896: same weight bytes.
    // output: Qwen3-0.6B's output matrix (1024 -> 151936, ~130 MB: from DRAM).
    const bool k_block = tensor::traits(t).block_size == 256;
    const int64_t K = output    ? 1024
                      : k_block ? 4864
                                : 896,
                  M = output    ? 151936
                      : k_block ? 896
                                : 4864;
    Fixture f = make(t, K, M, n);
    std::vector<uint8_t> regrouped;
    if (interleaved) {  // as Model::interleave_weights leaves it
        regrouped.resize(f.bytes.size());
        tensor::interleave_rows(t, f.bytes.data(), K, M, regrouped.data());
        f.view.data = regrouped.data();
        f.view.layout = tensor::TensorView::Layout::Rows16;
    }
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
        benchmark::RegisterBenchmark(("MatMul/decode/" + name).c_str(), BM_MatMul, t, int64_t{1},
                                     false, false)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("MatMul/prefill64/" + name).c_str(), BM_MatMul, t,
                                     int64_t{64}, false, false)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    // The pp512 shape of the types in the Q8_0 and Q4_K_M files (the GEMM
    // path on AVX-512 VNNI).
    for (DType t : {DType::Q8_0, DType::Q5_0, DType::Q4_K, DType::Q6_K}) {
        const std::string name(tensor::dtype_name(t));
        benchmark::RegisterBenchmark(("MatMul/prefill512/" + name).c_str(), BM_MatMul, t,
                                     int64_t{512}, false, false)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    for (bool il : {false, true})
        for (DType t : {DType::Q8_0, DType::Q6_K})
            benchmark::RegisterBenchmark(("MatMul/output" + std::string(il ? "16/" : "/") +
                                          std::string(tensor::dtype_name(t)))
                                             .c_str(),
                                         BM_MatMul, t, int64_t{1}, il, true)
                ->Unit(benchmark::kMillisecond)
                ->UseRealTime();
    // The interleaved layout (tensor/interleave.h) of the types that have one.
    for (DType t : {DType::Q8_0, DType::Q5_0, DType::Q4_K, DType::Q6_K}) {
        const std::string name(tensor::dtype_name(t));
        benchmark::RegisterBenchmark(("MatMul/decode16/" + name).c_str(), BM_MatMul, t, int64_t{1},
                                     true, false)
            ->Unit(benchmark::kMicrosecond)
            ->UseRealTime();
        benchmark::RegisterBenchmark(("MatMul/prefill512x16/" + name).c_str(), BM_MatMul, t,
                                     int64_t{512}, true, false)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
    }
    // A decode step of 8 sequences (the GEMM at a few tokens), in the file's
    // layout and regrouped.
    for (bool il : {false, true})
        for (DType t : {DType::Q8_0, DType::Q4_K, DType::Q6_K})
            benchmark::RegisterBenchmark(("MatMul/batch8" + std::string(il ? "x16/" : "/") +
                                          std::string(tensor::dtype_name(t)))
                                             .c_str(),
                                         BM_MatMul, t, int64_t{8}, il, false)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
    // The output matrix for 8 sequences: the weights stream from DRAM.
    benchmark::RegisterBenchmark("MatMul/output16x8/q8_0", BM_MatMul, DType::Q8_0, int64_t{8}, true,
                                 true)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
}

// One layer's causal attention: n tokens after `depth` cached ones, random
// q, K and V (f32 or f16 cache); GOP/s counts the score and sum
// multiply-adds (2 * 2 * head_dim per (token, head, key)).
// With `cold`, each timed pass starts with K and V out of every cache (a
// 64 MB buffer is written between passes), as in a decode step, where a
// layer's weights stream through the caches between its attention calls.
void run_attn(benchmark::State& state, int64_t n_head, int64_t n_head_kv, int64_t hd, int64_t n,
              int64_t depth, tensor::DType kv_type, bool cold = false) {
    // cells: whole K blocks (ir/kv_layout.h)
    const int64_t n_ctx =
        (depth + n + graph::kKBlockCells - 1) / graph::kKBlockCells * graph::kKBlockCells;
    const int64_t nq = n_head * hd, kv = n_head_kv * hd;
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> q(static_cast<size_t>(nq * n)), out(q.size());
    const size_t es = kv_type == DType::F16 ? 2 : 4;
    std::vector<uint8_t> K(static_cast<size_t>(kv * n_ctx) * es), V(K.size());
    for (auto& x : q) x = u(rng);
    for (size_t i = 0; i < K.size() / es; ++i) {
        const float a = u(rng), b = u(rng);
        if (es == 2) {
            reinterpret_cast<uint16_t*>(K.data())[i] = tensor::fp32_to_fp16(a);
            reinterpret_cast<uint16_t*>(V.data())[i] = tensor::fp32_to_fp16(b);
        } else {
            reinterpret_cast<float*>(K.data())[i] = a;
            reinterpret_cast<float*>(V.data())[i] = b;
        }
    }
    std::vector<int32_t> pos(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pos[static_cast<size_t>(i)] = static_cast<int32_t>(depth + i);
    graph::Node node;
    node.op = graph::Op::Attn;
    node.name = "attn";
    node.ne = {nq, n, 1, 1};
    node.meta.n_head = static_cast<int32_t>(n_head);
    node.meta.n_head_kv = static_cast<int32_t>(n_head_kv);
    node.meta.head_dim = static_cast<int32_t>(hd);
    node.meta.n_ctx = n_ctx;
    node.meta.kv_type = kv_type;
    cpu::NodeData d;
    d.src = {q.data(), nullptr, pos.data()};
    d.src_ne = {{nq, n, 1, 1}, {kv, n_ctx, 1, 1}, {n, 1, 1, 1}};
    d.out = out.data();
    d.k = K.data();
    d.v = V.data();
    ThreadPool pool(bench_threads());
    std::vector<uint8_t> evict(cold ? size_t{64} << 20 : 0);
    for (auto _ : state) {
        if (cold) {
            state.PauseTiming();
            for (size_t i = 0; i < evict.size(); i += 64) evict[i] = static_cast<uint8_t>(i >> 6);
            benchmark::ClobberMemory();
            state.ResumeTiming();
        }
        cpu::run_node(node, d, pool);
        benchmark::DoNotOptimize(out.data());
    }
    const double pairs = (static_cast<double>(n) * static_cast<double>(depth) +
                          static_cast<double>(n) * (n + 1) / 2) *
                         static_cast<double>(n_head);
    state.counters["GOP/s"] = benchmark::Counter(4.0 * hd * pairs * state.iterations() / 1e9,
                                                 benchmark::Counter::kIsRate);
}

// A 512-token prompt from an empty cache, Qwen2.5-0.5B's heads (14 q / 2 kv,
// head_dim 64), f32 or f16 cache.
void BM_Attn(benchmark::State& state, tensor::DType kv_type) {
    run_attn(state, 14, 2, 64, 512, 0, kv_type);
}
BENCHMARK_CAPTURE(BM_Attn, f32, tensor::DType::F32)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_Attn, f16, tensor::DType::F16)->Unit(benchmark::kMillisecond)->UseRealTime();
// The same prompt with Qwen3-0.6B's heads (16 q / 8 kv, head_dim 128).
void BM_AttnQwen3(benchmark::State& state, tensor::DType kv_type) {
    run_attn(state, 16, 8, 128, 512, 0, kv_type);
}
BENCHMARK_CAPTURE(BM_AttnQwen3, f32, tensor::DType::F32)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_AttnQwen3, f16, tensor::DType::F16)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// At depth: n tokens (args: 512 = a prompt chunk, 1 = a decode step) after
// 4096 cached ones, f16 cache, the heads of Qwen2.5-0.5B (14 q / 2 kv,
// head_dim 64) or Qwen3-0.6B (16 / 8, 128). MINFER_CPU=avx2 | scalar caps the
// kernels (compare the levels).
void BM_AttnDepth(benchmark::State& state, int64_t n_head, int64_t n_head_kv, int64_t hd) {
    run_attn(state, n_head, n_head_kv, hd, state.range(0), 4096, DType::F16);
}
BENCHMARK_CAPTURE(BM_AttnDepth, qwen25, 14, 2, 64)
    ->Arg(512)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK_CAPTURE(BM_AttnDepth, qwen3, 16, 8, 128)
    ->Arg(512)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A decode step at depth 256 or 1024 (args) with K and V cold, Qwen3-0.6B's
// heads: what a decode token's attention costs inside a whole model.
void BM_AttnDecodeCold(benchmark::State& state) {
    run_attn(state, 16, 8, 128, 1, state.range(0), DType::F16, true);
}
BENCHMARK(BM_AttnDecodeCold)
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(200)  // each pass also writes 64 MB, untimed
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// SwiGLU over one prefill FFN row block (4864 x 64): GB/s of the three streams.
void BM_SwiGLU(benchmark::State& state) {
    const int64_t n = 4864 * 64;
    std::vector<float> a(static_cast<size_t>(n), 0.5f), b(a.size(), 2.0f), y(a.size());
    for (auto _ : state) {
        cpu::swiglu_row(a.data(), b.data(), y.data(), n);
        benchmark::DoNotOptimize(y.data());
    }
    state.counters["GB/s"] =
        benchmark::Counter(12.0 * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SwiGLU)->UseRealTime();

// Per-op overhead of the pool: an empty run.
void BM_PoolRun(benchmark::State& state) {
    ThreadPool pool(bench_threads());
    for (auto _ : state) pool.run([](int, int) {});
}
BENCHMARK(BM_PoolRun)->UseRealTime();

// The memory roofline: streaming reads of 1 GiB (far past the caches) by the
// pool's threads, each summing its own contiguous half as the decode
// matmuls do. Token generation cannot read weights faster than this.
// `prefetch`: the loop also asks for the line 8 KB ahead, as the K-quant
// decode kernels do (x86/intrinsics.h's prefetch_ahead); on some hosts only
// that reaches the memory's rate.
void BM_MemRead(benchmark::State& state, bool prefetch) {
    ThreadPool pool(bench_threads());
    const size_t n = (size_t{1} << 30) / sizeof(uint64_t);
    std::vector<uint64_t> buf(n, 1);
    std::vector<uint64_t> sums(static_cast<size_t>(pool.size()) * 8);
    for (auto _ : state) {
        pool.run([&](int ith, int nth) {
            const size_t b = n / static_cast<size_t>(nth) * static_cast<size_t>(ith);
            const size_t e = ith == nth - 1 ? n : b + n / static_cast<size_t>(nth);
            uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
            for (size_t i = b; i + 4 <= e; i += 4) {
                if (prefetch && i % 8 == 0) __builtin_prefetch(buf.data() + i + 1024);
                s0 += buf[i];
                s1 += buf[i + 1];
                s2 += buf[i + 2];
                s3 += buf[i + 3];
            }
            sums[static_cast<size_t>(ith) * 8] = s0 + s1 + s2 + s3;
        });
        benchmark::DoNotOptimize(sums.data());
    }
    state.counters["GB/s"] = benchmark::Counter(
        static_cast<double>(n * sizeof(uint64_t)) * static_cast<double>(state.iterations()) / 1e9,
        benchmark::Counter::kIsRate);
    state.counters["threads"] = pool.size();
}
BENCHMARK_CAPTURE(BM_MemRead, plain, false)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_MemRead, prefetched, true)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

// The shapes are registered at start-up; benchmark_main (linked by CMake)
// runs every benchmark file's registrations.
[[maybe_unused]] const bool kRegistered = (register_all(), true);
