// Tokenizer tests: parity with llama.cpp's ids on the reference files, and
// self-contained tests on a hand-built vocabulary and hand-picked strings.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

using namespace minfer::tokenizer;
using Words = std::vector<std::string>;

namespace {

std::string shared_path(const std::string& rel) { return std::string(MINFER_SHARED_DIR) + "/" + rel; }

struct ParityResult {
    int matched = 0, total = 0;
    std::string first_failure;
};

ParityResult run_parity(const std::string& model, const std::string& jsonl) {
    auto f = minfer::gguf::File::open(model);
    Tokenizer tok = Tokenizer::from_gguf(f);
    ParityResult r;
    std::ifstream in(jsonl);
    std::string line;
    while (std::getline(in, line)) {
        if (line.empty()) continue;
        auto j = nlohmann::json::parse(line);
        const std::string text = j["text"];
        const std::vector<int32_t> want = j["ids"];
        const auto got = tok.encode(text);
        ++r.total;
        if (got == want)
            ++r.matched;
        else if (r.first_failure.empty())
            r.first_failure = nlohmann::json(text).dump() + " got " + nlohmann::json(got).dump() +
                              " want " + nlohmann::json(want).dump();
    }
    return r;
}

// GPT-2 byte-level text of a plain string.
std::string g2(std::string_view s) {
    std::string out;
    for (unsigned char c : s) utf8_append(out, gpt2_byte_to_cpt(c));
    return out;
}

// A small vocabulary: the 256 byte tokens (id = byte value), then merges.
Vocab tiny_vocab() {
    Vocab v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(g2(std::string(1, char(b))));
    v.token_types.assign(256, 1);
    auto add = [&](const std::string& t, int type) {
        v.tokens.push_back(t);
        v.token_types.push_back(type);
    };
    add("he", 1);        // 256
    add("ll", 1);        // 257
    add("hell", 1);      // 258
    add(g2(" w"), 1);    // 259
    add("aa", 1);        // 260
    add("<|im_end|>", 3);   // 261 control
    add("<think>", 4);      // 262 user-defined
    add("<|im_end|>x", 3);  // 263 longer control token that contains another
    v.merges = {"h e", "l l", "he ll", g2(" ") + " w", "a a"};
    v.eos_id = 261;
    return v;
}

}  // namespace

TEST(TokenizerParity, QwenReferenceIds) {
    const auto model = shared_path("models/qwen2-mini-q8_0.gguf");
    const auto ref = shared_path("ref/tokenize.jsonl");
    if (!std::filesystem::exists(model) || !std::filesystem::exists(ref)) GTEST_SKIP();
    auto r = run_parity(model, ref);
    EXPECT_EQ(r.matched, r.total) << r.first_failure;
    EXPECT_GT(r.total, 0);
}

TEST(TokenizerParity, KjvTinyReferenceIds) {
    const auto model = shared_path("models/kjv-tiny-q8_0.gguf");
    const auto ref = shared_path("ref/kjv-tiny-tokenize.jsonl");
    if (!std::filesystem::exists(model) || !std::filesystem::exists(ref)) GTEST_SKIP();
    auto r = run_parity(model, ref);
    EXPECT_EQ(r.matched, r.total) << r.first_failure;
    EXPECT_GT(r.total, 0);
}
