// Limits at run time, through the minfer binary: prompts and generations that
// meet the context, a context the machine cannot allocate, and Ctrl-C during
// generation. Each must end with a clear message and the right exit code,
// never a crash, and keep what was already generated.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "cli_runner.h"
#include "tiny_model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using minfer::testing::read_whole;
using minfer::testing::run_cli;

namespace {

namespace fs = std::filesystem;

bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
}

// Sanitizer runtimes reserve terabytes of address space: `ulimit -v` cannot
// be used under them (they would not even start).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

fs::path temp_path(const std::string& name) {
    return fs::temp_directory_path() / ("minfer-limits-" + std::to_string(::getpid()) + "-" + name);
}

// Removes the written models when the test process ends.
struct TempFiles {
    std::map<std::tuple<int64_t, int64_t, int64_t>, std::string> paths;
    ~TempFiles() {
        for (auto& [k, p] : paths) {
            std::error_code ec;
            fs::remove(p, ec);
        }
    }
};

// A tiny qwen3 model written once per (trained context, head size, kv heads).
std::string model_path(int64_t n_ctx_train, int64_t head_dim = 16, int64_t n_head_kv = 2) {
    static TempFiles files;
    auto& paths = files.paths;
    const auto key = std::make_tuple(n_ctx_train, head_dim, n_head_kv);
    if (auto it = paths.find(key); it != paths.end()) return it->second;
    minfer::testing::TinyModelSpec s;
    s.arch = "qwen3";
    s.n_ctx_train = n_ctx_train;
    s.head_dim = head_dim;
    s.n_head_kv = n_head_kv;
    s.n_layer = 1;
    const std::string p = temp_path(std::to_string(n_ctx_train) + "-" + std::to_string(head_dim) +
                                    "-" + std::to_string(n_head_kv) + ".gguf")
                              .string();
    minfer::testing::make_tiny_model(s).write(p);
    return paths[key] = p;
}

int64_t count_after(const std::string& err, const std::string& prefix) {
    const size_t p = err.find(prefix);
    if (p == std::string::npos) return -1;
    return std::stoll(err.substr(p + prefix.size()));
}

}  // namespace

TEST(Limits, PromptLongerThanTheTrainedContextIsAnErrorBeforeAnyOutput) {
    std::string prompt;
    for (int i = 0; i < 100; ++i) prompt += "a ";  // 100+ tokens; trained context 64
    auto r = run_cli("-m " + model_path(64) + " -p '" + prompt + "' -n 1");
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "minfer: error: the prompt has ")) << r.err;
    EXPECT_TRUE(has(r.err, "more than the model's trained context length of 64 tokens")) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out;
}

TEST(Limits, GenerationPastTheContextStopsWithAMessageAndKeepsTheOutput) {
    // "a b" is 3 tokens with the byte-level vocabulary ("a", " ", "b"... the
    // exact count is read from the report). The last sampled token is
    // printed but not evaluated: generated = n_ctx - n_prompt + 1.
    auto r = run_cli("-m " + model_path(64) +
                     " -p 'a b' -n 500 --temp 0 --ignore-eos --no-display-prompt -c 32");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err, "minfer: the context is full (32 tokens); stopping")) << r.err;
    const int64_t n_prompt = count_after(r.err, "prompt eval ");
    const int64_t n_gen = count_after(r.err, "generation ");
    ASSERT_GT(n_prompt, 0) << r.err;
    EXPECT_EQ(n_gen, 32 - n_prompt + 1) << r.err;
    EXPECT_FALSE(r.out.empty());
}

TEST(Limits, ContextLargerThanTrainedIsClampedWithAWarning) {
    auto r = run_cli("-m " + model_path(64) + " -p 'a' -n 1 -c 1000000");
    ASSERT_EQ(r.code, 0) << r.err;
    EXPECT_TRUE(has(r.err,
                    "minfer: warning: context size 1000000 is larger than the model's trained "
                    "context length; using 64"))
        << r.err;
    EXPECT_TRUE(has(r.err, "n_ctx 64,")) << r.err;
}

