// Tokenizer throughput: the seed design document concatenated 60 times
// (~3 MB) with Qwen's 151,936-token vocabulary, one thread, load excluded.
#include <benchmark/benchmark.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "../tests/shared_path.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"

namespace {

void BM_TokenizeQwenSeedX60(benchmark::State& state) {
    const std::string model = minfer::testing::shared_file("models/qwen2-mini-q8_0.gguf");
    const std::string seed = minfer::testing::shared_file("seed/000_a93a56c6dc6033e5.txt");
    if (!std::filesystem::exists(model) || !std::filesystem::exists(seed)) {
        state.SkipWithError("needs ../shared/models/qwen2-mini-q8_0.gguf and ../shared/seed");
        return;
    }
    auto f = minfer::gguf::File::open(model);
    const auto tok = minfer::tokenizer::Tokenizer::from_gguf(f);
    std::ifstream in(seed, std::ios::binary);
    std::ostringstream ss;
    ss << in.rdbuf();
    std::string text;
    for (int i = 0; i < 60; ++i) text += ss.str();
    size_t n_tokens = 0;
    for (auto _ : state) {
        auto ids = tok.encode(text);
        n_tokens = ids.size();
        benchmark::DoNotOptimize(ids.data());
    }
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(text.size()));
    state.counters["tokens"] = double(n_tokens);
    state.counters["text_MB"] = double(text.size()) / 1e6;
}
BENCHMARK(BM_TokenizeQwenSeedX60)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace
