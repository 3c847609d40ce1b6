// What the engine tests share: the tiny f32 model (loaded once), small engine
// options, random prompts, a sequence's logits alone in a session, a recorder of
// the rows an engine sampled from, and stepping an engine until it is idle with
// its page accounting checked after every step.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <tuple>
#include <vector>

#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/engine_impl.h"
#include "runtime/session.h"
#include "tensor/dtype.h"
#include "tiny_model.h"

namespace minfer::engine_test {

using minfer::testing::TinyModelSpec;

using Loaded = minfer::testing::LoadedTinyModel;
inline auto load(const TinyModelSpec& s) {
    return minfer::testing::load_tiny_model(s);
}

inline const model::Model& tiny() {
    static std::unique_ptr<Loaded> l = [] {
        TinyModelSpec s;
        s.n_ctx_train = 4096;
        return load(s);
    }();
    return l->model;
}

inline runtime::EngineOptions small_options(int64_t n_ctx, int64_t n_batch, int32_t n_parallel) {
    runtime::EngineOptions o;
    o.n_ctx = n_ctx;
    o.n_batch = n_batch;
    o.n_parallel = n_parallel;
    o.n_threads = 2;
    o.kv_type_k = o.kv_type_v = tensor::DType::F32;
    o.eog_ids = {-1};  // no end-of-generation token: lengths are the test's
    return o;
}

inline std::vector<int32_t> random_tokens(std::mt19937& rng, int64_t n, int32_t n_vocab) {
    std::uniform_int_distribution<int32_t> d(0, n_vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = d(rng);
    return t;
}

// Logits of every position of `tokens`, the sequence alone in a session
// (the same paged machinery, one sequence).
inline std::vector<float> alone(const model::Model& m, const std::vector<int32_t>& tokens,
                                int64_t n_batch, tensor::DType kv) {
    runtime::SessionOptions o;
    o.n_ctx = static_cast<int64_t>(tokens.size()) + 1;
    o.n_batch = n_batch;
    o.n_threads = 2;
    o.kv_type = kv;
    runtime::Session s(m, o);
    return s.eval(tokens, true);
}

// Every logits row an engine sampled from, by (request, sample, position).
struct Recorder {
    std::map<std::tuple<runtime::RequestId, int32_t, int64_t>, std::vector<float>> rows;
    void attach(runtime::Engine& e) {
        e.impl().logits_hook = [this](runtime::RequestId id, int32_t sample, int64_t pos,
                                      std::span<const float> l) {
            rows[{id, sample, pos}] = std::vector<float>(l.begin(), l.end());
        };
    }
};

// Steps until the engine is idle, checking the page accounting after every
// step; at most max_steps (a scheduling bug fails the test, not hangs it).
inline ::testing::AssertionResult steps_until_idle(runtime::Engine& e, int max_steps = 64) {
    for (int i = 0; i < max_steps && !e.idle(); ++i) {
        e.step();
        e.impl().check_pages();
    }
    if (e.idle()) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "not idle after " << max_steps << " steps";
}

// a, then b.
inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// True when the logits `rec` recorded for the last prompt token of request
// `id` (sample 0) are bitwise the prompt's own, alone in a session.
inline ::testing::AssertionResult prompt_row_is_alone(const Recorder& rec, const model::Model& m,
                                                      runtime::RequestId id,
                                                      const std::vector<int32_t>& prompt) {
    const auto n_vocab = static_cast<size_t>(m.hp.n_vocab);
    const auto& row = rec.rows.at({id, 0, static_cast<int64_t>(prompt.size()) - 1});
    const std::vector<float> ref = alone(m, prompt, 512, tensor::DType::F32);
    if (std::memcmp(row.data(), ref.data() + (prompt.size() - 1) * n_vocab, n_vocab * 4) == 0)
        return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << "request " << id << " (" << prompt.size()
                                         << " prompt tokens): its last row differs from alone";
}

}  // namespace minfer::engine_test
