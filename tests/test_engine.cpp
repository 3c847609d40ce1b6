// The many-sequence engine: KV page accounting, batch-invariant logits
// (bitwise, on the f32 tiny model), shared prefixes, forks, cancellation,
// preemption, and a randomized run of hundreds of sequences checked against
// each sequence run alone.
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
#include "engine_test_support.h"
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
using namespace minfer::engine_test;

TEST(Engine, RefusesWhatCanNeverRun) {
    runtime::Engine e(tiny(), small_options(64, 32, 2));
    runtime::GenParams gp;
    EXPECT_THROW(e.submit(gp, {}), Error);  // empty prompt
    gp.prompt.assign(64, 1);
    EXPECT_THROW(e.submit(gp, {}), Error);  // prompt + 1 > n_ctx
    gp.prompt = {1, 2, 99999};
    EXPECT_THROW(e.submit(gp, {}), Error);  // token id
    gp.prompt = {1, 2};
    gp.n_samples = 3;
    EXPECT_THROW(e.submit(gp, {}), Error);  // n_samples > n_parallel
    auto o = small_options(64, 32, 2);
    o.kv_type_v = tensor::DType::F16;
    EXPECT_THROW(runtime::Engine(tiny(), o), Error);  // K and V types differ
    EXPECT_TRUE(e.idle());
}

// Sequences alone, 16 at once, at several -b: every sampled logits row is
// bitwise the row of the sequence run alone.
TEST(Engine, LogitsDoNotDependOnTheBatch) {
    const model::Model& m = tiny();
    std::mt19937 rng(7);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 16; ++i) prompts.push_back(random_tokens(rng, 5 + 13 * i % 70, n_vocab));
    for (tensor::DType kv : {tensor::DType::F32, tensor::DType::F16})
        for (int64_t n_batch : {7, 64, 512}) {
            auto o = small_options(2048, n_batch, 16);
            o.kv_type_k = o.kv_type_v = kv;
            runtime::Engine e(m, o);
            Recorder rec;
            rec.attach(e);
            std::map<runtime::RequestId, size_t> which;
            for (size_t i = 0; i < prompts.size(); ++i) {
                runtime::GenParams gp;
                gp.prompt = prompts[i];
                gp.n_predict = 6;
                gp.sampling.temp = 0.0f;
                const runtime::RequestId id = e.submit(gp, {});
                which[id] = i;
            }
            int guard = 0;
            while (!e.idle() && ++guard < 10000) {
                e.step();
                e.impl().check_pages();
            }
            ASSERT_TRUE(e.idle());
            // Rebuild each sequence's tokens from the recorded argmax, then
            // compare with it alone.
            for (const auto& [id, i] : which) {
                std::vector<int32_t> toks = prompts[i];
                std::vector<std::vector<float>> rows;
                for (int64_t pos = static_cast<int64_t>(toks.size()) - 1;; ++pos) {
                    auto it = rec.rows.find({id, 0, pos});
                    if (it == rec.rows.end()) break;
                    rows.push_back(it->second);
                    toks.push_back(runtime::argmax(it->second));
                }
                ASSERT_EQ(rows.size(), 6u);
                toks.pop_back();
                const std::vector<float> ref = alone(m, toks, 512, kv);
                for (size_t r = 0; r < rows.size(); ++r) {
                    const size_t pos = prompts[i].size() - 1 + r;
                    ASSERT_EQ(0, std::memcmp(rows[r].data(), ref.data() + pos * n_vocab,
                                             static_cast<size_t>(n_vocab) * 4))
                        << "sequence " << i << " row " << r << " -b " << n_batch << " kv "
                        << tensor::dtype_name(kv);
                }
            }
        }
}

// 16 sequences with one 200-token prefix and 8 own tokens: the prefix's full
// pages are computed once and mapped by every other sequence, and the
// logits are still those of each sequence alone.
TEST(Engine, SharedPrefixPagesAreComputedOnce) {
    const model::Model& m = tiny();
    std::mt19937 rng(3);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    const std::vector<int32_t> prefix = random_tokens(rng, 200, n_vocab);
    runtime::Engine e(m, small_options(4096, 256, 16));
    Recorder rec;
    rec.attach(e);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<runtime::RequestResult> results(16);
    int64_t max_used = 0;
    for (int i = 0; i < 16; ++i) {
        std::vector<int32_t> p = prefix;
        const auto own = random_tokens(rng, 8, n_vocab);
        p.insert(p.end(), own.begin(), own.end());
        prompts.push_back(p);
        runtime::GenParams gp;
        gp.prompt = p;
        gp.n_predict = 2;
        gp.sampling.temp = 0.0f;
        runtime::RequestCallbacks cb;
        cb.on_finish = [&results, i](const runtime::RequestResult& r) { results[i] = r; };
        e.submit(gp, cb);
    }
    while (!e.idle()) {
        e.step();
        e.impl().check_pages();
        max_used = std::max(max_used, e.stats().pages_used);
    }
    // 208 tokens = 6 full pages shared + 1 own page each (+1 for the
    // generated token's cell in the same page).
    EXPECT_EQ(results[0].cached_tokens, 0);
    for (int i = 1; i < 16; ++i) EXPECT_EQ(results[i].cached_tokens, 6 * 32) << i;
    EXPECT_LE(max_used, 6 + 16 * 1);
    const auto st = e.stats();
    EXPECT_EQ(st.prefix_hit_tokens, 15 * 6 * 32);
    EXPECT_EQ(st.pages_used, 0);
    EXPECT_GE(st.pages_cached, 6);
    for (int i = 0; i < 16; ++i) ASSERT_TRUE(prompt_row_is_alone(rec, m, i + 1, prompts[i]));
}

