// The minfer command as a user drives it: generation with the built-in
// model, chat over stdin, the context rules, and bad flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>

#include "backend/cpu/isa.h"
#include "cli_runner.h"
#include "tiny_model.h"

using minfer::testing::run_cli;

namespace {

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// A tiny random qwen3 model with a ChatML template and a trained context of
// n_ctx_train tokens, written once per process.
struct TempFiles {
    std::map<int64_t, std::string> paths;
    ~TempFiles() {
        for (const auto& [ctx, p] : paths) std::filesystem::remove(p);
    }
};

std::string tiny_model_path(int64_t n_ctx_train = 64) {
    static TempFiles files;  // removed when the test program exits
    auto& paths = files.paths;
    auto it = paths.find(n_ctx_train);
    if (it != paths.end()) return it->second;
    minfer::testing::TinyModelSpec s;
    s.arch = "qwen3";
    s.n_ctx_train = n_ctx_train;
    std::string p =
        (std::filesystem::temp_directory_path() / ("minfer-cli-tiny-" + std::to_string(::getpid()) +
                                                   "-" + std::to_string(n_ctx_train) + ".gguf"))
            .string();
    minfer::testing::make_tiny_model(s).write(p);
    return paths[n_ctx_train] = p;
}

}  // namespace

TEST(Cli, DefaultModelWritesTextOnStdoutAndReportsOnStderr) {
    auto r = run_cli("-p 'And God said' -n 12 --seed 3");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_EQ(r.out.rfind("And God said", 0), 0u) << r.out;  // the prompt, then the text
    EXPECT_GT(r.out.size(), std::string("And God said").size() + 12);
    EXPECT_TRUE(has(r.err, "seed 3"));
    EXPECT_TRUE(has(r.err, "generation 12 tokens"));
    EXPECT_FALSE(has(r.out, "t/s"));  // timings stay off stdout
}

TEST(Cli, GreedyIsDeterministicAndSeedsReproduce) {
    auto a = run_cli("-p 'In the beginning' -n 10 --temp 0 --no-display-prompt");
    auto b = run_cli("-p 'In the beginning' -n 10 --temp 0 --no-display-prompt");
    ASSERT_EQ(a.code, 0);
    EXPECT_EQ(a.out, b.out);
    EXPECT_FALSE(has(a.out, "In the beginning"));
    auto c = run_cli("-p 'In the beginning' -n 10 --seed 7");
    auto d = run_cli("-p 'In the beginning' -n 10 --seed 7");
    EXPECT_EQ(c.out, d.out);
}

TEST(Cli, StopStringEndsGeneration) {
    // Greedy output of the built-in model for this prompt contains ", and";
    // with --stop "," the text must end at the first comma.
    auto r = run_cli("-p 'Thus saith the LORD' -n 24 --temp 0 --no-display-prompt --stop ,");
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_FALSE(r.out.empty());
    std::string text = r.out.substr(0, r.out.find_last_not_of('\n') + 1);
    EXPECT_EQ(text.back(), ',') << text;
    EXPECT_EQ(text.find(','), text.size() - 1);
}

TEST(Cli, ChatHoldsATwoTurnConversationFromStdin) {
    auto r =
        run_cli("-m " + tiny_model_path(512) + " -cnv -sys 'Be brief.' -n 4 --temp 0 --ignore-eos",
                "Hi\nthe end\n");
    ASSERT_EQ(r.code, 0) << r.err;
    // Two turns answered (4 tokens each), then the prompt that meets the end of input.
    size_t prompts = 0;
    for (size_t p = r.err.find("\n> "); p != std::string::npos; p = r.err.find("\n> ", p + 1))
        ++prompts;
    EXPECT_EQ(prompts, 3u) << r.err;
    EXPECT_TRUE(has(r.err, "generation 8 tokens")) << r.err;
    // The second turn runs only the new part of the conversation: the KV
    // cache holds the first turn. ChatML of turn 1 = system + user + assistant
    // header; turn 2 adds <|im_end|>\n<|im_start|>user\n...: fewer tokens than
    // rendering the whole conversation again.
    EXPECT_FALSE(has(r.err, "no longer fits")) << r.err;
}

TEST(Cli, PromptLongerThanTrainedContextIsAClearError) {
    std::string long_prompt(400, 'a');
    for (size_t i = 1; i < long_prompt.size(); i += 2) long_prompt[i] = ' ';  // 200 "a" words
    auto r = run_cli("-m " + tiny_model_path() + " -p '" + long_prompt + "' -n 4");
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(has(r.err, "more than the model's trained context length of 64")) << r.err;
    EXPECT_TRUE(r.out.empty());
}

