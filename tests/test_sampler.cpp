#include <gtest/gtest.h>

#include <map>

#include "runtime/sampler.h"

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