// Past the shared full pages, what a running sequence has computed is
// copied, not computed again: the 8 prefix tokens after the last full page
// of a 200-token prefix, and a chat that goes on from a running reply (its
// prompt is the first one's prompt and 20 of its tokens, and more). The
// logits are still bitwise each prompt's own alone, and the pages add up
// after every step.
TEST(Engine, RunningSequencesComputedCellsAreCopiedNotRecomputed) {
    const model::Model& m = tiny();
    std::mt19937 rng(5);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(4096, 256, 4));
    Recorder rec;
    rec.attach(e);
    const std::vector<int32_t> prefix = random_tokens(rng, 200, n_vocab);
    std::map<char, runtime::RequestResult> results;
    std::vector<int32_t> reply;  // the first request's tokens
    auto submit = [&](char name, const std::vector<int32_t>& prompt, bool record) {
        runtime::GenParams gp;
        gp.prompt = prompt;
        gp.n_predict = record ? -1 : 1;
        gp.sampling.temp = 0.0f;
        runtime::RequestCallbacks cb;
        if (record)
            cb.on_token = [&reply](const runtime::TokenEvent& ev) {
                reply.push_back(ev.token);
                return true;
            };
        cb.on_finish = [&results, name](const runtime::RequestResult& r) { results[name] = r; };
        return e.submit(gp, cb);
    };
    auto step_until = [&](const std::function<bool()>& done) {
        for (int i = 0; i < 64 && !done(); ++i) {  // bounded: a bug fails, not hangs
            e.step();
            e.impl().check_pages();
        }
        ASSERT_TRUE(done());
    };
    const std::vector<int32_t> pa = concat(prefix, random_tokens(rng, 8, n_vocab));
    const runtime::RequestId a = submit('a', pa, true);
    step_until([&] { return !reply.empty(); });

    // 6 full pages mapped (192 tokens) + the 8 prefix tokens of page 6 copied.
    const std::vector<int32_t> pb = concat(prefix, random_tokens(rng, 5, n_vocab));
    const runtime::RequestId b = submit('b', pb, false);
    step_until([&] { return results.count('b') != 0; });
    EXPECT_EQ(results['b'].cached_tokens, 200);
    EXPECT_EQ(e.stats().copied_cells, 8);

    // The first request has sampled 20 tokens and computed the cells of 19:
    // 208 + 19 of the new prompt's 231 are there (page 6 whole, 3 of page 7).
    step_until([&] { return reply.size() >= 20; });
    ASSERT_EQ(reply.size(), 20u);
    const std::vector<int32_t> pc = concat(concat(pa, reply), random_tokens(rng, 3, n_vocab));
    const runtime::RequestId c = submit('c', pc, false);
    step_until([&] { return results.count('c') != 0; });
    EXPECT_EQ(results['c'].cached_tokens, 208 + 19);
    EXPECT_EQ(e.stats().copied_cells, 8 + 208 + 19 - 192);

    EXPECT_TRUE(prompt_row_is_alone(rec, m, b, pb));
    EXPECT_TRUE(prompt_row_is_alone(rec, m, c, pc));
    e.cancel(a);
    EXPECT_TRUE(steps_until_idle(e, 4));
    EXPECT_EQ(e.stats().pages_used, 0);
}

// Cells are copied only as far as they are written: a sequence waiting for
// shared pages whose filler was cancelled holds pages nobody will fill (it
// recomputes them once it notices), and a newcomer admitted in that step
// must not copy them. The filler X fills a page a step (-b 32); D maps its
// six prefix pages (one ready); X is cancelled with two ready; S comes with
// the same prefix.
TEST(Engine, NoCellsAreCopiedFromPagesAFillerGaveUp) {
    const model::Model& m = tiny();
    std::mt19937 rng(12);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(4096, 32, 4));
    Recorder rec;
    rec.attach(e);
    const std::vector<int32_t> prefix = random_tokens(rng, 200, n_vocab);
    auto prompt = [&](int n_own) { return concat(prefix, random_tokens(rng, n_own, n_vocab)); };
    auto submit = [&](const std::vector<int32_t>& p) {
        runtime::GenParams gp;
        gp.prompt = p;
        gp.n_predict = 1;
        gp.sampling.temp = 0.0f;
        return e.submit(gp, {});
    };
    const runtime::RequestId x = submit(prompt(8));
    e.step();
    const std::vector<int32_t> pd = prompt(8), ps = prompt(5);
    const runtime::RequestId d = submit(pd);
    e.step();
    e.cancel(x);
    e.impl().check_pages();
    const runtime::RequestId s = submit(ps);
    ASSERT_TRUE(steps_until_idle(e));
    EXPECT_TRUE(prompt_row_is_alone(rec, m, d, pd));
    EXPECT_TRUE(prompt_row_is_alone(rec, m, s, ps));
}