TEST(Cli, PromptLongerThanCtxSizeRaisesTheContext) {
    auto r =
        run_cli("-m " + tiny_model_path() + " -p 'a b c d e f g h i j k l' -n 2 -c 8 --temp 0");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "context size raised from 8 to")) << r.err;
}

TEST(Cli, GenerationStopsAtTheContextEndAndKeepsTheOutput) {
    auto r = run_cli("-m " + tiny_model_path() +
                     " -p 'a b' -n 200 --temp 0 --ignore-eos --no-display-prompt");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "the context is full (64 tokens)")) << r.err;
    EXPECT_FALSE(r.out.empty());
}

TEST(Cli, ContextLargerThanTrainedIsClampedWithAWarning) {
    auto r = run_cli("-m " + tiny_model_path() + " -p 'a' -n 1 -c 100000");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(
        r.err,
        "warning: context size 100000 is larger than the model's trained context length; using 64"))
        << r.err;
}

TEST(Cli, BadFlagsGetAOneLineErrorAndExitTwo) {
    for (const char* args :
         {"--bogus", "-n", "-n abc", "--temp x", "--top-p 2", "info", "nosuchcommand"}) {
        auto r = run_cli(args);
        EXPECT_EQ(r.code, 2) << args << ": " << r.err;
        EXPECT_TRUE(has(r.err, "minfer: error: ")) << args;
        EXPECT_TRUE(r.out.empty()) << args;
    }
}

TEST(Cli, MissingModelAndNonGgufFilesAreErrorsNamingThePath) {
    auto r = run_cli("-m /nonexistent/model.gguf -p hi");
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(has(r.err, "/nonexistent/model.gguf")) << r.err;
    r = run_cli("-m " + std::string(MINFER_SOURCE_DIR) + "/README.md -p hi");
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(has(r.err, "README.md")) << r.err;
    r = run_cli("-m /tmp -p hi");
    EXPECT_EQ(r.code, 1);
    EXPECT_TRUE(has(r.err, "directory")) << r.err;
}

TEST(Cli, HelpAndVersion) {
    auto r = run_cli("--help");
    EXPECT_EQ(r.code, 0);
    EXPECT_TRUE(has(r.out, "perplexity"));
    r = run_cli("--help-generate");
    EXPECT_EQ(r.code, 0);
    for (const char* flag : {"--temp", "--top-k", "--top-p", "--min-p", "--repeat-penalty",
                             "--seed", "-cnv", "--ctx-size", "(default: 0.8)"})
        EXPECT_TRUE(has(r.out, flag)) << flag;
    r = run_cli("--version");
    EXPECT_EQ(r.code, 0);
    EXPECT_TRUE(has(r.out, "minfer "));
}

TEST(Cli, MinferCpuCapsTheKernelsNamesTheLevelAndRefusesBadValues) {
    // Every level this CPU has: the run names it first on stderr, and the
    // greedy text is the same at every level (the built-in model is F32:
    // the levels differ only in float order, not enough to flip a token).
    std::string text;
    for (minfer::cpu::IsaLevel l : minfer::cpu::isa_levels_supported()) {
        const std::string name = minfer::cpu::isa_name(l);
        setenv("MINFER_CPU", name.c_str(), 1);
        auto r = run_cli("-p 'And God said' -n 8 --temp 0 --no-display-prompt");
        unsetenv("MINFER_CPU");
        ASSERT_EQ(r.code, 0) << name << ": " << r.err;
        // on the first line (generate's "minfer: model ..., cpu kernels L")
        const std::string first = r.err.substr(0, r.err.find('\n'));
        EXPECT_TRUE(has(first, "cpu kernels " + name)) << r.err;
        if (text.empty()) text = r.out;
        EXPECT_EQ(r.out, text) << name;
    }
    // Not a level: an error naming the value, exit 1, nothing run.
    setenv("MINFER_CPU", "avx9", 1);
    auto bad = run_cli("-p 'And God said' -n 4");
    unsetenv("MINFER_CPU");
    EXPECT_EQ(bad.code, 1);
    EXPECT_TRUE(has(bad.err, "MINFER_CPU='avx9'")) << bad.err;
    EXPECT_TRUE(bad.out.empty());
    // A level of the other architecture family: this CPU lacks it.
#if defined(__x86_64__)
    setenv("MINFER_CPU", "neon", 1);
#else
    setenv("MINFER_CPU", "avx512", 1);
#endif
    auto lacks = run_cli("-p 'And God said' -n 4");
    unsetenv("MINFER_CPU");
    EXPECT_EQ(lacks.code, 1);
    EXPECT_TRUE(has(lacks.err, "cannot run")) << lacks.err;
}
