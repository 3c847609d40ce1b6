#include <gtest/gtest.h>

#include <map>
#include <random>

#include "runtime/generation.h"
#include "runtime/sample_text.h"
#include "runtime/sampler.h"
#include "structured/constraint.h"
#include "tiny_model.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

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

// ---- a constraint (structured output) -----------------------------------------

namespace {
// Every byte as a token but those in `missing`, the fragments "{\"" and
// "true", then one end-of-generation token (the last id).
std::shared_ptr<const minfer::structured::Constraint> constraint(const std::string& gbnf,
                                                                 const std::string& missing = "") {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b)
        t.push_back(missing.find(char(b)) == std::string::npos ? std::string(1, char(b)) : "");
    t.push_back("{\"");
    t.push_back("true");
    t.push_back("<|end|>");
    std::vector<bool> special(t.size(), false);
    special.back() = true;
    const auto eog = static_cast<int32_t>(t.size() - 1);
    auto vocab = std::make_shared<const minfer::structured::TokenVocab>(
        minfer::structured::TokenVocab::from_bytes(t, special, {eog}));
    return minfer::structured::compile_constraint(gbnf, vocab);
}
constexpr int32_t kOpen = 256, kTrue = 257, kEnd = 258, kVocab = 259;

// Runs a sampler on random logits (the end token's far ahead, 'x' next)
// until it ends or 40 tokens; returns the output's bytes, "|END" when it
// ended on the end token, "|FIN" when finished() ended it.
std::string run(SequenceSampler& s, std::mt19937& rng) {
    std::normal_distribution<float> d(0.0f, 2.0f);
    std::string out;
    for (int i = 0; i < 40; ++i) {
        std::vector<float> l(kVocab);
        for (auto& x : l) x = d(rng);
        l[kEnd] = 50.0f;
        l['x'] = 40.0f;
        const int32_t tok = s.sample(l);
        if (s.ends(tok)) return out + "|END";
        out += tok == kOpen ? "{\"" : tok == kTrue ? "true" : std::string(1, char(tok));
        if (s.finished()) return out + "|FIN";
    }
    return out;
}
}  // namespace

TEST(Sampler, ConstraintExcludesRefusedTokensAndEndsOnlyWhenComplete) {
    // The end token and 'x' lead every row; neither may come before '}'.
    const auto c = constraint("root ::= \"{\\\"a\\\":\" (\"true\" | \"false\") \"}\" \" \"?\n");
    std::mt19937 rng(5);
    std::map<std::string, int> seen;
    for (uint64_t seed = 0; seed < 60; ++seed) {
        SequenceSampling p;
        p.constraint = c;
        p.sampler.temp = seed % 3 == 0 ? 0.0f : 1.5f;
        p.sampler.top_k = seed % 2 ? 0 : 40;
        p.sampler.seed = seed;
        SequenceSampler s(p, {kEnd});
        s.start_reply(std::vector<int32_t>{1, 2});
        ++seen[run(s, rng)];
    }
    // Complete after '}': the end token (leading) is taken there.
    for (const auto& [out, n] : seen)
        EXPECT_TRUE(out == "{\"a\":true}|END" || out == "{\"a\":false}|END") << out;
    EXPECT_EQ(seen.size(), 2u) << "both branches drawn at temperature 1.5";
}

TEST(Sampler, ConstraintUnderIgnoreEosEndsWhereNothingCanFollow) {
    std::mt19937 rng(9);
    auto once = [&](const std::string& gbnf, const std::string& missing, bool ignore_eos) {
        SequenceSampling p;
        p.constraint = constraint(gbnf, missing);
        p.sampler.temp = 0;
        p.ignore_eos = ignore_eos;
        SequenceSampler s(p, {kEnd});
        return run(s, rng);
    };
    const std::string json = "root ::= \"{\\\"a\\\":\" (\"true\" | \"false\") \"}\" \" \"?\n";
    // The end token masked while something else may follow: the optional
    // blank is taken, then nothing can follow and the sample ends.
    EXPECT_EQ(once(json, "", true), "{\"a\":true} |FIN");
    EXPECT_EQ(once(json, "", false), "{\"a\":true}|END");
    EXPECT_EQ(once("root ::= \"ab\"\n", "", true), "ab|FIN");
    // Complete after 'a', and the 'b' that could follow has no token: the
    // end token is the only one allowed, so it is taken even under ignore_eos.
    EXPECT_EQ(once("root ::= \"a\" \"b\"?\n", "b", true), "a|END");
    // Incomplete with no token to go on: an error naming the reason.
    SequenceSampling p;
    p.constraint = constraint("root ::= \"a\" \"b\"\n", "b");
    SequenceSampler s(p, {kEnd});
    std::vector<float> l(kVocab, 0.0f);
    EXPECT_EQ(s.sample(l), 'a');
    try {
        s.sample(l);
        ADD_FAILURE() << "no token allowed, yet one was sampled";
    } catch (const minfer::Error& e) {
        EXPECT_NE(std::string(e.what()).find("allows no token"), std::string::npos) << e.what();
    }
}

// ---- how a generation goes on after each token (the engine's and the CLI's) --

namespace {
// A greedy sampler whose end token is 2; row(t) makes token t the argmax.
SequenceSampler greedy_sampler() {
    SequenceSampling p;
    p.sampler.temp = 0;
    return SequenceSampler(p, {2});
}
std::vector<float> row(int32_t t) {
    std::vector<float> l(4, 0.0f);
    l[static_cast<size_t>(t)] = 5.0f;
    return l;
}
// The rule applied to a token, with emit recording what it was handed.
struct Applied {
    NextToken next;
    std::vector<int32_t> emitted;
};
Applied apply(int32_t t, GenerationState st, bool emit_says = true) {
    SequenceSampler s = greedy_sampler();
    Applied a;
    a.next = next_token(s, row(t), st, [&](int32_t id) {
        a.emitted.push_back(id);
        return emit_says;
    });
    return a;
}
constexpr GenerationState kRoom{.n_sampled = 0, .n_predict = -1, .n_cached = 5, .n_ctx = 64};
}  // namespace

