#include <gtest/gtest.h>

#include <map>

#include "runtime/sample_text.h"
#include "runtime/sampler.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"

using namespace minfer::runtime;

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
    SamplerParams p;
    p.temp = 0;
    Sampler s(p);
    std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
    EXPECT_EQ(s.sample(l), 1);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegative) {
    SamplerParams p;
    p.temp = 0;
    p.repeat_penalty = 2.0f;
    Sampler s(p);
    // token 0 leads (3.0) but was seen: 3.0 / 2 = 1.5 < 2.0, so token 1 wins.
    s.accept(0);
    EXPECT_EQ(s.sample(std::vector<float>{3.0f, 2.0f, 1.0f}), 1);
    // negative logits are multiplied: -0.1 * 2 = -0.2 < -0.15
    Sampler s2(p);
    s2.accept(0);
    EXPECT_EQ(s2.sample(std::vector<float>{-0.1f, -0.15f}), 1);
}

TEST(Sampler, TopKOneIsGreedyWhateverTheSeed) {
    SamplerParams p;
    p.top_k = 1;
    for (uint64_t seed = 0; seed < 20; ++seed) {
        p.seed = seed;
        Sampler s(p);
        EXPECT_EQ(s.sample(std::vector<float>{0.0f, 0.1f, 0.05f}), 1);
    }
}

TEST(Sampler, MinPCutsUnlikelyTokens) {
    // p(token 1) / p(token 0) = exp(-5) ~ 0.0067 < 0.05: never drawn.
    SamplerParams p;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0.05f;
    p.temp = 1.0f;
    for (uint64_t seed = 0; seed < 200; ++seed) {
        p.seed = seed;
        Sampler s(p);
        EXPECT_NE(s.sample(std::vector<float>{5.0f, 0.0f, 4.5f}), 1);
    }
}

TEST(Sampler, TopPKeepsSmallestPrefixReachingP) {
    // probabilities ~ 0.665, 0.245, 0.09: top_p 0.6 keeps only the first.
    SamplerParams p;
    p.top_k = 0;
    p.min_p = 0;
    p.top_p = 0.6f;
    p.temp = 1.0f;
    for (uint64_t seed = 0; seed < 100; ++seed) {
        p.seed = seed;
        Sampler s(p);
        EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.0f, 0.0f}), 0);
    }
}

TEST(Sampler, SameSeedSameDrawsAndDistributionFollowsSoftmax) {
    SamplerParams p;
    p.top_k = 0;
    p.top_p = 1.0f;
    p.min_p = 0;
    p.temp = 1.0f;
    p.seed = 42;
    Sampler a(p), b(p);
    std::vector<float> l = {0.0f, std::log(3.0f)};  // p = 0.25, 0.75
    int ones = 0;
    const int n = 4000;
    for (int i = 0; i < n; ++i) {
        int32_t x = a.sample(l);
        EXPECT_EQ(x, b.sample(l));
        ones += x == 1;
    }
    // binomial sd = sqrt(n * 0.75 * 0.25) ~ 27; 5 sd = 137 tokens
    EXPECT_NEAR(ones, 3000, 137);
}

// ---- one sequence's token choice (the engine's and the CLI's) ----------------

TEST(Sampler, SequenceSamplerMasksEndTokensUnderIgnoreEos) {
    const std::vector<float> l = {0.5f, 1.0f, 3.0f, 0.9f};  // token 2, the end token, leads
    SequenceSampling p;
    p.sampler.temp = 0;
    SequenceSampler stops(p, {2});
    EXPECT_EQ(stops.sample(l), 2);
    EXPECT_TRUE(stops.ends(2));
    // ignore_eos: never sampled (not sampled and then not honoured), greedy
    // or drawn; and nothing ends the sample.
    p.ignore_eos = true;
    SequenceSampler greedy(p, {2});
    EXPECT_EQ(greedy.sample(l), 1);
    EXPECT_FALSE(greedy.ends(2));
    p.sampler.temp = 1.0f;
    p.sampler.top_k = 0;
    p.sampler.min_p = 0;
    for (uint64_t seed = 0; seed < 100; ++seed) {
        p.sampler.seed = seed;
        SequenceSampler drawn(p, {2});
        EXPECT_NE(drawn.sample(l), 2) << seed;
    }
}

