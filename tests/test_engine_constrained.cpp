// Constrained (structured-output) sequences in the engine: bitwise alone and
// batched, grammar state kept across preemption, a constraint of another
// vocabulary refused.
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

// ---- constrained sequences (structured output) ----------------------------------

namespace {

// The tiny model's vocabulary as token bytes, and a JSON schema compiled for it.
std::shared_ptr<const structured::Constraint> tiny_constraint(const std::string& schema) {
    static const auto vocab = std::make_shared<const structured::TokenVocab>(
        structured::TokenVocab::from_tokenizer(tokenizer::Tokenizer::from_gguf(tiny().file)));
    return structured::compile_constraint(structured::json_schema_text_to_gbnf(schema), vocab);
}

const char* const kTinySchema =
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},)"
    R"( "n": {"type": "integer", "minimum": 0, "maximum": 999},)"
    R"( "tags": {"type": "array", "items": {"enum": ["a", "bc", "the"]}, "maxItems": 3}},)"
    R"( "required": ["name", "n", "tags"], "additionalProperties": false})";

struct Output {
    std::vector<int32_t> tokens;
    runtime::RequestResult result;
};

// Submits `gp` to `e` with callbacks that fill `r`.
runtime::RequestId submit_into(runtime::Engine& e, const runtime::GenParams& gp, Output& r) {
    runtime::RequestCallbacks cb;
    cb.on_token = [&r](const runtime::TokenEvent& ev) {
        r.tokens.push_back(ev.token);
        return true;
    };
    cb.on_finish = [&r](const runtime::RequestResult& res) { r.result = res; };
    return e.submit(gp, cb);
}

// The request alone in an engine of its own.
Output run_alone(const runtime::GenParams& gp) {
    runtime::Engine e(tiny(), small_options(1024, 512, 1));
    Output r;
    submit_into(e, gp, r);
    EXPECT_TRUE(steps_until_idle(e, 400));
    return r;
}

// A constrained output: Stop with its text a sentence of the grammar (and
// JSON that has the schema's keys), or Length with a prefix of one.
::testing::AssertionResult valid_output(const structured::Constraint& c, const Output& r) {
    const auto tok = tokenizer::Tokenizer::from_gguf(tiny().file);
    structured::Matcher m(c.grammar, 0);
    std::string text;
    for (int32_t t : r.tokens) {
        if (!c.masker->accept_token(m, t))
            return ::testing::AssertionFailure()
                   << "token " << t << " refused after '" << text << "'";
        text += tok.token_to_piece(t, false);
    }
    if (r.result.reason == runtime::FinishReason::Length) return ::testing::AssertionSuccess();
    if (r.result.reason != runtime::FinishReason::Stop || !m.is_complete())
        return ::testing::AssertionFailure()
               << runtime::finish_reason_name(r.result.reason) << " with '" << text << "'";
    const auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.contains("name") || !j.contains("n") || !j.contains("tags"))
        return ::testing::AssertionFailure() << "not the schema's object: '" << text << "'";
    return ::testing::AssertionSuccess();
}

}  // namespace