// A finished sequence's full pages stay cached, those it filled while
// generating too: a chat that goes on from its reply (the prompt, the
// reply, more) maps them. 100 prompt tokens + 40 sampled = 139 cells
// computed: 4 full pages (the prompt alone has 3).
TEST(Engine, FinishedReplyPagesStayCachedForTheChatThatGoesOn) {
    const model::Model& m = tiny();
    std::mt19937 rng(8);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(4096, 256, 4));
    Recorder rec;
    rec.attach(e);
    std::vector<int32_t> pa = random_tokens(rng, 100, n_vocab), reply;
    std::vector<runtime::RequestResult> results;
    auto run = [&](const std::vector<int32_t>& prompt, int64_t n_predict) {
        runtime::GenParams gp;
        gp.prompt = prompt;
        gp.n_predict = n_predict;
        gp.sampling.temp = 0.0f;
        runtime::RequestCallbacks cb;
        cb.on_token = [&reply](const runtime::TokenEvent& ev) {
            reply.push_back(ev.token);
            return true;
        };
        cb.on_finish = [&results](const runtime::RequestResult& r) { results.push_back(r); };
        const runtime::RequestId id = e.submit(gp, cb);
        EXPECT_TRUE(steps_until_idle(e));
        return id;
    };
    run(pa, 40);
    ASSERT_EQ(reply.size(), 40u);
    EXPECT_EQ(e.stats().pages_used, 0);
    EXPECT_EQ(e.stats().pages_cached, 4);
    const std::vector<int32_t> pb = concat(concat(pa, reply), random_tokens(rng, 5, n_vocab));
    const runtime::RequestId b = run(pb, 1);
    ASSERT_EQ(results.size(), 2u);
    EXPECT_EQ(results[1].cached_tokens, 4 * 32);
    EXPECT_TRUE(prompt_row_is_alone(rec, m, b, pb));
}

// A prompt joining running decodes: padding its pass by a few tokens beats
// cutting them off into passes of their own (each pass streams all the
// weights), while padding by many is still cut. Passes counted from the
// submit to the prompt's first token; the logits are still bitwise its
// own, alone.
TEST(Engine, PromptJoiningDecodesIsPaddedByAFewTokensNotCut) {
    const model::Model& m = tiny();
    std::mt19937 rng(9);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(4096, 512, 4));
    Recorder rec;
    rec.attach(e);
    runtime::GenParams running;
    running.prompt = random_tokens(rng, 20, n_vocab);
    running.n_predict = -1;
    running.sampling.temp = 0.0f;
    const runtime::RequestId first = e.submit(running, {});
    for (int i = 0; i < 2; ++i) e.step();  // its prompt, then a decode step
    ASSERT_EQ(e.stats().steps, 2);
    auto passes_to_first_token = [&](const std::vector<int32_t>& prompt) {
        runtime::GenParams gp;
        gp.prompt = prompt;
        gp.n_predict = 1;
        gp.sampling.temp = 0.0f;
        bool got = false;
        runtime::RequestCallbacks cb;
        cb.on_token = [&got](const runtime::TokenEvent&) { return got = true; };
        const int64_t before = e.stats().steps;
        const runtime::RequestId id = e.submit(gp, cb);
        for (int i = 0; i < 16 && !got; ++i) e.step();  // bounded: a bug fails, not hangs
        EXPECT_TRUE(got) << prompt.size() << " prompt tokens: no first token in 16 steps";
        return std::make_pair(id, e.stats().steps - before);
    };
    // 40 + 1 decode token: padded to 48, one pass (cut to the bucket below,
    // it took passes of 32, 8, 2 and 2).
    const std::vector<int32_t> p40 = random_tokens(rng, 40, n_vocab);
    const auto [id40, passes40] = passes_to_first_token(p40);
    EXPECT_EQ(passes40, 1);
    // 140 + 1: 192 would pad 51 tokens, so 127 prompt tokens go now (128)
    // and 13 in the next pass (14, padded to 16).
    const std::vector<int32_t> p140 = random_tokens(rng, 140, n_vocab);
    const auto [id140, passes140] = passes_to_first_token(p140);
    EXPECT_EQ(passes140, 2);
    EXPECT_TRUE(prompt_row_is_alone(rec, m, id40, p40));
    EXPECT_TRUE(prompt_row_is_alone(rec, m, id140, p140));
    e.cancel(first);
    for (int i = 0; i < 4 && !e.idle(); ++i) e.step();
    EXPECT_TRUE(e.idle());
    e.impl().check_pages();
}

// Sequences decode together: four prompts of 10 tokens take one pass, then
// every pass has one decode token of each of them (8 samples: 8 passes,
// not 1 + 7 * 4); a 28-token prompt arriving meanwhile shares a pass with
// their four decode tokens (32, no padding) and decodes with them next.
TEST(Engine, SequencesDecodeTogetherAndPromptsShareTheirPass) {
    const model::Model& m = tiny();
    std::mt19937 rng(13);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(1024, 64, 5));
    auto submit = [&](int64_t n_prompt, int64_t n_predict) {
        runtime::GenParams gp;
        gp.prompt = random_tokens(rng, n_prompt, n_vocab);
        gp.n_predict = n_predict;
        gp.sampling.temp = 0.0f;
        e.submit(gp, {});
    };
    for (int i = 0; i < 4; ++i) submit(10, 8);
    // (decode tokens, prompt tokens) of each pass
    std::vector<std::pair<int64_t, int64_t>> passes;
    for (int i = 0; i < 32 && !e.idle(); ++i) {  // bounded: a bug fails, not hangs
        if (passes.size() == 3) submit(28, 2);
        const int64_t before = e.stats().steps;
        e.step();
        e.impl().check_pages();
        const runtime::EngineStats st = e.stats();
        if (st.steps > before)
            passes.emplace_back(st.last_pass_decode_tokens, st.last_pass_prompt_tokens);
    }
    ASSERT_TRUE(e.idle());
    const std::vector<std::pair<int64_t, int64_t>> want{{0, 40}, {4, 0}, {4, 0}, {4, 28},
                                                        {5, 0},  {4, 0}, {4, 0}, {4, 0}};
    EXPECT_EQ(passes, want);
    EXPECT_EQ(e.stats().steps, 8);
    EXPECT_EQ(e.stats().generated_tokens, 4 * 8 + 2);
}

