// Structured output on Qwen's 151,936-token vocabulary: schema compile time,
// first-use cost of the per-node mask cache, and compute_mask time per token
// (p50 / p99 / max over the states of random walks, after first use; and for
// every corpus schema from first use, cold and warmed in the background).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "../tests/shared_path.h"
#include "../tests/structured_corpus.h"
#include "gguf/gguf.h"
#include "structured/compiled.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "structured/matcher.h"
#include "tokenizer/tokenizer.h"
#include "util/quantile.h"

namespace {

using namespace minfer::structured;
using Clock = std::chrono::steady_clock;

const char* const kSchemas[] = {"issue31_reply",       "openai_ui_recursive", "enum_150",
                                "json_object_mode",    "anyof_long",          "format_date_time",
                                "openai_query_db_defs"};

std::shared_ptr<const TokenVocab> qwen_vocab() {
    static std::shared_ptr<const TokenVocab> v = [] {
        const std::string model = minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
        if (!std::filesystem::exists(model)) return std::shared_ptr<const TokenVocab>();
        auto f = minfer::gguf::File::open(model);
        auto tok = minfer::tokenizer::Tokenizer::from_gguf(f);
        return std::make_shared<const TokenVocab>(TokenVocab::from_tokenizer(tok));
    }();
    return v;
}

const std::vector<minfer::testing::CorpusSchema>& corpus() {
    static const auto corpus = minfer::testing::load_schema_corpus();
    return corpus;
}

const minfer::testing::CorpusSchema& corpus_schema(const std::string& name) {
    for (const auto& c : corpus())
        if (c.name == name) return c;
    throw minfer::Error("no corpus schema " + name);
}

std::shared_ptr<const CompiledGrammar> compiled(const minfer::testing::CorpusSchema& c) {
    return std::make_shared<const CompiledGrammar>(
        compile_grammar(parse_gbnf(json_schema_to_gbnf(c.schema))));
}

// Qwen's vocabulary; null, and the benchmark skipped, without the shared model.
std::shared_ptr<const TokenVocab> qwen_vocab_or_skip(benchmark::State& state) {
    auto vocab = qwen_vocab();
    if (!vocab) state.SkipWithError("needs ../shared/models/qwen2-mini-q8_0.gguf");
    return vocab;
}

// Qwen's vocabulary and the compiled corpus schema named by the benchmark's
// argument (the label); the vocabulary is null without the shared model.
std::pair<std::shared_ptr<const TokenVocab>, std::shared_ptr<const CompiledGrammar>>
vocab_and_schema(benchmark::State& state) {
    auto vocab = qwen_vocab_or_skip(state);
    if (!vocab) return {};
    const auto& c = corpus_schema(kSchemas[state.range(0)]);
    state.SetLabel(c.name);
    return {vocab, compiled(c)};
}

// JSON Schema -> GBNF -> automaton (no vocabulary involved).
void BM_StructuredCompile(benchmark::State& state) {
    const auto& c = corpus_schema(kSchemas[state.range(0)]);
    state.SetLabel(c.name);
    size_t nodes = 0, classes = 0, short_classes = 0;
    for (auto _ : state) {
        auto g = compile_grammar(parse_gbnf(json_schema_to_gbnf(c.schema)));
        nodes = g.nodes.size();
        classes = size_t(g.n_node_classes);
        short_classes = size_t(g.n_short_classes);
        benchmark::DoNotOptimize(g.nodes.data());
    }
    state.counters["nodes"] = double(nodes);
    state.counters["mask_classes"] = double(classes);
    state.counters["short_classes"] = double(short_classes);
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
    state.counters["p50_us"] = minfer::quantile_of_sorted(us, 0.50);
    state.counters["p99_us"] = minfer::quantile_of_sorted(us, 0.99);
    state.counters["max_us"] = us.back();
    state.counters["states"] = double(states.size());
    state.counters["cached_masks"] = double(masker.n_cached_masks());
    state.counters["walks_first_use_ms"] = first_use_ms;
    state.SetItemsProcessed(int64_t(us.size()));
}
BENCHMARK(BM_StructuredMask)
    ->DenseRange(0, std::size(kSchemas) - 1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

// Filling every node class's mask at once (what a server could do at compile time).
void BM_StructuredWarmAll(benchmark::State& state) {
    auto [vocab, g] = vocab_and_schema(state);
    if (!vocab) return;
    size_t n = 0;
    for (auto _ : state) {
        TokenMasker masker(g, vocab);
        masker.warm_all();
        n = masker.n_cached_masks();
    }
    state.counters["masks"] = double(n);
}
BENCHMARK(BM_StructuredWarmAll)
    ->Arg(0)
    ->Arg(1)
    ->Arg(2)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

// Every corpus schema, mask time per token from first use: the states of
// random walks over a cold masker (each node built when a mask first reaches
// it: cold_p99_us), and over a masker warmed as compile_constraint's
// Warm::InBackground does (warm_ms: its thread's time to build every node;
// p99_us: the masks once it is done). The walks do not pause as a decode
// does between tokens, so cold_p99_us is the worst case of a decode that
// outruns the warming.
void BM_StructuredMaskFromFirstUse(benchmark::State& state, size_t schema) {
    auto vocab = qwen_vocab_or_skip(state);
    if (!vocab) return;
    const auto& c = corpus()[schema];
    state.SetLabel(c.name);
    auto g = compiled(c);
    std::vector<double> cold_us, warm_us, build_us;
    double warm_ms = 0;
    size_t masks = 0, built_on_use = 0;
    for (auto _ : state) {
        TokenMasker cold(g, vocab);
        std::vector<Matcher> states;
        std::mt19937_64 rng(1);
        for (int walk = 0; walk < 4; ++walk)
            minfer::testing::random_walk(
                cold, g, rng, 128,
                [&](const Matcher& m, const TokenBitset&) { states.push_back(m); });
        // The walk's own masks ran on the cold masker; time them again on a
        // fresh one, state by state, so each first use is in the figures.
        TokenMasker fresh(g, vocab);
        TokenBitset mask;
        for (const Matcher& m : states) {
            const size_t before = fresh.n_built_on_use();
            auto a = Clock::now();
            fresh.compute_mask(m, mask);
            const double us = std::chrono::duration<double, std::micro>(Clock::now() - a).count();
            cold_us.push_back(us);
            if (fresh.n_built_on_use() > before) build_us.push_back(us);
        }
        built_on_use = fresh.n_built_on_use();
        TokenMasker warm(g, vocab);
        auto t0 = Clock::now();
        warm.start_warming();
        while (!warm.warmed()) std::this_thread::sleep_for(std::chrono::microseconds(200));
        warm_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        masks = warm.n_cached_masks();
        for (const Matcher& m : states) {
            auto a = Clock::now();
            warm.compute_mask(m, mask);
            warm_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
            benchmark::DoNotOptimize(mask.words.data());
        }
    }
    for (auto* v : {&cold_us, &warm_us, &build_us}) std::sort(v->begin(), v->end());
    state.counters["states"] = double(warm_us.size());
    state.counters["cold_p99_us"] = minfer::quantile_of_sorted(cold_us, 0.99);
    state.counters["cold_max_us"] = cold_us.back();
    state.counters["masks_built_in_walk"] = double(built_on_use);
    state.counters["build_p50_us"] = minfer::quantile_of_sorted(build_us, 0.5);
    state.counters["masks"] = double(masks);
    state.counters["warm_ms"] = warm_ms;
    state.counters["p50_us"] = minfer::quantile_of_sorted(warm_us, 0.50);
    state.counters["p99_us"] = minfer::quantile_of_sorted(warm_us, 0.99);
    state.counters["max_us"] = warm_us.back();
}

// One benchmark per corpus schema, named after it.
const bool kFromFirstUseRegistered = [] {
    for (size_t i = 0; i < corpus().size(); ++i)
        benchmark::RegisterBenchmark(("BM_StructuredMaskFromFirstUse/" + corpus()[i].name).c_str(),
                                     BM_StructuredMaskFromFirstUse, i)
            ->Unit(benchmark::kMillisecond)
            ->Iterations(1);
    return true;
}();

}  // namespace
