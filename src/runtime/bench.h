// Whole-model throughput as llama-bench measures it: a prompt test (ppN: N
// random tokens, logits of the last row only) and a generation test (tgN: N
// single-token passes), each repeated after one warm-up run, timed without
// loading or tokenization. With a depth D (llama-bench's -d) every test
// starts with D tokens already in the cache: they are evaluated once, untimed,
// and every repetition truncates the sequence back to D (the rows the test
// wrote are overwritten by the next one), so it attends over D + its own.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "util/thread_pool.h"

namespace minfer::runtime {

struct BenchParams {
    int64_t n_prompt = 512;  // 0: no prompt test
    int64_t n_gen = 128;     // 0: no generation test
    int64_t n_depth = 0;     // tokens in the cache before each test (untimed)
    int reps = 5;
    uint32_t seed = 42;  // of the random token ids
    // Generation: also time a streaming read of the weights before the
    // first repetition and after each one (BenchResult::read_gbps).
    bool roofline = false;
    SessionOptions session;  // n_ctx is set to n_depth + n_prompt + n_gen
    // Called with the session before the first test and after the last one
    // (the memory report attaches its recorders and prints through these).
    std::function<void(Session&)> on_start, on_finish;
};

struct BenchResult {
    std::string test;  // "pp512" / "tg128" / "pp512 @ d4096"
    int64_t n_prompt = 0;
    int64_t n_gen = 0;
    int64_t n_depth = 0;
    std::vector<double> samples_ts;  // tokens/s of each repetition
    double avg_ts = 0, stddev_ts = 0;
    // Generation: weight bytes streamed per token times tokens/s.
    double gbps = 0;
    // With BenchParams::roofline, per repetition: its weight bytes per
    // second (decode_bytes_per_token times its tokens/s), and the host's
    // streaming-read rate around it, the larger of the reads just before and
    // just after it (stream_weights_gbps), both in GB/s.
    std::vector<double> samples_gbps, read_gbps;
    // Prompt: matmul + attention operations (2 per multiply-add) per second.
    double gops = 0;
};

// Bytes of weights one decode step reads: every matrix and vector except the
// token-embedding table (one row of it is read), which counts in full when
// the output matrix is tied to it.
double decode_bytes_per_token(const model::Model& model);
// Operations (2 per multiply-add) of a prompt pass of n tokens after n_depth
// cached ones: the weight matmuls and the causal attention scores and sums.
// The logits matmul counts one row (only the last row is computed).
double prompt_ops(const model::Model& model, int64_t n_tokens, int64_t n_depth = 0);
// The streaming-read rate of the host at this moment, in GB/s: the pool's
// threads read up to `limit` bytes of the model's weights (the decode's
// bytes, where the decode finds them), each a contiguous share, summing
// 64-bit words, pass after pass for half a second: the mean rate. Read next
// to a decode run it is that run's roofline,
// measured through the same drift of the host's bandwidth (which moves by
// more than a tenth within minutes on shared hosts).
double stream_weights_gbps(const model::Model& model, ThreadPool& pool,
                           size_t limit = size_t{1} << 30);
// Number of weight elements (llama-bench's "params").
int64_t model_params(const model::Model& model);

// Runs the requested tests; progress goes nowhere (the caller prints).
std::vector<BenchResult> run_bench(const model::Model& model, const BenchParams& params);

}  // namespace minfer::runtime