TEST(Engine, CancelFreesPagesAtOnce) {
    runtime::Engine e(tiny(), small_options(512, 64, 4));
    runtime::GenParams gp;
    gp.prompt.assign(100, 5);
    gp.n_predict = -1;
    runtime::FinishReason reason = runtime::FinishReason::Stop;
    int finishes = 0;
    runtime::RequestCallbacks cb;
    cb.on_finish = [&](const runtime::RequestResult& r) {
        reason = r.reason;
        ++finishes;
    };
    const runtime::RequestId id = e.submit(gp, cb);
    for (int i = 0; i < 4; ++i) e.step();
    EXPECT_GT(e.stats().pages_used, 0);
    e.cancel(id);  // between steps: at once
    EXPECT_EQ(e.stats().pages_used, 0);
    e.impl().check_pages();
    e.step();  // the callback runs on the step thread
    EXPECT_EQ(finishes, 1);
    EXPECT_EQ(reason, runtime::FinishReason::Cancelled);
    EXPECT_TRUE(e.idle());
}

namespace {
// One request run alone on a fresh engine: the tokens delivered and its result.
struct Delivered {
    std::vector<int32_t> tokens;
    runtime::RequestResult result;
};
Delivered run_request(const model::Model& m, const runtime::EngineOptions& o,
                      const runtime::GenParams& p) {
    runtime::Engine e(m, o);
    Delivered d;
    d.result.reason = runtime::FinishReason::Error;  // until on_finish says
    runtime::RequestCallbacks cb;
    cb.on_token = [&](const runtime::TokenEvent& ev) {
        d.tokens.push_back(ev.token);
        return true;
    };
    cb.on_finish = [&](const runtime::RequestResult& r) { d.result = r; };
    e.submit(p, cb);
    while (e.step()) {
    }
    EXPECT_EQ(e.stats().pages_used, 0);
    return d;
}
}  // namespace

// ignore_eos: the end-of-generation token is never sampled (its logit is
// masked, as llama.cpp does), so greedy decoding that would stop at once runs
// to n_predict without emitting it; without ignore_eos it stops on it.
TEST(Engine, IgnoreEosNeverSamplesTheEndToken) {
    const model::Model& m = tiny();
    std::mt19937 rng(3);
    runtime::GenParams gp;
    gp.prompt = random_tokens(rng, 20, static_cast<int32_t>(m.hp.n_vocab));
    gp.n_predict = 6;
    gp.sampling.temp = 0.0f;
    // The greedy first token, with no end token at all.
    const std::vector<int32_t> free_run = run_request(m, small_options(256, 64, 2), gp).tokens;
    ASSERT_EQ(free_run.size(), 6u);
    // Make that token the end token.
    runtime::EngineOptions o = small_options(256, 64, 2);
    o.eog_ids = {free_run[0]};
    const Delivered stopped = run_request(m, o, gp);
    EXPECT_EQ(stopped.result.reason, runtime::FinishReason::Stop);
    EXPECT_TRUE(stopped.tokens.empty());  // the end token is not delivered as text
    gp.ignore_eos = true;
    const Delivered ignored = run_request(m, o, gp);
    EXPECT_EQ(ignored.result.reason, runtime::FinishReason::Length);
    ASSERT_EQ(ignored.tokens.size(), 6u);
    for (int32_t t : ignored.tokens) EXPECT_NE(t, free_run[0]);
}

TEST(Engine, NPredictZeroSamplesNothing) {
    // As the CLI's -n 0 (and OpenAI's max_tokens 0): the prompt is run,
    // nothing is sampled or delivered, and the sample ends with Length.
    const model::Model& m = tiny();
    std::mt19937 rng(4);
    runtime::GenParams gp;
    gp.prompt = random_tokens(rng, 20, static_cast<int32_t>(m.hp.n_vocab));
    gp.n_predict = 0;
    const Delivered d = run_request(m, small_options(256, 64, 2), gp);
    EXPECT_EQ(d.result.reason, runtime::FinishReason::Length);
    EXPECT_EQ(d.result.generated, 0);
    EXPECT_TRUE(d.tokens.empty());
}