TEST(Limits, AContextTooLargeToAllocateIsAnOutOfMemoryErrorNotACrash) {
    // Trained context 2^24 and 4 KV heads of 4096: one K region is
    // 2^24 * 16384 * 4 bytes = 1 TiB, more than the RAM of any machine this
    // runs on. The CLI refuses it before loading (the memory check), and
    // when told there is room (MINFER_MEM_AVAILABLE) the pool refuses it
    // before allocating anything (zeroing a region the kernel overcommitted
    // would get the process killed instead). Without a sanitizer the address
    // space is also capped (ulimit -v 4 GiB) so that no other allocation can
    // succeed by overcommit either.
    const std::string limit = kSanitized ? "" : "ulimit -v 4194304 && ";
    const std::string env =
        "ASAN_OPTIONS=$ASAN_OPTIONS:allocator_may_return_null=1 "
        "TSAN_OPTIONS=$TSAN_OPTIONS:allocator_may_return_null=1 ";
    const std::string cmd = "-m " + model_path(1 << 24, 4096, 4) + " -c 16777216 -p hi -n 1";
    const fs::path out = temp_path("oom.out"), err = temp_path("oom.err");
    auto run = [&](const std::string& extra_env) {
        // run_cli prefixes the binary; the limit must come first: run it through sh.
        const std::string sh = "(" + limit + env + extra_env + MINFER_BINARY + " " + cmd + ") > " +
                               out.string() + " 2> " + err.string() + " < /dev/null";
        const int status = std::system(sh.c_str());
        EXPECT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
        const std::string e = read_whole(err);
        EXPECT_EQ(WEXITSTATUS(status), 1) << e;
        EXPECT_FALSE(has(e, "internal error")) << e;
        return e;
    };
    const std::string refused = run("");
    EXPECT_TRUE(has(refused, "does not fit in memory: it needs ")) << refused;
    EXPECT_TRUE(has(refused, "2097152 MiB of KV cache")) << refused;
    const std::string oom = run("MINFER_MEM_AVAILABLE=4096G ");
    EXPECT_TRUE(has(oom,
                    "minfer: error: out of memory allocating 1048576 MiB for the KV cache of "
                    "layer 0 (2 x 1048576 MiB); a smaller context (-c) needs less"))
        << oom;
    fs::remove(out);
    fs::remove(err);
}

TEST(Limits, CtrlCDuringGenerationKeepsTheTextAndExitsCleanly) {
    // A context of 16384 tokens with --ignore-eos -n -1 generates for far
    // longer than the test waits (attention cost grows with every token).
    const fs::path out = temp_path("sigint.out"), err = temp_path("sigint.err");
    const std::string model = model_path(16384);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        std::FILE* o = std::freopen(out.c_str(), "w", stdout);
        std::FILE* e = std::freopen(err.c_str(), "w", stderr);
        (void)o;
        (void)e;
        ::execl(MINFER_BINARY, MINFER_BINARY, "-m", model.c_str(), "--ignore-eos", "-n", "-1", "-c",
                "16384", "-p", "hi", "--no-display-prompt", "-t", "1", static_cast<char*>(nullptr));
        ::_exit(127);
    }
    // The handler is installed once the model is loaded, before the prompt
    // runs: wait until generated text appears (a slow sanitizer start-up
    // included), then let it run for ~300 ms more.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline) {
        std::error_code ec;
        if (fs::exists(out) && fs::file_size(out, ec) > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ASSERT_EQ(::kill(pid, SIGINT), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    const std::string o = read_whole(out), e = read_whole(err);
    ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status) << "\n" << e;
    EXPECT_EQ(WEXITSTATUS(status), 130) << e;
    EXPECT_GT(o.size(), 1u);    // the generated text stayed printed
    EXPECT_EQ(o.back(), '\n');  // and the line was ended
    EXPECT_TRUE(has(e, "minfer: interrupted")) << e;
    const int64_t n_gen = count_after(e, "generation ");
    EXPECT_GT(n_gen, 0) << e;  // the timing summary was printed
    EXPECT_LT(n_gen, 16384) << e;
    EXPECT_TRUE(has(e, "t/s)")) << e;
    fs::remove(out);
    fs::remove(err);
}

TEST(Limits, CtrlCWhileTheChatWaitsForInputEndsTheChat) {
    // The chat reads its turns from a pipe that stays open and empty: without
    // the handler's no-SA_RESTART read, getline() would wait forever.
    const fs::path err = temp_path("chat.err");
    int pipefd[2];
    ASSERT_EQ(::pipe(pipefd), 0);
    const std::string model = model_path(256);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        ::dup2(pipefd[0], 0);
        ::close(pipefd[1]);
        std::FILE* o = std::freopen("/dev/null", "w", stdout);
        std::FILE* e = std::freopen(err.c_str(), "w", stderr);
        (void)o;
        (void)e;
        ::execl(MINFER_BINARY, MINFER_BINARY, "-m", model.c_str(), "-cnv", "-n", "2", "-t", "1",
                static_cast<char*>(nullptr));
        ::_exit(127);
    }
    ::close(pipefd[0]);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (std::chrono::steady_clock::now() < deadline && !has(read_whole(err), "\n> "))
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_EQ(::kill(pid, SIGINT), 0);
    // It must exit by itself; give it 20 s, then kill it and fail.
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 2000 && done == 0; ++i) {
        done = ::waitpid(pid, &status, WNOHANG);
        if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (done == 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
    }
    ::close(pipefd[1]);
    const std::string e = read_whole(err);
    ASSERT_NE(done, 0) << "the chat did not end after Ctrl-C\n" << e;
    ASSERT_TRUE(WIFEXITED(status)) << e;
    EXPECT_EQ(WEXITSTATUS(status), 130) << e;
    EXPECT_TRUE(has(e, "minfer: interrupted")) << e;
    fs::remove(err);
}

TEST(Limits, ChatTurnsRunOnlyTheNewTextAlsoWithNoThink) {
    // Turn 2 must run exactly the text that follows what the cache holds:
    // the closing of the reply and the new user turn. (--no-think used to
    // leave the empty think block out of the history, so the second turn's
    // text was cut at the wrong place.)
    const std::string model = model_path(512);
    auto r =
        run_cli("-m " + model + " -cnv -n 3 --temp 0 --ignore-eos --no-think", "Hi\nthe end\n");
    ASSERT_EQ(r.code, 0) << r.err;
    auto file = minfer::gguf::File::open(model);
    auto tok = minfer::tokenizer::Tokenizer::from_gguf(file);
    const std::string turn1 = minfer::tokenizer::render_chatml({{"user", "Hi"}}, true, true);
    const std::string turn2 =
        "<|im_end|>\n<|im_start|>user\nthe "
        "end<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    const int64_t expected =
        static_cast<int64_t>(tok.encode(turn1, true).size() + tok.encode(turn2, true).size());
    EXPECT_EQ(count_after(r.err, "prompt eval "), expected) << r.err;
    EXPECT_TRUE(has(r.err, "generation 6 tokens")) << r.err;
}

TEST(Limits, FlagValuesOutOfRangeAreUsageErrors) {
    // --temp 1e39 is a finite double but no float: converting it was
    // undefined behaviour (UBSan: float-cast-overflow) before the range check.
    for (const char* args : {"--temp 1e39", "--top-p -1e300", "--top-k -1", "--repeat-last-n -2",
                             "-c 99999999999999999999", "-t 3000000000", "--min-p nan",
                             "--queue-layers 2:1", "-ctk q4_0"}) {
        auto r = run_cli(std::string("-m /nonexistent.gguf -p hi ") + args);
        EXPECT_EQ(r.code, 2) << args << ": " << r.err;
        EXPECT_EQ(r.err.rfind("minfer: error: ", 0), 0u) << args << ": " << r.err;
        EXPECT_TRUE(r.out.empty()) << args;
    }
}
