// Token masks over a vocabulary (src/structured/matcher.*): exactness against
// a brute-force check, and random walks through the corpus schemas whose
// outputs are validated by python3-jsonschema (scripts/validate_json.py).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "gguf/gguf.h"
#include "sanitizer.h"
#include "shared_files.h"
#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "structured_corpus.h"
#include "tokenizer/tokenizer.h"

using namespace minfer::structured;
using minfer::testing::CorpusSchema;
using minfer::testing::load_schema_corpus;
using minfer::testing::python_jsonschema_available;
using minfer::testing::random_walk;
using minfer::testing::validate_outputs;
using minfer::testing::Walk;

namespace {

// A small byte-level vocabulary: every single byte (so any output can be
// spelled), JSON fragments that span several grammar symbols, partial UTF-8,
// one special token and one end-of-generation token.
std::shared_ptr<const TokenVocab> synthetic_vocab() {
    std::vector<std::string> t;
    for (int b = 0; b < 256; ++b) t.push_back(std::string(1, char(b)));
    for (const char* s :
         {"{\"",          "\":",      "\",",    "\",\"",  "\"}",    "}}",       "]}",
          "},{\"",        "\":\"",    "\":[",   "\": ",   ", \"",   "true",     "false",
          "null",         "nu",       "ll",     " \"",    ": ",     ", ",       "12",
          "00",           "-1",       ".5",     "e+",     "E-",     "0.",       "name",
          "Country",      "city_",    "cat",    "dog",    "admin",  "user",     "\"\"",
          "[]",           "{}",       "[[",     "]]",     "\\\"",   "\\\\",     "\\n",
          "\\u00",        "\\ud8",    "2024-",  "-02-",   "T12:",   ":00Z",     "\xC3\xA9",
          "\xE4\xB8\xAD", "\xE4\xB8", "\xAD\"", "\"\xC3", "abc",    " a",       "ab",
          "\"a\"",        "1,",       "0]",     "0}",     "e5",     "Country1", "city_1",
          "\"Country",    "k1",       "\"k",    "1}",     "\":{\"", "value",    "next",
          "op",           "+\",",     "uuid",   "-4",     "aaaa",   "-e89b-"})
        t.push_back(s);
    // Longer than kShortTokenBytes: the masks' second part, some spanning
    // structure (a rule may end inside them).
    for (const char* s :
         {"\"Country\":\"Country", "\":{\"name\":\"value\"}", "2024-01-15T12:00:00Z",
          "aaaaaaaaaaaaaaaaaa", "                  ", "12345678901234567", "-e89b-12d3-a456-426",
          "\"},{\"k1\":\"value\",\"", "nullnullnullnullnull"})
        t.push_back(s);
    std::vector<bool> special(t.size(), false);
    t.push_back("<|im_end|>");
    special.push_back(true);
    t.push_back("<|endoftext|>");
    special.push_back(true);
    int32_t eog = int32_t(t.size() - 1);
    return std::make_shared<const TokenVocab>(TokenVocab::from_bytes(t, special, {eog}));
}

std::shared_ptr<const TokenVocab> qwen_vocab() {
    auto f = minfer::gguf::File::open(minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf"));
    auto tok = minfer::tokenizer::Tokenizer::from_gguf(f);
    return std::make_shared<const TokenVocab>(TokenVocab::from_tokenizer(tok));
}

std::shared_ptr<const CompiledGrammar> schema_grammar(const nlohmann::ordered_json& schema) {
    return std::make_shared<const CompiledGrammar>(
        compile_grammar(parse_gbnf(json_schema_to_gbnf(schema))));
}

// The slow definition of the mask: a token is allowed iff its bytes, fed one
// by one into a copy of the matcher, are all taken (EOG: iff complete).
TokenBitset brute_force_mask(const Matcher& m, const TokenVocab& v) {
    TokenBitset out;
    out.resize(v.n_vocab());
    for (int32_t id = 0; id < v.n_vocab(); ++id) {
        if (std::find(v.eog_ids.begin(), v.eog_ids.end(), id) != v.eog_ids.end()) {
            if (m.is_complete()) out.set(id);
            continue;
        }
        if (v.special[id] || v.bytes[id].empty()) continue;
        Matcher copy = m;
        bool ok = true;
        for (char c : v.bytes[id])
            if (!(ok = copy.accept_bytes(std::string_view(&c, 1)))) break;
        if (ok) out.set(id);
    }
    return out;
}

}  // namespace

TEST(StructuredMask, EogOnlyWhenCompleteSpecialTokensNever) {
    auto v = synthetic_vocab();
    auto g = std::make_shared<const CompiledGrammar>(
        compile_grammar(parse_gbnf("root ::= \"ab\" \"c\"?\n")));
    TokenMasker masker(g, v);
    Matcher m(g);
    TokenBitset mask;
    const int32_t im_end = v->n_vocab() - 2, eog = v->n_vocab() - 1;
    masker.compute_mask(m, mask);
    EXPECT_FALSE(mask.test(eog));
    EXPECT_FALSE(mask.test(im_end));
    EXPECT_TRUE(mask.test('a'));
    EXPECT_FALSE(mask.test('b'));
    const int32_t ab =
        int32_t(std::find(v->bytes.begin(), v->bytes.end(), "ab") - v->bytes.begin());
    EXPECT_TRUE(mask.test(ab));
    EXPECT_FALSE(masker.accept_token(m, eog));
    EXPECT_FALSE(masker.accept_token(m, im_end));
    ASSERT_TRUE(masker.accept_token(m, ab));
    masker.compute_mask(m, mask);
    EXPECT_TRUE(mask.test(eog));  // "ab" is complete
    EXPECT_TRUE(mask.test('c'));
    EXPECT_FALSE(mask.test(im_end));
    EXPECT_EQ(mask.count(), 2u);
    ASSERT_TRUE(masker.accept_token(m, eog));
    masker.compute_mask(m, mask);
    EXPECT_EQ(mask.count(), 0u);  // nothing after end of generation
}

TEST(StructuredMask, MaskEqualsBruteForceOnEveryStateOfCorpusWalks) {
    auto v = synthetic_vocab();
    auto corpus = load_schema_corpus();
    std::mt19937_64 rng(7);
    size_t states = 0;
    for (const auto& c : corpus) {
        SCOPED_TRACE(c.name);
        auto g = schema_grammar(c.schema);
        TokenMasker masker(g, v);
        for (int walk = 0; walk < 5; ++walk)
            EXPECT_EQ(random_walk(masker, g, rng, 200,
                                  [&](const Matcher& m, const TokenBitset& mask) {
                                      ++states;
                                      TokenBitset expect = brute_force_mask(m, *v);
                                      ASSERT_EQ(mask.words, expect.words)
                                          << c.name << ": mask differs from brute force";
                                  })
                          .error,
                      "");
    }
    EXPECT_GT(states, 5000u);
}

TEST(StructuredMask, RandomWalksProduceValidJsonForEveryCorpusSchema) {
    if (!python_jsonschema_available())
        GTEST_SKIP()
            << "python3 with jsonschema is missing (scripts/setup.sh installs python3-jsonschema)";
    auto v = synthetic_vocab();
    auto corpus = load_schema_corpus();
    std::mt19937_64 rng(11);
    std::vector<std::pair<const CorpusSchema*, std::string>> outs;
    size_t unfinished = 0;
    for (const auto& c : corpus) {
        auto g = schema_grammar(c.schema);
        TokenMasker masker(g, v);
        for (int walk = 0; walk < 10; ++walk) {
            Walk w = random_walk(masker, g, rng, 600, [](const Matcher&, const TokenBitset&) {});
            EXPECT_EQ(w.error, "") << c.name;
            if (w.finished)
                outs.push_back({&c, w.output});
            else
                ++unfinished;
        }
    }
    // Walks cut at 600 tokens are the only incomplete outputs ("length").
    EXPECT_LT(unfinished, outs.size() / 10) << unfinished << " walks ran out of tokens";
    int rc = 0;
    std::string report = validate_outputs(outs, &rc);
    EXPECT_EQ(rc, 0) << report;
    EXPECT_NE(report.find("validated " + std::to_string(outs.size()) + " outputs, 0 failed"),
              std::string::npos)
        << report;
}

TEST(StructuredMask, QwenVocabularyWalksAreValidAndMasksExact) {
    MINFER_REQUIRE_SHARED_FILES(minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf"));
    if (!python_jsonschema_available())
        GTEST_SKIP()
            << "python3 with jsonschema is missing (scripts/setup.sh installs python3-jsonschema)";
    auto v = qwen_vocab();
    ASSERT_EQ(v->n_vocab(), 151936);
    auto corpus = load_schema_corpus();
    std::mt19937_64 rng(3);
    std::vector<std::pair<const CorpusSchema*, std::string>> outs;
    size_t checked = 0, walked = 0;
    for (size_t i = 0; i < corpus.size(); ++i) {
        if (!minfer::testing::in_sanitized_subset(i)) continue;
        const auto& c = corpus[i];
        ++walked;
        SCOPED_TRACE(c.name);
        auto g = schema_grammar(c.schema);
        TokenMasker masker(g, v);
        for (int walk = 0; walk < 2; ++walk) {
            int step = 0;
            Walk w =
                random_walk(masker, g, rng, 300, [&](const Matcher& m, const TokenBitset& mask) {
                    // The brute force costs ~0.1 s a state on 151,936 tokens: a
                    // few states per walk.
                    if (step++ % 16 != 3) return;
                    ++checked;
                    TokenBitset expect = brute_force_mask(m, *v);
                    ASSERT_EQ(mask.words, expect.words)
                        << c.name << ": mask differs from brute force";
                });
            EXPECT_EQ(w.error, "") << c.name;
            if (w.finished) outs.push_back({&c, w.output});
        }
    }
    // Two walks a schema, a brute-force check every 16 steps: at least one
    // check per schema walked, and more than half the walks finish.
    EXPECT_GT(checked, walked);
    EXPECT_GT(outs.size(), walked);
    int rc = 0;
    std::string report = validate_outputs(outs, &rc);
    EXPECT_EQ(rc, 0) << report;
    EXPECT_NE(report.find(" 0 failed"), std::string::npos) << report;
}

TEST(StructuredMask, ConcurrentMasksFromSeveralThreadsMatchOneThread) {
    auto v = synthetic_vocab();
    auto corpus = load_schema_corpus();
    const auto& c = corpus.front();
    auto g = schema_grammar(c.schema);
    // Matchers at several states of one walk.
    std::vector<Matcher> states;
    {
        TokenMasker masker(g, v);
        std::mt19937_64 rng(5);
        EXPECT_EQ(random_walk(masker, g, rng, 200,
                              [&](const Matcher& m, const TokenBitset&) { states.push_back(m); })
                      .error,
                  "");
    }
    ASSERT_GT(states.size(), 10u);
    TokenMasker serial(g, v), shared(g, v);
    std::vector<TokenBitset> expect(states.size()), got(states.size());
    for (size_t i = 0; i < states.size(); ++i) serial.compute_mask(states[i], expect[i]);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
        threads.emplace_back([&, t] {
            // Every thread masks every state; they race to fill the cache.
            std::vector<TokenBitset> mine(states.size());
            for (size_t k = 0; k < states.size(); ++k) {
                size_t i = (k + size_t(t) * 7) % states.size();
                shared.compute_mask(states[i], mine[i]);
            }
            if (t == 0) got = std::move(mine);
        });
    for (auto& th : threads) th.join();
    for (size_t i = 0; i < states.size(); ++i) EXPECT_EQ(got[i].words, expect[i].words) << i;
}

TEST(StructuredMask, WarmedMaskersBuildNoNodeInUseAndMaskAsColdOnes) {
    auto v = synthetic_vocab();
    const auto corpus = load_schema_corpus();
    std::mt19937_64 rng(13);
    size_t states = 0, cold_builds = 0;
    for (const auto& c : corpus) {
        SCOPED_TRACE(c.name);
        auto g = schema_grammar(c.schema);
        // one mask per short class and one per class with bytes
        std::set<int32_t> classes_with_bytes, short_classes_with_bytes;
        for (size_t n = 0; n < g->nodes.size(); ++n)
            if (g->nodes[n].has_bytes) {
                classes_with_bytes.insert(g->node_class[n]);
                short_classes_with_bytes.insert(g->short_class[n]);
            }
        TokenMasker cold(g, v), warm(g, v);
        EXPECT_FALSE(warm.warmed());
        warm.start_warming();
        for (int waited_ms = 0; !warm.warmed(); ++waited_ms) {
            ASSERT_LT(waited_ms, 20000) << "warming did not finish";
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        EXPECT_EQ(warm.n_cached_masks(),
                  classes_with_bytes.size() + short_classes_with_bytes.size());
        TokenBitset cold_mask;
        EXPECT_EQ(random_walk(warm, g, rng, 100,
                              [&](const Matcher& m, const TokenBitset& mask) {
                                  ++states;
                                  cold.compute_mask(m, cold_mask);
                                  ASSERT_EQ(mask.words, cold_mask.words);
                              })
                      .error,
                  "");
        // Every node the walk reached was built before it: none by a mask.
        EXPECT_EQ(warm.n_built_on_use(), 0u);
        cold_builds += cold.n_built_on_use();
        // A masker destroyed while warming stops and joins its thread.
        TokenMasker dropped(g, v);
        dropped.start_warming();
    }
    EXPECT_GT(states, 1000u);
    EXPECT_GT(cold_builds, corpus.size());  // the cold maskers built theirs in use
}