TEST(Generation, AnEndTokenEndsTheSampleAndIsNotEmitted) {
    const Applied a = apply(2, kRoom);
    EXPECT_EQ(a.next.token, 2);
    EXPECT_FALSE(a.next.emitted);
    EXPECT_EQ(a.next.end, FinishReason::Stop);
    EXPECT_TRUE(a.emitted.empty());
    const Applied b = apply(1, kRoom);
    EXPECT_EQ(b.next.token, 1);
    EXPECT_TRUE(b.next.emitted);
    EXPECT_FALSE(b.next.end.has_value());
    EXPECT_EQ(b.emitted, std::vector<int32_t>{1});
}

TEST(Generation, EmitSayingNoStopsAfterTheTokenAheadOfEveryLimit) {
    // emit refused (a stop string), and the token is also the n_predict-th
    // and the last the cache can take: Stop, the token emitted.
    const Applied a =
        apply(1, {.n_sampled = 3, .n_predict = 4, .n_cached = 64, .n_ctx = 64}, false);
    EXPECT_TRUE(a.next.emitted);
    EXPECT_EQ(a.next.end, FinishReason::Stop);
    EXPECT_EQ(a.emitted, std::vector<int32_t>{1});
}

TEST(Generation, NPredictCountsSampledTokensAndZeroSamplesNone) {
    EXPECT_FALSE(apply(1, {.n_sampled = 2, .n_predict = 4, .n_cached = 5, .n_ctx = 64})
                     .next.end.has_value());
    const Applied last = apply(1, {.n_sampled = 3, .n_predict = 4, .n_cached = 64, .n_ctx = 64});
    EXPECT_EQ(last.next.end, FinishReason::Length);  // Length before ContextFull
    EXPECT_TRUE(last.next.emitted);
    const Applied none = apply(1, {.n_sampled = 0, .n_predict = 0, .n_cached = 5, .n_ctx = 64});
    EXPECT_EQ(none.next.end, FinishReason::Length);
    EXPECT_EQ(none.next.token, -1);
    EXPECT_FALSE(none.next.emitted);
    EXPECT_TRUE(none.emitted.empty());
    // An end token as the n_predict-th: Stop, not emitted.
    EXPECT_EQ(apply(2, {.n_sampled = 3, .n_predict = 4, .n_cached = 5, .n_ctx = 64}).next.end,
              FinishReason::Stop);
}

TEST(Generation, ContextFullOnlyWhenTheCacheCannotTakeTheToken) {
    EXPECT_FALSE(apply(1, {.n_sampled = 0, .n_predict = -1, .n_cached = 63, .n_ctx = 64})
                     .next.end.has_value());
    const Applied full = apply(1, {.n_sampled = 0, .n_predict = -1, .n_cached = 64, .n_ctx = 64});
    EXPECT_EQ(full.next.end, FinishReason::ContextFull);
    EXPECT_TRUE(full.next.emitted);  // its text is the output's last
}

TEST(Generation, ACompleteConstraintThatCannotGoOnStopsAfterItsLastToken) {
    SequenceSampling p;
    p.sampler.temp = 0;
    p.constraint = constraint("root ::= \"ab\"\n");
    SequenceSampler s(p, {kEnd});
    std::vector<float> l(kVocab, 0.0f);
    std::string out;
    const auto emit = [&](int32_t id) {
        out += static_cast<char>(id);
        return true;
    };
    const NextToken a = next_token(s, l, kRoom, emit);
    EXPECT_FALSE(a.end.has_value());
    const NextToken b = next_token(s, l, kRoom, emit);
    EXPECT_TRUE(b.emitted);
    EXPECT_EQ(b.end, FinishReason::Stop);
    EXPECT_EQ(out, "ab");
}

TEST(Sampler, ConstraintMasksBeforePenaltiesAndTimesItsMask) {
    // The presence penalty pushes the repeated 'a' below 'x', which the
    // grammar refuses: the penalty works among the allowed tokens only.
    SequenceSampling p;
    p.constraint = constraint("root ::= [ab]+\n");
    p.sampler.temp = 0;
    p.presence_penalty = 5.0f;
    SequenceSampler s(p, {kEnd});
    std::vector<float> l(kVocab, -10.0f);
    l['a'] = 3.0f;
    l['b'] = 1.0f;
    l['x'] = 2.5f;
    EXPECT_FALSE(s.mask_ready());
    s.prepare_mask();  // as the engine does while the forward pass runs
    EXPECT_TRUE(s.mask_ready());
    EXPECT_EQ(s.sample(l), 'a');
    EXPECT_FALSE(s.mask_ready());
    EXPECT_GT(s.mask_us(), 0.0f);
    EXPECT_EQ(s.sample(l), 'b');  // a: 3 - 5 = -2 < b: 1; x refused
    EXPECT_EQ(s.sample(l), 'a');  // both penalized: -2 against -4
    EXPECT_TRUE(s.complete());
    EXPECT_FALSE(s.finished());
    SequenceSampling plain_params;
    plain_params.sampler = p.sampler;
    SequenceSampler plain(plain_params, {kEnd});
    EXPECT_EQ(plain.sample(l), 'a');
    EXPECT_FALSE(plain.constrained());
    EXPECT_EQ(plain.mask_us(), 0.0f);
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
