// Structured output on Qwen's 151,936-token vocabulary: schema compile time,
// first-use cost of the per-node mask cache, and compute_mask time per token
// (p50 / p99 / max over the states of random walks, after first use).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "../tests/structured_corpus.h"
#include "gguf/gguf.h"
#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace minfer::structured;
using Clock = std::chrono::steady_clock;

const char* const kSchemas[] = {"issue31_reply",       "openai_ui_recursive", "enum_150",
                                "json_object_mode",    "anyof_long",          "format_date_time",
                                "openai_query_db_defs"};

std::shared_ptr<const TokenVocab> qwen_vocab() {
    static std::shared_ptr<const TokenVocab> v = [] {
        std::string model = std::string(MINFER_SHARED_DIR) + "/models/qwen2-mini-q8_0.gguf";
        if (!std::filesystem::exists(model)) return std::shared_ptr<const TokenVocab>();
        auto f = minfer::gguf::File::open(model);
        auto tok = minfer::tokenizer::Tokenizer::from_gguf(f);
        return std::make_shared<const TokenVocab>(TokenVocab::from_tokenizer(tok));
    }();
    return v;
}

const minfer::testing::CorpusSchema& corpus_schema(const std::string& name) {
    static const auto corpus = minfer::testing::load_schema_corpus();
    for (const auto& c : corpus)
        if (c.name == name) return c;
    throw minfer::Error("no corpus schema " + name);
}

std::shared_ptr<const CompiledGrammar> compiled(const minfer::testing::CorpusSchema& c) {
    return std::make_shared<const CompiledGrammar>(
        compile_grammar(parse_gbnf(json_schema_to_gbnf(c.schema))));
}

// Qwen's vocabulary and the compiled corpus schema named by the benchmark's
// argument (the label); the vocabulary is null, and the benchmark skipped,
// without the shared model.
std::pair<std::shared_ptr<const TokenVocab>, std::shared_ptr<const CompiledGrammar>>
vocab_and_schema(benchmark::State& state) {
    auto vocab = qwen_vocab();
    if (!vocab) {
        state.SkipWithError("needs ../shared/models/qwen2-mini-q8_0.gguf");
        return {};
    }
    const auto& c = corpus_schema(kSchemas[state.range(0)]);
    state.SetLabel(c.name);
    return {vocab, compiled(c)};
}

// JSON Schema -> GBNF -> automaton (no vocabulary involved).
void BM_StructuredCompile(benchmark::State& state) {
    const auto& c = corpus_schema(kSchemas[state.range(0)]);
    state.SetLabel(c.name);
    size_t nodes = 0;
    for (auto _ : state) {
        auto g = compile_grammar(parse_gbnf(json_schema_to_gbnf(c.schema)));
        nodes = g.nodes.size();
        benchmark::DoNotOptimize(g.nodes.data());
    }
    state.counters["nodes"] = double(nodes);
}
BENCHMARK(BM_StructuredCompile)
    ->DenseRange(0, std::size(kSchemas) - 1)
    ->Unit(benchmark::kMicrosecond);

// Mask time per token after first use: random walks fill the cache, then
// every state they reached is masked again and timed one by one.
void BM_StructuredMask(benchmark::State& state) {
    auto [vocab, g] = vocab_and_schema(state);
    if (!vocab) return;
    TokenMasker masker(g, vocab);
    std::vector<Matcher> states;
    std::mt19937_64 rng(1);
    auto t0 = Clock::now();
    for (int walk = 0; walk < 8; ++walk)
        minfer::testing::random_walk(
            masker, g, rng, 256,
            [&](const Matcher& m, const TokenBitset&) { states.push_back(m); });
    double first_use_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    TokenBitset mask;
    std::vector<double> us;
    for (auto _ : state) {
        for (const Matcher& m : states) {
            auto a = Clock::now();
            masker.compute_mask(m, mask);
            us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
            benchmark::DoNotOptimize(mask.words.data());
        }
    }
    std::sort(us.begin(), us.end());
    auto pct = [&](double p) { return us[std::min(us.size() - 1, size_t(p * double(us.size())))]; };
    state.counters["p50_us"] = pct(0.50);
    state.counters["p99_us"] = pct(0.99);
    state.counters["max_us"] = us.back();
    state.counters["states"] = double(states.size());
    state.counters["cached_nodes"] = double(masker.n_cached_nodes());
    state.counters["walks_first_use_ms"] = first_use_ms;
    state.SetItemsProcessed(int64_t(us.size()));
}
BENCHMARK(BM_StructuredMask)
    ->DenseRange(0, std::size(kSchemas) - 1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// Filling every node's cache at once (what a server could do at compile time).
void BM_StructuredWarmAll(benchmark::State& state) {
    auto [vocab, g] = vocab_and_schema(state);
    if (!vocab) return;
    size_t n = 0;
    for (auto _ : state) {
        TokenMasker masker(g, vocab);
        masker.warm_all();
        n = masker.n_cached_nodes();
    }
    state.counters["nodes"] = double(n);
}
BENCHMARK(BM_StructuredWarmAll)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace
