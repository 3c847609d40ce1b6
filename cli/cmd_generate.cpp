// minfer [-m MODEL] -p PROMPT ...: text generation with llama.cpp's flags.
// stdout holds only text (the prompt unless --no-display-prompt, then the
// generation); every report goes to stderr.
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "generate_flags.h"
#include "model/model.h"
#include "report/observe.h"
#include "runtime/generation.h"
#include "runtime/sample_text.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

volatile std::sig_atomic_t g_interrupted = 0;
// The first Ctrl-C stops generation at the next token (what was generated
// stays printed); a second one, for a process stuck in a long prompt pass,
// exits at once.
void on_sigint(int) {
    if (g_interrupted) _exit(130);
    g_interrupted = 1;
}
// A chat installs it without SA_RESTART, so that getline() waiting on the
// terminal sees the interrupt (the read fails with EINTR) instead of waiting
// for Enter; otherwise interrupted writes of the streamed text restart.
void install_sigint_handler(bool restart) {
    struct sigaction sa {};
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGINT, &sa, nullptr);
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error("cannot read prompt file '" + path + "'");
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

struct Timing {
    double load_s = 0;
    int64_t prompt_tokens = 0;
    double prompt_s = 0;
    int64_t gen_tokens = 0;
    double gen_s = 0;
    // With a constraint: its compile time and each sampled token's mask time.
    double compile_ms = -1;
    std::vector<float> mask_us;
};

void print_timing(const Timing& t) {
    auto rate = [](int64_t n, double s) { return s > 0 ? static_cast<double>(n) / s : 0.0; };
    std::fprintf(stderr,
                 "\nminfer: load time %.2f ms\n"
                 "minfer: prompt eval %lld tokens in %.2f ms (%.2f t/s)\n"
                 "minfer: generation %lld tokens in %.2f ms (%.2f t/s)\n",
                 t.load_s * 1e3, static_cast<long long>(t.prompt_tokens), t.prompt_s * 1e3,
                 rate(t.prompt_tokens, t.prompt_s), static_cast<long long>(t.gen_tokens),
                 t.gen_s * 1e3, rate(t.gen_tokens, t.gen_s));
    if (t.compile_ms >= 0)
        std::fprintf(stderr, "minfer: grammar compiled in %.2f ms; mask per token %s\n",
                     t.compile_ms, mask_time_summary(t.mask_us).c_str());
}

void print(const std::string& text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
}

// Generates after the session has consumed its input; streams the text to
// stdout. Each token is chosen and the generation ended by the engine's rule
// (runtime::next_token: end-of-generation tokens, masked under --ignore-eos;
// the constraint; n_predict; the context end) and the stop strings are the
// server's matcher (runtime::SampleText; the stop string is kept in the
// output). Returns the reply's text as the KV cache holds it. Ctrl-C stops
// it at the next token.
std::string generate(runtime::Session& session, const tokenizer::Tokenizer& tok,
                     runtime::SequenceSampler& sampler, std::vector<float> logits,
                     int64_t n_predict, const GenFlags& f, Timing& timing) {
    runtime::SampleText text(tok, f.stops, runtime::StopText::Keep);
    const auto emit = [&](int32_t id) {
        const bool go_on = text.push(id);
        print(text.take_ready());
        ++timing.gen_tokens;
        return go_on;
    };
    const auto t0 = Clock::now();
    for (int64_t n_sampled = 0; !g_interrupted; ++n_sampled) {
        const runtime::NextToken next = runtime::next_token(sampler, logits,
                                                            {.n_sampled = n_sampled,
                                                             .n_predict = n_predict,
                                                             .n_cached = session.n_past(),
                                                             .n_ctx = session.n_ctx()},
                                                            emit);
        if (sampler.constrained() && next.token >= 0) timing.mask_us.push_back(sampler.mask_us());
        if (next.end == runtime::FinishReason::ContextFull)
            std::fprintf(stderr, "\nminfer: the context is full (%lld tokens); stopping\n",
                         static_cast<long long>(session.n_ctx()));
        // In a chat the cache must hold every token of the reply, so the
        // next turn continues from it.
        if (next.end && next.emitted && f.chat && session.n_past() < session.n_ctx())
            session.eval(std::span<const int32_t>(&next.token, 1));
        if (next.end) break;
        logits = session.eval(std::span<const int32_t>(&next.token, 1));
    }
    print(text.finish());
    timing.gen_s += seconds_since(t0);
    return text.decoded();
}

}  // namespace

