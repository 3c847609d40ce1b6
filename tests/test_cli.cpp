// The minfer command as a user drives it: generation with the built-in
// model, chat over stdin, the context rules, and bad flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "backend/cpu/isa.h"
#include "cli_runner.h"
#include "model/model.h"
#include "runtime/bench.h"
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

// A model larger than the memory there is is refused before its weights are
// read, with what it needs and what there is (MINFER_MEM_AVAILABLE pretends
// a machine with 1 MiB); the same command runs when the memory is there.
TEST(Cli, RefusesAModelThatDoesNotFitInMemory) {
    const std::string p = tiny_model_path();
    ::setenv("MINFER_MEM_AVAILABLE", "1M", 1);
    auto small = run_cli("-m " + p + " -p 'a b' -n 2 --temp 0");
    ::setenv("MINFER_MEM_AVAILABLE", "64G", 1);
    auto big = run_cli("-m " + p + " -p 'a b' -n 2 --temp 0");
    ::unsetenv("MINFER_MEM_AVAILABLE");
    EXPECT_EQ(small.code, 1) << small.err;
    EXPECT_TRUE(has(small.err, "does not fit in memory")) << small.err;
    EXPECT_TRUE(has(small.err, "of weights")) << small.err;
    EXPECT_TRUE(has(small.err, "1.00 MiB is available (MINFER_MEM_AVAILABLE)")) << small.err;
    EXPECT_EQ(big.code, 0) << big.err;
}

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