TEST(Sampler, PresenceAndFrequencyPenaltiesCountTheReplyOnly) {
    SequenceSampling p;
    p.sampler.temp = 0;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.1f;
    SequenceSampler s(p, {});
    const std::vector<float> l = {1.0f, 0.6f, 0.0f};
    s.start_reply(std::vector<int32_t>{0, 0, 0});  // the prompt's tokens are not penalized
    EXPECT_EQ(s.sample(l), 0);
    // token 0 once in the reply: 1.0 - 0.5 - 0.1 = 0.4 < 0.6
    EXPECT_EQ(s.sample(l), 1);
    // both once: 0.4 against 0.0
    EXPECT_EQ(s.sample(l), 0);
    // twice: 1.0 - 0.5 - 0.2 = 0.3 > 0.0; token 1 once: 0.0
    EXPECT_EQ(s.sample(l), 0);
    // a new reply starts its counts over: 1.0 against 0.9 (with the old
    // counts, 1.0 - 0.5 - 0.3 = 0.2 against 0.9 - 0.6 = 0.3)
    s.start_reply(std::vector<int32_t>{1});
    EXPECT_EQ(s.sample(std::vector<float>{1.0f, 0.9f, 0.0f}), 0);
}

// ---- the stop-string matcher (the server's and the CLI's) --------------------

namespace {
const minfer::tokenizer::Tokenizer& tiny_vocab() {
    static const auto loaded = minfer::testing::load_tiny_model({});
    static const auto tok = minfer::tokenizer::Tokenizer::from_gguf(loaded->model.file);
    return tok;
}
// The byte tokens of the tiny vocabulary are the bytes' values; 257 is "the".
constexpr int32_t kThe = 257;
}  // namespace

TEST(SampleText, StopStringInsideAPieceOrAcrossPieces) {
    const auto& tok = tiny_vocab();
    // "a" + "the": the stop "h" inside the second piece.
    SampleText cut(tok, {"h"}), keep(tok, {"h"}, StopText::Keep);
    for (SampleText* t : {&cut, &keep}) {
        EXPECT_TRUE(t->push('a'));
        EXPECT_FALSE(t->push(kThe));
        EXPECT_TRUE(t->stopped());
        EXPECT_EQ(t->decoded(), "athe");
    }
    EXPECT_EQ(cut.text(), "at");    // OpenAI's: without the stop string
    EXPECT_EQ(keep.text(), "ath");  // the CLI's: the output ends with it
    // "x" + "y" + "z" with the stop "yz": across pieces, the earliest match.
    SampleText across(tok, {"yz", "z"}, StopText::Keep);
    EXPECT_TRUE(across.push('x'));
    EXPECT_TRUE(across.push('y'));
    EXPECT_FALSE(across.push('z'));
    EXPECT_EQ(across.finish(), "xyz");
}

TEST(SampleText, HeldBackOnlyWhenTheStopStringIsCut) {
    const auto& tok = tiny_vocab();
    SampleText cut(tok, {"xyz"}), keep(tok, {"xyz"}, StopText::Keep);
    for (SampleText* t : {&cut, &keep}) EXPECT_TRUE(t->push('x'));
    EXPECT_EQ(cut.take_ready(), "");    // may begin "xyz": held back
    EXPECT_EQ(keep.take_ready(), "x");  // printed either way
    for (SampleText* t : {&cut, &keep}) EXPECT_TRUE(t->push('q'));
    EXPECT_EQ(cut.take_ready(), "xq");
    EXPECT_EQ(keep.take_ready(), "q");
}