TEST(Engine, ForkedSamplesSharePromptPages) {
    const model::Model& m = tiny();
    std::mt19937 rng(5);
    runtime::Engine e(m, small_options(1024, 128, 4));
    runtime::GenParams gp;
    gp.prompt = random_tokens(rng, 100, static_cast<int32_t>(m.hp.n_vocab));
    gp.n_predict = 5;
    gp.n_samples = 4;
    gp.sampling.temp = 1.0f;
    gp.sampling.seed = 9;
    std::vector<std::vector<int32_t>> out(4);
    std::vector<int64_t> cached(4, -1);
    runtime::RequestCallbacks cb;
    cb.on_token = [&](const runtime::TokenEvent& ev) {
        out[static_cast<size_t>(ev.sample)].push_back(ev.token);
        return true;
    };
    cb.on_finish = [&](const runtime::RequestResult& r) {
        cached[static_cast<size_t>(r.sample)] = r.cached_tokens;
    };
    Recorder rec;
    rec.attach(e);
    const runtime::RequestId id = e.submit(gp, cb);
    while (!e.idle()) {
        e.step();
        e.impl().check_pages();
    }
    EXPECT_EQ(cached[0], 0);
    for (int k = 1; k < 4; ++k) EXPECT_EQ(cached[static_cast<size_t>(k)], 96);
    for (const auto& o : out) EXPECT_EQ(o.size(), 5u);
    // The prompt's last row: bitwise one row for every sample (the forks
    // computed only their partial last page, over the shared pages).
    const auto& first = rec.rows.at({id, 0, 99});
    for (int k = 1; k < 4; ++k) EXPECT_EQ(rec.rows.at({id, k, 99}), first) << k;
}

// Each sequence samples with its own seed and its own history: a request at
// temperature 1 with a fixed seed and every penalty on (repeat, presence,
// frequency) gives the same tokens alone and among other requests (other
// prompts, seeds and penalties, arriving before and after it), and so does
// each of its forks; the forks of one request differ from one another.
TEST(Engine, EachSequenceSamplesWithItsOwnSeedAndHistory) {
    const model::Model& m = tiny();
    std::mt19937 rng(17);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    const int64_t n_gen = 24;
    auto params = [&](std::vector<int32_t> prompt, uint64_t seed, int32_t n_samples) {
        runtime::GenParams gp;
        gp.prompt = std::move(prompt);
        gp.n_predict = n_gen;
        gp.n_samples = n_samples;
        // the tiny model's logits are far apart: a flat draw (no top-k,
        // top-p, min-p; temperature 2) makes the seed and the penalties count
        gp.sampling.temp = 2.0f;
        gp.sampling.top_k = 0;
        gp.sampling.top_p = 1.0f;
        gp.sampling.min_p = 0.0f;
        gp.sampling.seed = seed;
        gp.sampling.repeat_penalty = 1.3f;
        gp.sampling.repeat_last_n = -1;
        gp.presence_penalty = 0.6f;
        gp.frequency_penalty = 0.4f;
        return gp;
    };
    using Samples = std::vector<std::vector<int32_t>>;
    // Submits each request, runs the engine until idle; the samples of each.
    auto run = [&](const std::vector<runtime::GenParams>& reqs) {
        runtime::Engine e(m, small_options(2048, 64, 12));
        std::vector<Samples> out(reqs.size());
        for (size_t i = 0; i < reqs.size(); ++i) {
            out[i].resize(static_cast<size_t>(reqs[i].n_samples));
            runtime::RequestCallbacks cb;
            cb.on_token = [&out, i](const runtime::TokenEvent& ev) {
                out[i][static_cast<size_t>(ev.sample)].push_back(ev.token);
                return true;
            };
            e.submit(reqs[i], cb);
        }
        EXPECT_TRUE(steps_until_idle(e));
        return out;
    };
    const runtime::GenParams one = params(random_tokens(rng, 12, n_vocab), 1234, 1);
    const runtime::GenParams forks = params(random_tokens(rng, 30, n_vocab), 99, 4);
    const Samples one_alone = run({one})[0];
    const Samples forks_alone = run({forks})[0];
    // Others: their own prompts (one shares the forks' first 20 tokens),
    // seeds and penalties, and one copy of `one` under another seed.
    std::vector<runtime::GenParams> mixed;
    for (int i = 0; i < 3; ++i) {
        runtime::GenParams o = params(random_tokens(rng, 5 + 9 * i, n_vocab), 7 + i, 1 + i % 2);
        o.presence_penalty = 0.1f * static_cast<float>(i);
        mixed.push_back(o);
    }
    mixed[1].prompt.assign(forks.prompt.begin(), forks.prompt.begin() + 20);
    runtime::GenParams other_seed = one;
    other_seed.sampling.seed = 4321;
    mixed.push_back(other_seed);
    mixed.insert(mixed.begin() + 1, one);
    mixed.push_back(forks);
    const std::vector<Samples> together = run(mixed);

    ASSERT_EQ(one_alone[0].size(), static_cast<size_t>(n_gen));
    EXPECT_EQ(together[1], one_alone) << "the request among others";
    EXPECT_EQ(together.back(), forks_alone) << "the forks among others";
    EXPECT_NE(together[4], one_alone) << "another seed draws other tokens";
    for (size_t a = 0; a < forks_alone.size(); ++a) {
        ASSERT_EQ(forks_alone[a].size(), static_cast<size_t>(n_gen));
        for (size_t b = a + 1; b < forks_alone.size(); ++b)
            EXPECT_NE(forks_alone[a], forks_alone[b]) << "forks " << a << " and " << b;
    }
}