int cmd_generate(int argc, char** argv, int first) {
    GenFlags f;
    f.model_path = default_model_path();
    ArgParser p(
        "minfer",
        "Generates text from a prompt with a Qwen-family GGUF model (llama.cpp's flags).\n"
        "With no -m it uses the built-in model, a tiny model trained on the King James Bible.");
    add_generate_flags(p, f);
    p.epilog(
        "Examples:\n"
        "  minfer -p \"And God said\" -n 64\n"
        "  minfer -m qwen2.5-0.5b-instruct-q4_k_m.gguf -cnv -sys \"You are helpful.\"\n"
        "  minfer -p \"A verse as JSON:\" -jf verse.schema.json   (output valid against it)");
    if (!p.parse(argc, argv, first)) return 0;
    check_generate_flags(f);
    if (!f.prompt_file.empty()) f.prompt = read_file(f.prompt_file);
    if (!f.chat && f.prompt.empty())
        throw UsageError("give a prompt with -p or -f (or chat with -cnv)");
    if (f.seed < 0) f.seed = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
    f.sp.seed = static_cast<uint64_t>(f.seed);

    const auto t_load = Clock::now();
    model::Model model = f.eng.load_model(f.model_path);
    tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(model.file);
    Timing timing;

    std::vector<int32_t> prompt_ids;
    if (!f.chat) prompt_ids = tok.encode(f.prompt, !f.no_special_parse);
    auto ctx = runtime::plan_context(f.eng.ctx_size, p.was_set("-c"), model.hp.n_ctx_train,
                                     static_cast<int64_t>(prompt_ids.size()), f.n_predict);
    if (!ctx.warning.empty()) warn(ctx.warning);
    runtime::SessionOptions so = f.eng.session_options();
    so.n_ctx = ctx.n_ctx;
    runtime::Session session(model, so);
    const auto constraint = f.constraint.compile(tok);
    if (constraint) timing.compile_ms = constraint->compile_ms;
    runtime::SequenceSampler sampler(
        {.sampler = f.sp, .ignore_eos = f.ignore_eos, .constraint = constraint}, tok.eog_ids());
    f.observe.attach(session);
    timing.load_s = seconds_since(t_load);
    std::fprintf(
        stderr, "minfer: model %s (%s, %lld layers), n_ctx %lld, seed %lld, threads %d, %s\n",
        f.model_path.c_str(), model.hp.arch_name.c_str(), static_cast<long long>(model.hp.n_layer),
        static_cast<long long>(so.n_ctx), static_cast<long long>(f.seed),
        session.options().n_threads, cpu_kernels_note().c_str());

    install_sigint_handler(!f.chat);
    if (!f.chat) {
        if (prompt_ids.empty()) throw Error("the prompt tokenizes to no tokens");
        if (!f.no_display_prompt) {
            std::fwrite(f.prompt.data(), 1, f.prompt.size(), stdout);
            std::fflush(stdout);
        }
        const auto t0 = Clock::now();
        std::vector<float> logits = session.eval(prompt_ids);
        timing.prompt_s = seconds_since(t0);
        timing.prompt_tokens = static_cast<int64_t>(prompt_ids.size());
        sampler.start_reply(prompt_ids);
        generate(session, tok, sampler, std::move(logits), f.n_predict, f, timing);
        std::fputc('\n', stdout);
        if (g_interrupted) std::fprintf(stderr, "\nminfer: interrupted\n");
        print_timing(timing);
        f.observe.finish(session, {{"model", f.model_path}, {"prompt", f.prompt}});
        return g_interrupted ? 130 : 0;
    }

    // Chat: ChatML rendered natively; the KV cache is kept between turns and
    // only the new part of the conversation is run each turn.
    const auto jinja = model.file.get_string("tokenizer.chat_template");
    if (f.chat_template.empty() &&
        (!jinja || tokenizer::detect_chat_template(*jinja) != tokenizer::ChatTemplateKind::ChatML))
        warn(
            "the model's chat template is not ChatML; using ChatML anyway (--chat-template "
            "chatml)");
    std::vector<tokenizer::ChatMessage> messages;
    if (!f.system_prompt.empty()) messages.push_back({"system", f.system_prompt});
    std::string rendered;  // what the KV cache holds, as text
    std::string line;
    while (!g_interrupted) {
        std::fputs("\n> ", stderr);
        std::fflush(stderr);
        errno = 0;
        if (!std::getline(std::cin, line)) {
            // EINTR: Ctrl-C at the prompt (the handler may not have run yet
            // where signal delivery is deferred, as under ThreadSanitizer).
            if (errno == EINTR) g_interrupted = 1;
            break;
        }
        if (line.empty()) continue;
        messages.push_back({"user", line});
        std::string full = tokenizer::render_chatml(messages, true, f.no_think);
        // The cache holds `rendered`; only what follows it is run. Should the
        // history ever render differently from what was run, start over
        // rather than continue from a cache that disagrees with the text.
        std::string delta = full;
        if (full.compare(0, rendered.size(), rendered) == 0) {
            delta = full.substr(rendered.size());
        } else {
            session.truncate(0);
        }
        std::vector<int32_t> ids = tok.encode(delta, true);
        if (session.n_past() + static_cast<int64_t>(ids.size()) >= session.n_ctx()) {
            std::fprintf(stderr,
                         "minfer: the conversation no longer fits in the context (%lld tokens)\n",
                         static_cast<long long>(session.n_ctx()));
            break;
        }
        const auto t0 = Clock::now();
        std::vector<float> logits = session.eval(ids);
        timing.prompt_s += seconds_since(t0);
        timing.prompt_tokens += static_cast<int64_t>(ids.size());
        sampler.start_reply(ids);
        std::string reply =
            generate(session, tok, sampler, std::move(logits), f.n_predict, f, timing);
        std::fputc('\n', stdout);
        std::fflush(stdout);
        // With --no-think the generation prompt ended with an empty think
        // block that the model's reply continues: it is part of the reply's
        // history, so that the next rendering starts with what the cache holds.
        messages.push_back(
            {"assistant", (f.no_think ? std::string("<think>\n\n</think>\n\n") : "") + reply});
        // The cache holds the reply's tokens but not its closing <|im_end|>\n:
        // the next turn's delta starts with them.
        rendered = full + reply;
    }
    if (g_interrupted) std::fprintf(stderr, "\nminfer: interrupted\n");
    print_timing(timing);
    f.observe.finish(session, {{"model", f.model_path}});
    return g_interrupted ? 130 : 0;
}

}  // namespace minfer::cli
