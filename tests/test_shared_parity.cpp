// Greedy decoding of the tiny KJV model against llama.cpp's tokens: the
// prompt of ../shared/ref/kjv-tiny-greedy.json was chosen so that every
// step's top-1 logit leads by >= 0.249, so an exact match is required.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "isa_levels.h"
#include "model/model.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "shared_files.h"
#include "tokenizer/tokenizer.h"

using namespace minfer;

class SharedParity : public ::testing::TestWithParam<bool> {};

// Param: with the matmul weights interleaved (the CLI's default) or in the
// file's layout.
TEST_P(SharedParity, KjvTinyGreedyTokensMatchLlamaCpp) {
    const std::string ref = minfer::testing::shared_file("ref/kjv-tiny-greedy.json");
    const std::string model_path = minfer::testing::shared_file("models/kjv-tiny-q8_0.gguf");
    MINFER_REQUIRE_SHARED_FILES(ref, model_path);
    // at every kernel level this CPU has
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        nlohmann::json j;
        std::ifstream(ref) >> j;
        model::Model m = model::Model::load(model_path);
        if (GetParam()) {
            EXPECT_GT(m.interleave_weights(), 0u);
        }
        tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(m.file);
        const std::vector<int32_t> prompt = tok.encode(j["prompt"].get<std::string>());
        EXPECT_EQ(prompt, j["prompt_ids"].get<std::vector<int32_t>>());
        runtime::SessionOptions o;
        o.n_ctx = 256;
        runtime::Session s(m, o);
        std::vector<float> logits = s.eval(prompt);
        std::vector<int32_t> generated;
        for (size_t i = 0; i < j["generated"].size(); ++i) {
            const int32_t id = runtime::argmax(logits);
            generated.push_back(id);
            logits = s.eval(std::vector<int32_t>{id});
        }
        EXPECT_EQ(generated, j["generated"].get<std::vector<int32_t>>());
        // The reference text ends with the newlines llama.cpp printed after the
        // tokens; the tokens' own text is its prefix.
        EXPECT_EQ(j["text"].get<std::string>().rfind(tok.decode(generated), 0), 0u);
    });
}

INSTANTIATE_TEST_SUITE_P(Layouts, SharedParity, ::testing::Bool(), [](const auto& info) {
    return info.param ? "Interleaved" : "FileLayout";
});