// Hundreds of sequences of random lengths, forks, cancels, and a cache so
// small that sequences get preempted: the pages add up after every step,
// and every logits row is bitwise the row of the sequence alone.
// MINFER_RANDOMIZED_REQUESTS sets how many (default 300): under emulation
// (scripts/test_arm64.sh) a shorter run of the same mix.
TEST(Engine, RandomizedAgainstAlone) {
    const model::Model& m = tiny();
    std::mt19937 rng(11);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    runtime::Engine e(m, small_options(640, 48, 12));
    Recorder rec;
    rec.attach(e);
    struct Req {
        std::vector<int32_t> prompt;
        int32_t n_samples;
        bool cancelled = false;
        std::vector<std::vector<int32_t>> tokens;
        std::vector<runtime::FinishReason> reasons;
    };
    std::map<runtime::RequestId, std::shared_ptr<Req>> reqs;
    std::vector<std::vector<int32_t>> bases;  // shared prefixes
    for (int i = 0; i < 4; ++i) bases.push_back(random_tokens(rng, 40 + 30 * i, n_vocab));
    int submitted = 0, steps = 0;
    const char* n_env = std::getenv("MINFER_RANDOMIZED_REQUESTS");
    const int n_total = n_env ? std::atoi(n_env) : 300;
    ASSERT_GE(n_total, 50) << "MINFER_RANDOMIZED_REQUESTS: too few requests to preempt and share";
    while (submitted < n_total || !e.idle()) {
        // Admit a few new requests per step.
        for (int k = std::uniform_int_distribution<int>(0, 3)(rng); k > 0 && submitted < n_total;
             --k, ++submitted) {
            auto r = std::make_shared<Req>();
            if (rng() % 3 == 0) {
                r->prompt = bases[rng() % bases.size()];
                const auto own = random_tokens(rng, 1 + rng() % 20, n_vocab);
                r->prompt.insert(r->prompt.end(), own.begin(), own.end());
            } else {
                r->prompt = random_tokens(rng, 1 + rng() % 150, n_vocab);
            }
            r->n_samples = rng() % 6 == 0 ? 2 + static_cast<int32_t>(rng() % 3) : 1;
            r->tokens.resize(static_cast<size_t>(r->n_samples));
            r->reasons.resize(static_cast<size_t>(r->n_samples), runtime::FinishReason::Error);
            runtime::GenParams gp;
            gp.prompt = r->prompt;
            gp.n_predict = 1 + static_cast<int64_t>(rng() % 40);
            gp.n_samples = r->n_samples;
            gp.sampling.temp = rng() % 2 ? 0.0f : 0.9f;
            gp.sampling.seed = rng();
            gp.sampling.repeat_penalty = rng() % 2 ? 1.0f : 1.1f;
            gp.presence_penalty = rng() % 4 == 0 ? 0.5f : 0.0f;
            runtime::RequestCallbacks cb;
            Req* raw = r.get();
            cb.on_token = [raw](const runtime::TokenEvent& ev) {
                raw->tokens[static_cast<size_t>(ev.sample)].push_back(ev.token);
                return true;
            };
            cb.on_finish = [raw](const runtime::RequestResult& res) {
                raw->reasons[static_cast<size_t>(res.sample)] = res.reason;
            };
            reqs[e.submit(gp, cb)] = r;
        }
        if (rng() % 25 == 0 && !reqs.empty()) {
            auto it = reqs.begin();
            std::advance(it, static_cast<long>(rng() % reqs.size()));
            it->second->cancelled = true;
            e.cancel(it->first);
            e.impl().check_pages();
        }
        e.step();
        e.impl().check_pages();
        ASSERT_LT(++steps, 100000);
    }
    const auto st = e.stats();
    EXPECT_GT(st.preemptions, 0) << "the cache was meant to be too small";
    EXPECT_GT(st.prefix_hit_tokens, 0);
    EXPECT_GT(st.copied_cells, 0) << "shared prefixes meet running sequences: cells copied";
    EXPECT_EQ(st.pages_used, 0);
    // Random arrivals and lengths make many (tokens, logits rows) shapes;
    // the bucketed, cached graphs still serve most steps.
    std::printf(
        "[ info ] %lld steps, %lld graphs built, %lld preemptions, prefix hits %lld / "
        "%lld tokens (%lld copied)\n",
        static_cast<long long>(st.steps), static_cast<long long>(st.graphs_built),
        static_cast<long long>(st.preemptions), static_cast<long long>(st.prefix_hit_tokens),
        static_cast<long long>(st.prefix_lookup_tokens), static_cast<long long>(st.copied_cells));
    EXPECT_LT(st.graphs_built * 4, st.steps) << "token-count buckets";
    // Every sample against itself alone.
    int compared = 0;
    for (const auto& [id, r] : reqs)
        for (int32_t k = 0; k < r->n_samples; ++k) {
            const auto& gen = r->tokens[static_cast<size_t>(k)];
            if (!r->cancelled) {
                EXPECT_NE(r->reasons[static_cast<size_t>(k)], runtime::FinishReason::Error);
            }
            if (gen.empty()) continue;
            std::vector<int32_t> toks = r->prompt;
            toks.insert(toks.end(), gen.begin(), gen.end() - 1);
            const std::vector<float> ref = alone(m, toks, 64, tensor::DType::F32);
            for (size_t g = 0; g < gen.size(); ++g) {
                const int64_t pos = static_cast<int64_t>(r->prompt.size() + g) - 1;
                const auto& row = rec.rows.at({id, k, pos});
                ASSERT_EQ(0, std::memcmp(row.data(), ref.data() + pos * n_vocab,
                                         static_cast<size_t>(n_vocab) * 4))
                    << "request " << id << " sample " << k << " position " << pos;
                ++compared;
            }
        }
    EXPECT_GT(compared, 1000);
}