// 8 constrained samples (greedy and drawn) among 4 unconstrained ones, at -b 7
// and 512: each sampled logits row is bitwise the sequence's own alone (the
// mask works on the sampler's copy), each sample's tokens are those it gets
// alone in an engine, every output is a sentence of the grammar or cut by
// n_predict, and every constrained sample's mask was ready when its logits
// came (computed on the mask thread during the pass).
TEST(Engine, ConstrainedSequencesAloneAndBatchedAreBitwise) {
    const model::Model& m = tiny();
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    const auto c = tiny_constraint(kTinySchema);
    std::mt19937 rng(17);
    std::vector<runtime::GenParams> reqs;
    for (int i = 0; i < 12; ++i) {
        runtime::GenParams gp;
        gp.prompt = random_tokens(rng, 3 + 11 * i % 40, n_vocab);
        gp.n_predict = 90;
        gp.sampling.temp = i % 2 ? 1.0f : 0.0f;
        gp.sampling.seed = 100 + static_cast<uint64_t>(i);
        if (i % 3 != 2) gp.constraint = c;
        reqs.push_back(gp);
    }
    std::vector<Output> alone_runs;
    for (const auto& gp : reqs) alone_runs.push_back(run_alone(gp));
    int stopped = 0;
    for (int64_t n_batch : {7, 512}) {
        runtime::Engine e(m, small_options(2048, n_batch, 12));
        Recorder rec;
        rec.attach(e);
        int64_t not_ready = 0;
        auto hook = e.impl().logits_hook;
        e.impl().logits_hook = [&](runtime::RequestId id, int32_t sample, int64_t pos,
                                   std::span<const float> l) {
            for (const auto& s : e.impl().seqs)
                if (s->req->id == id && s->sample == sample && s->sampler->constrained() &&
                    !s->sampler->mask_ready())
                    ++not_ready;
            hook(id, sample, pos, l);
        };
        std::vector<Output> runs(reqs.size());
        std::vector<runtime::RequestId> ids;
        for (size_t i = 0; i < reqs.size(); ++i) ids.push_back(submit_into(e, reqs[i], runs[i]));
        ASSERT_TRUE(steps_until_idle(e, 400));
        EXPECT_EQ(not_ready, 0) << "masks computed after the pass, not during it";
        for (size_t i = 0; i < reqs.size(); ++i) {
            SCOPED_TRACE("request " + std::to_string(i) + " -b " + std::to_string(n_batch));
            const Output& r = runs[i];
            EXPECT_EQ(r.tokens, alone_runs[i].tokens);
            EXPECT_EQ(r.result.reason, alone_runs[i].result.reason);
            ASSERT_FALSE(r.tokens.empty());
            std::vector<int32_t> toks = reqs[i].prompt;
            toks.insert(toks.end(), r.tokens.begin(), r.tokens.end() - 1);
            const std::vector<float> ref = alone(m, toks, 512, tensor::DType::F32);
            for (size_t g = 0; g < r.tokens.size(); ++g) {
                const int64_t pos = static_cast<int64_t>(reqs[i].prompt.size() + g) - 1;
                ASSERT_EQ(
                    0, std::memcmp(rec.rows.at({ids[i], 0, pos}).data(), ref.data() + pos * n_vocab,
                                   static_cast<size_t>(n_vocab) * 4))
                    << "position " << pos;
            }
            if (!reqs[i].constraint) {
                EXPECT_TRUE(r.result.mask_us.empty());
                continue;
            }
            EXPECT_TRUE(valid_output(*c, r));
            stopped += r.result.reason == runtime::FinishReason::Stop;
            // One mask per sampled token (an end token is sampled, not delivered).
            EXPECT_EQ(static_cast<int64_t>(r.result.mask_us.size()), r.result.generated);
            EXPECT_GE(r.tokens.size() + 1, r.result.mask_us.size());
        }
    }
    EXPECT_GT(stopped, 8) << "most constrained outputs complete within 90 tokens";
}

// Constrained sequences in a cache too small for all of them: preempted
// ones give their pages back and resume later from their grammar state (in
// the sampler they keep), so each still produces exactly its output alone.
TEST(Engine, PreemptedConstrainedSequencesResumeTheirGrammarState) {
    const model::Model& m = tiny();
    const auto n_vocab = static_cast<int32_t>(m.hp.n_vocab);
    const auto c = tiny_constraint(kTinySchema);
    std::mt19937 rng(23);
    std::vector<runtime::GenParams> reqs;
    for (int i = 0; i < 6; ++i) {
        runtime::GenParams gp;
        gp.prompt = random_tokens(rng, 20 + 7 * i, n_vocab);
        gp.n_predict = 90;
        gp.sampling.temp = i % 2 ? 0.9f : 0.0f;
        gp.sampling.seed = 7 + static_cast<uint64_t>(i);
        gp.constraint = c;
        reqs.push_back(gp);
    }
    // 6 pages of 32 cells: at most two or three sequences at once.
    runtime::Engine e(m, small_options(192, 64, 6));
    std::vector<Output> runs(reqs.size());
    for (size_t i = 0; i < reqs.size(); ++i) submit_into(e, reqs[i], runs[i]);
    ASSERT_TRUE(steps_until_idle(e, 2000));
    EXPECT_GT(e.stats().preemptions, 0) << "the cache was meant to be too small";
    int stopped = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        stopped += runs[i].result.reason == runtime::FinishReason::Stop;
        const Output alone_run = run_alone(reqs[i]);
        EXPECT_EQ(runs[i].tokens, alone_run.tokens);
        EXPECT_EQ(runs[i].result.reason, alone_run.result.reason);
        EXPECT_TRUE(valid_output(*c, runs[i]));
    }
    std::printf("[ info ] %lld preemptions; %d of 6 outputs complete, e.g. %s\n",
                static_cast<long long>(e.stats().preemptions), stopped,
                tokenizer::Tokenizer::from_gguf(m.file).decode(runs[0].tokens).c_str());
}

// A constraint for another vocabulary is refused at submit, naming both sizes.
TEST(Engine, RefusesAConstraintOfAnotherVocabulary) {
    std::vector<std::string> bytes(static_cast<size_t>(tiny().hp.n_vocab) + 5, "a");
    auto vocab = std::make_shared<const structured::TokenVocab>(
        structured::TokenVocab::from_bytes(bytes, {}, {}));
    runtime::Engine e(tiny(), small_options(64, 32, 1));
    runtime::GenParams gp;
    gp.prompt = {1, 2};
    gp.constraint = structured::compile_constraint("root ::= \"a\"\n", vocab);
    try {
        e.submit(gp, {});
        ADD_FAILURE() << "submitted";
    } catch (const Error& err) {
        EXPECT_NE(std::string(err.what()).find("vocabulary"), std::string::npos) << err.what();
    }
}