// --ignore-eos masks the end-of-generation tokens (never sampled, as llama.cpp
// and the engine do) rather than sampling one and going on. The model's
// layers add nothing (attn_output and ffn_down zero) and every embedding row
// is one vector c, <|endoftext|>'s 2c and 'x''s 1.5c: its logits (tied
// output) put <|endoftext|> first and 'x' second at every position.
TEST(Cli, IgnoreEosNeverSamplesTheEndToken) {
    minfer::testing::TinyModelSpec s;
    s.arch = "qwen3";
    s.edit = [](const std::string& name, std::vector<float>& v) {
        if (name.find("attn_output") != std::string::npos ||
            name.find("ffn_down") != std::string::npos)
            std::fill(v.begin(), v.end(), 0.0f);
        if (name == "token_embd.weight") {
            const size_t n_embd = 64, eos = 260, x = 'x';
            for (size_t t = 1; t < v.size() / n_embd; ++t)
                std::copy(v.begin(), v.begin() + n_embd, v.begin() + t * n_embd);
            for (size_t i = 0; i < n_embd; ++i) {
                v[eos * n_embd + i] *= 2.0f;
                v[x * n_embd + i] *= 1.5f;
            }
        }
    };
    const std::string p = (std::filesystem::temp_directory_path() /
                           ("minfer-cli-eos-first-" + std::to_string(::getpid()) + ".gguf"))
                              .string();
    minfer::testing::make_tiny_model(s).write(p);
    auto ignored = run_cli("-m " + p + " -p 'a b' -n 4 --temp 0 --ignore-eos --no-display-prompt");
    auto stopped = run_cli("-m " + p + " -p 'a b' -n 4 --temp 0 --no-display-prompt");
    std::filesystem::remove(p);
    ASSERT_EQ(ignored.code, 0) << ignored.err;
    EXPECT_EQ(ignored.out, "xxxx\n");
    EXPECT_TRUE(has(ignored.err, "generation 4 tokens")) << ignored.err;
    ASSERT_EQ(stopped.code, 0) << stopped.err;
    EXPECT_EQ(stopped.out, "\n");
    EXPECT_TRUE(has(stopped.err, "generation 0 tokens")) << stopped.err;
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

TEST(Cli, BenchAtDepthReportsTheDepthOfEveryTest) {
    auto r = run_cli("bench -m " + tiny_model_path(512) + " -p 8 -n 4 -d 24 -r 2 -t 1 -o json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 2u) << r.out;
    EXPECT_EQ(j[0]["test"], "pp8 @ d24");
    EXPECT_EQ(j[0]["n_prompt"], 8);
    EXPECT_EQ(j[0]["n_gen"], 0);
    EXPECT_EQ(j[1]["test"], "tg4 @ d24");
    EXPECT_EQ(j[1]["n_prompt"], 0);
    EXPECT_EQ(j[1]["n_gen"], 4);
    for (const auto& t : j) {
        EXPECT_EQ(t["n_depth"], 24);
        EXPECT_EQ(t["samples_ts"].size(), 2u);
        EXPECT_GT(t["avg_ts"].get<double>(), 0.0);
        EXPECT_GE(t["stddev_ts"].get<double>(), 0.0);
    }
    // Without -d the depth is 0 and the names are llama-bench's plain ones.
    auto r0 = run_cli("bench -m " + tiny_model_path(512) + " -p 8 -n 0 -r 1 -t 1 -o json");
    ASSERT_EQ(r0.code, 0) << r0.err;
    const auto j0 = nlohmann::json::parse(r0.out);
    ASSERT_EQ(j0.size(), 1u);
    EXPECT_EQ(j0[0]["test"], "pp8");
    EXPECT_EQ(j0[0]["n_depth"], 0);
    // A negative depth is a usage error.
    auto bad = run_cli("bench -m " + tiny_model_path(512) + " -d -1");
    EXPECT_EQ(bad.code, 2) << bad.err;
    EXPECT_TRUE(has(bad.err, "-d")) << bad.err;
}

// --roofline: each tg repetition's weight bytes per second beside the
// streaming read of the weights around it; the prompt test has none.
TEST(Cli, BenchRooflineGivesEachGenerationRepetitionAReadRate) {
    auto r =
        run_cli("bench -m " + tiny_model_path(512) + " -p 8 -n 4 -r 3 -t 2 --roofline -o json");
    ASSERT_EQ(r.code, 0) << r.err;
    const auto j = nlohmann::json::parse(r.out);
    ASSERT_EQ(j.size(), 2u) << r.out;
    EXPECT_FALSE(j[0].contains("read_gbps")) << "pp8 reads no roofline";
    const auto& tg = j[1];
    ASSERT_EQ(tg["read_gbps"].size(), 3u) << r.out;
    ASSERT_EQ(tg["samples_gbps"].size(), 3u) << r.out;
    for (size_t i = 0; i < 3; ++i) {
        EXPECT_GT(tg["read_gbps"][i].get<double>(), 0.0);
        // a repetition's GB/s is its tokens/s times the bytes per token
        const double per_token = tg["gbps"].get<double>() / tg["avg_ts"].get<double>();
        EXPECT_NEAR(tg["samples_gbps"][i].get<double>(),
                    per_token * tg["samples_ts"][i].get<double>(),
                    1e-9 * tg["samples_gbps"][i].get<double>());
    }
    auto md = run_cli("bench -m " + tiny_model_path(512) + " -p 0 -n 2 -r 2 -t 1 --roofline");
    ASSERT_EQ(md.code, 0) << md.err;
    EXPECT_TRUE(has(md.out, "tg2, weights read per repetition")) << md.out;
    EXPECT_TRUE(has(md.out, "  2: ")) << md.out;
}

TEST(Cli, BenchDepthIsInTheCacheAndTheContextHoldsDepthPlusTests) {
    const minfer::model::Model model = minfer::model::Model::load(tiny_model_path(512));
    minfer::runtime::BenchParams bp;
    bp.n_prompt = 6;
    bp.n_gen = 3;
    bp.n_depth = 20;
    bp.reps = 1;
    bp.session.n_threads = 1;
    int64_t n_ctx = -1, n_past_at_start = -1, n_past_at_end = -1;
    bp.on_start = [&](minfer::runtime::Session& s) {
        n_ctx = s.n_ctx();
        n_past_at_start = s.n_past();
    };
    bp.on_finish = [&](minfer::runtime::Session& s) { n_past_at_end = s.n_past(); };
    const auto res = minfer::runtime::run_bench(model, bp);
    ASSERT_EQ(res.size(), 2u);
    EXPECT_EQ(n_ctx, 20 + 6 + 3);
    EXPECT_EQ(n_past_at_start, 0);
    // The last repetition of tg3 ran after the 20 depth tokens.
    EXPECT_EQ(n_past_at_end, 20 + 3);
    EXPECT_EQ(res[0].n_depth, 20);
    EXPECT_EQ(res[1].n_depth, 20);
    // The prompt test's operations count the depth's attention.
    EXPECT_GT(minfer::runtime::prompt_ops(model, 6, 20), minfer::runtime::prompt_ops(model, 6, 0));
}

TEST(Cli, DifferentKAndVCacheTypesAreRefusedNamingBoth) {
    const std::string m = tiny_model_path();
    // An explicit -ctv f32 against -ctk f16 is not the default: refused, and
    // so is -ctv alone when it differs from the (default f32) K type.
    for (const char* flags : {"-ctk f16 -ctv f32", "-ctk f32 -ctv f16", "-ctv f16"}) {
        auto r = run_cli("-m " + m + " -p hi -n 1 -c 64 " + flags);
        EXPECT_EQ(r.code, 2) << flags << "\n" << r.err;
        const bool k16 = has(flags, "-ctk f16");
        EXPECT_TRUE(
            has(r.err, k16 ? "-ctk f16 and -ctv f32 differ" : "-ctk f32 and -ctv f16 differ"))
            << flags << "\n"
            << r.err;
        EXPECT_TRUE(r.out.empty()) << r.out;
    }
    // One type for both, however it is spelled.
    for (const char* flags : {"-ctk f16", "-ctk f16 -ctv f16", "-ctv f32", ""}) {
        auto r = run_cli("-m " + m + " -p hi -n 1 -c 64 " + flags);
        EXPECT_EQ(r.code, 0) << flags << "\n" << r.err;
    }
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

// ---- structured output: --json-schema, --json-schema-file, --grammar, --grammar-file ----

namespace {

// A file in the temporary directory holding `text`, removed by the caller's
// scope end.
struct TempText {
    std::string path;
    explicit TempText(const std::string& name, const std::string& text)
        : path((std::filesystem::temp_directory_path() /
                ("minfer-cli-" + std::to_string(::getpid()) + "-" + name))
                   .string()) {
        std::ofstream(path, std::ios::binary) << text;
    }
    ~TempText() { std::filesystem::remove(path); }
};

const char* const kVerseSchema =
    R"({"type": "object", "properties": {"book": {"enum": ["Genesis", "Exodus", "Psalms"]},)"
    R"( "chapter": {"type": "integer", "minimum": 1, "maximum": 150},)"
    R"( "text": {"type": "string", "maxLength": 40}},)"
    R"( "required": ["book", "chapter", "text"], "additionalProperties": false})";

}  // namespace

// The built-in model writes verses, never JSON: with a schema, at
// temperature 1 and greedy, stdout is one object with the schema's fields,
// and the timing line gives the compile time and the mask percentiles.
TEST(Cli, JsonSchemaConstrainsTheOutput) {
    TempText schema("verse.json", kVerseSchema);
    for (const std::string flags : {"--temp 0", "--temp 1 --seed 5"}) {
        auto r = run_cli("-p 'And God said' -n 120 --no-display-prompt " + flags + " -jf " +
                         schema.path);
        ASSERT_EQ(r.code, 0) << r.err;
        const auto j = nlohmann::json::parse(r.out, nullptr, false);
        ASSERT_FALSE(j.is_discarded()) << flags << ": not JSON: " << r.out;
        ASSERT_TRUE(j.is_object()) << r.out;
        EXPECT_EQ(j.size(), 3u) << r.out;
        EXPECT_TRUE(j["book"] == "Genesis" || j["book"] == "Exodus" || j["book"] == "Psalms")
            << r.out;
        ASSERT_TRUE(j["chapter"].is_number_integer()) << r.out;
        EXPECT_GE(j["chapter"].get<int>(), 1);
        EXPECT_LE(j["chapter"].get<int>(), 150);
        ASSERT_TRUE(j["text"].is_string()) << r.out;
        EXPECT_TRUE(has(r.err, "grammar compiled in")) << r.err;
        EXPECT_TRUE(has(r.err, "mask per token p50")) << r.err;
    }
    // The same schema inline, and a GBNF grammar inline and from a file.
    auto inline_schema = run_cli("-p 'And God said' -n 120 --temp 0 --no-display-prompt -j '" +
                                 std::string(kVerseSchema) + "'");
    ASSERT_EQ(inline_schema.code, 0) << inline_schema.err;
    EXPECT_EQ(
        inline_schema.out,
        run_cli("-p 'And God said' -n 120 --temp 0 --no-display-prompt -jf " + schema.path).out);
    TempText gbnf("yes.gbnf", "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\"\n");
    for (const std::string& flag : {"--grammar-file " + gbnf.path,
                                    std::string("--grammar 'root ::= (\"yes\" | \"no\") \".\"'")}) {
        auto r = run_cli("-p 'And God said' -n 20 --temp 1 --seed 2 --no-display-prompt " + flag);
        ASSERT_EQ(r.code, 0) << r.err;
        EXPECT_TRUE(r.out == "yes.\n" || r.out == "no.\n") << flag << ": " << r.out;
    }
}

// A schema or grammar the engine cannot enforce is an error naming the flag,
// the file and what is wrong (the keyword and where, the grammar's line);
// two constraints at once are a usage error.
TEST(Cli, BadSchemaOrGrammarIsAnErrorNamingWhatIsWrong) {
    auto r = run_cli(
        "-p hi -n 4 -j '{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"array\", "
        "\"uniqueItems\": true}}}'");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "--json-schema")) << r.err;
    EXPECT_TRUE(has(r.err, "uniqueItems")) << r.err;
    EXPECT_TRUE(has(r.err, "/properties/a")) << r.err;
    TempText bad("bad.gbnf", "root ::= \"a\" item\nitem := \"b\"\n");
    r = run_cli("-p hi -n 4 --grammar-file " + bad.path);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "--grammar-file " + bad.path)) << r.err;
    EXPECT_TRUE(has(r.err, "line 2")) << r.err;
    r = run_cli("-p hi -n 4 --grammar 'root ::= \"a\" missing'");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "missing")) << r.err;
    r = run_cli("-p hi -n 4 -jf /nonexistent/schema.json");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "/nonexistent/schema.json")) << r.err;
    r = run_cli("-p hi -n 4 --grammar 'root ::= \"a\"' -j '{}'");
    EXPECT_EQ(r.code, 2) << r.err;
    EXPECT_TRUE(has(r.err, "give one of")) << r.err;
}

// batched-bench --json-schema-file: every sequence constrained; the table
// counts the tokens generated, and a line per row gives the masks' times.
TEST(BatchedBench, JsonSchemaFileConstrainsEverySequence) {
    TempText schema("bench.json", kVerseSchema);
    auto r = run_cli("batched-bench -c 1024 -b 64 -t 2 -npp 8 -ntg 12 -npl 1,3 -jf " + schema.path);
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "compiled in")) << r.err;
    EXPECT_TRUE(has(r.out, "constraint: ")) << r.out;
    EXPECT_TRUE(has(r.out, "mask per decode token p50")) << r.out;
    EXPECT_TRUE(has(r.out, "of 3 outputs complete")) << r.out;
}