TEST(Engine, SubmitAndCancelFromOtherThreads) {
    runtime::Engine e(tiny(), small_options(1024, 64, 8));
    std::atomic<int> finished{0};
    std::atomic<bool> stop{false};
    std::thread loop([&] {
        while (!stop) {
            if (!e.step()) e.wait_for_work(5);
        }
    });
    std::vector<std::thread> clients;
    for (int c = 0; c < 4; ++c)
        clients.emplace_back([&, c] {
            for (int i = 0; i < 10; ++i) {
                runtime::GenParams gp;
                gp.prompt.assign(static_cast<size_t>(10 + c * 7 + i), 3 + c);
                gp.n_predict = 8;
                runtime::RequestCallbacks cb;
                cb.on_finish = [&](const runtime::RequestResult&) { ++finished; };
                const auto id = e.submit(gp, cb);
                if (i % 3 == 0) e.cancel(id);
                (void)e.stats();
            }
        });
    for (auto& t : clients) t.join();
    for (int i = 0; i < 2000 && finished < 40; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    stop = true;
    loop.join();
    EXPECT_EQ(finished.load(), 40);
    EXPECT_EQ(e.stats().pages_used, 0);
}

// Quantized models (../shared's qwen2-mini Q8_0 and qwen3-mini Q4_K_M: Q4_K
// and Q6_K), their weights regrouped as the CLI does: decode tokens of 8
// sequences go through the GEMM together (>= 4 tokens) but through the
// one-token kernels alone. Where every weight is batch-invariant at this
// level (cpu::matmul_batch_invariant: on x86-64 Q8_0, Q4_K and Q6_K at
// Avx2 and Avx512) the logits must be bitwise the same; elsewhere (ARM64)
// the greedy text must be, and the largest difference is printed (the
// report quotes it).
TEST(Engine, QuantizedGreedyTextAloneAndBatched) {
    for (const char* file : {"qwen2-mini-q8_0.gguf", "qwen3-mini-q4_k_m.gguf"}) {
        SCOPED_TRACE(file);
        const std::string path = minfer::testing::shared_file(std::string("models/") + file);
        MINFER_REQUIRE_SHARED_FILES(path);
        model::Model m = model::Model::load(path);
        runtime::regroup_weights_for_cpu(m);
        bool invariant = cpu::matmul_batch_invariant(*m.output);
        for (const auto& L : m.layers)
            for (const tensor::TensorView* w : {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down})
                invariant = invariant && cpu::matmul_batch_invariant(*w);
#if defined(__x86_64__)
        if (cpu::isa_level() == cpu::IsaLevel::Avx512 || cpu::isa_level() == cpu::IsaLevel::Avx2) {
            EXPECT_TRUE(invariant) << "regrouped with group kernels at this level";
        }
#endif
        std::mt19937 rng(21);
        const int n_seq = 8, n_gen = 16;
        std::vector<std::vector<int32_t>> prompts;
        for (int i = 0; i < n_seq; ++i)
            prompts.push_back(random_tokens(rng, 20 + 9 * i, static_cast<int32_t>(m.hp.n_vocab)));
        auto o = small_options(4096, 512, n_seq);
        runtime::Engine e(m, o);
        Recorder rec;
        rec.attach(e);
        std::vector<std::vector<int32_t>> batched(n_seq);
        for (int i = 0; i < n_seq; ++i) {
            runtime::GenParams gp;
            gp.prompt = prompts[static_cast<size_t>(i)];
            gp.n_predict = n_gen;
            gp.sampling.temp = 0.0f;
            runtime::RequestCallbacks cb;
            cb.on_token = [&batched, i](const runtime::TokenEvent& ev) {
                batched[static_cast<size_t>(i)].push_back(ev.token);
                return true;
            };
            e.submit(gp, cb);
        }
        while (!e.idle()) e.step();
        double max_diff = 0;
        int n_same = 0;
        for (int i = 0; i < n_seq; ++i) {
            runtime::SessionOptions so;
            so.n_ctx = 512;
            so.n_threads = 2;
            runtime::Session s(m, so);
            std::vector<float> l = s.eval(prompts[static_cast<size_t>(i)]);
            std::vector<int32_t> alone_toks;
            for (int g = 0; g < n_gen; ++g) {
                const int64_t pos =
                    static_cast<int64_t>(prompts[static_cast<size_t>(i)].size()) - 1 + g;
                const int32_t t = runtime::argmax(l);
                const auto& bt = batched[static_cast<size_t>(i)];
                if (alone_toks == std::vector<int32_t>(bt.begin(), bt.begin() + g)) {
                    // same context so far: the rows are comparable
                    const auto& row = rec.rows.at({i + 1, 0, pos});
                    for (size_t v = 0; v < l.size(); ++v)
                        max_diff = std::max(max_diff, std::abs(double{l[v]} - double{row[v]}));
                }
                alone_toks.push_back(t);
                if (g + 1 < n_gen) l = s.eval(std::vector<int32_t>{t});
            }
            n_same += alone_toks == batched[static_cast<size_t>(i)];
            EXPECT_EQ(alone_toks, batched[static_cast<size_t>(i)]) << "sequence " << i;
        }
        std::printf(
            "[ info ] %s at %s: largest |logit alone - logit among 8| = %.3g; greedy "
            "text identical for %d of %d sequences%s\n",
            file, cpu::isa_name(cpu::isa_level()), max_diff, n_same, n_seq,
            invariant ? " (every weight batch-invariant)" : "");
        if (invariant) {
            EXPECT_EQ(max_diff, 0.0);
        }
    }
}

// The batch-invariant option (EngineOptions / SessionOptions; the CLI's
// --batch-invariant, MINFER_BATCH_INVARIANT=1): Q8_0 weights in the file's
// layout (not regrouped) take the GEMM when 4 sequences decode together but
// the one-token dot products when one decodes alone, which sum in another
// order; with the option on in both, every sampled logits row is bitwise
// the alone one. Off, some rows differ (else this test could not fail).
TEST(Engine, BatchInvariantOptionMakesPlainQuantizedWeightsBitwise) {
    TinyModelSpec spec;
    spec.weight_type = tensor::DType::Q8_0;
    spec.n_ctx_train = 512;
    const auto loaded = load(spec);
    const model::Model& m = loaded->model;
    bool plain = false;  // a weight whose one-token path is not the GEMM's
    for (const auto& L : m.layers)
        for (const tensor::TensorView* w : {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down})
            plain = plain || !cpu::matmul_batch_invariant(*w);
    if (!plain) GTEST_SKIP() << "no Q8_0 GEMM at this kernel level: every count is invariant";
    std::mt19937 rng(23);
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    const int n_seq = 4, n_gen = 6;
    std::vector<std::vector<int32_t>> prompts;
    // 62 prompt tokens: one pass (64), then the four decode together
    for (int i = 0; i < n_seq; ++i) prompts.push_back(random_tokens(rng, 8 + 5 * i, n_vocab));
    std::map<bool, int> differing;  // rows unlike the alone ones, by the option
    for (bool invariant : {false, true}) {
        auto o = small_options(1024, 128, n_seq);
        o.batch_invariant = invariant;
        runtime::Engine e(m, o);
        Recorder rec;
        rec.attach(e);
        std::vector<runtime::RequestId> ids;
        for (const auto& p : prompts) {
            runtime::GenParams gp;
            gp.prompt = p;
            gp.n_predict = n_gen;
            gp.sampling.temp = 0.0f;
            ids.push_back(e.submit(gp, {}));
        }
        ASSERT_TRUE(steps_until_idle(e));
        ASSERT_EQ(e.stats().steps, n_gen) << "the four decode together";
        for (int i = 0; i < n_seq; ++i) {
            // Alone: the prompt in one pass, then one token a pass.
            runtime::SessionOptions so;
            so.n_ctx = 256;
            so.n_threads = 2;
            so.kv_type = tensor::DType::F32;
            so.batch_invariant = invariant;
            runtime::Session s(m, so);
            const auto& prompt = prompts[static_cast<size_t>(i)];
            std::vector<float> l = s.eval(prompt);
            for (int g = 0; g < n_gen; ++g) {
                const int64_t pos = static_cast<int64_t>(prompt.size()) - 1 + g;
                const auto& row = rec.rows.at({ids[static_cast<size_t>(i)], 0, pos});
                if (std::memcmp(row.data(), l.data(), l.size() * 4) != 0) {
                    ++differing[invariant];
                    break;  // the contexts may part from here on
                }
                const int32_t t = runtime::argmax(l);
                if (g + 1 < n_gen) l = s.eval(std::vector<int32_t>{t});
            }
        }
    }
    EXPECT_GT(differing[false], 0) << "off: the decode's one-token kernels are not the GEMM";
    EXPECT_EQ(differing[true], 0) << "on: every row bitwise the sequence's alone";
}

// minfer batched-bench -o json: one JSON object per line on stdout and
// nothing else, llama-batched-bench's fields, pl an integer; the table on
// stderr; exit 0. With -pps the shared prompt's full pages are mapped.
TEST(BatchedBench, JsonLinesOnStdout) {
    auto r = minfer::testing::run_cli(
        "batched-bench -c 1024 -b 64 -t 2 -npp 40 -ntg 4 -npl 1,3 -o json -pps");
    ASSERT_EQ(r.code, 0) << r.err;
    std::istringstream lines(r.out);
    std::string line;
    std::vector<int64_t> pls;
    while (std::getline(lines, line)) {
        const nlohmann::json j = nlohmann::json::parse(line);  // throws on anything else
        for (const char* f :
             {"pp", "tg", "pl", "n_kv", "t_pp", "speed_pp", "t_tg", "speed_tg", "t", "speed"})
            EXPECT_TRUE(j.contains(f)) << f;
        EXPECT_TRUE(j["pl"].is_number_integer());
        EXPECT_EQ(j["pp"], 40);
        EXPECT_EQ(j["n_kv"], 40 + j["pl"].get<int64_t>() * 4);  // -pps: PP + B*TG
        EXPECT_GT(j["speed_tg"].get<double>(), 0.0);
        pls.push_back(j["pl"].get<int64_t>());
    }
    EXPECT_EQ(pls, (std::vector<int64_t>{1, 3}));
    EXPECT_NE(r.err.find("S_TG t/s"), std::string::npos) << "the table goes to stderr";
    // -pps: of each B's sequences the first computes the prompt, the others
    // map its full page (32 tokens; admitted with it, nothing to copy yet);
    // 39 of each prompt's 40 tokens could have come from the cache.
    EXPECT_NE(r.err.find("prefix hits 64 of 156 tokens (0 copied)"), std::string::npos) << r.err;
}
