// minfer batched-bench -m M -c N -b B -t T -ctk f16 -npp 128 -ntg 128 -npl 1,4,8,16 [-pps]:
// llama-batched-bench's measure on the many-sequence engine. For each B in
// -npl (and each PP, TG): B sequences, each its own random prompt of PP
// tokens (-pps: one shared prompt), prefilled, then TG generation steps in
// which every sequence decodes one token. The table goes to stderr with
// -o json (then stdout holds one JSON object per line and nothing else),
// to stdout otherwise.
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "common.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "tokenizer/tokenizer.h"
#include "util/args.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

std::vector<int64_t> parse_list(const std::string& s, const char* flag) {
    std::vector<int64_t> out;
    std::stringstream ss(s);
    std::string item;
    while (std::getline(ss, item, ',')) {
        char* end = nullptr;
        const long long v = std::strtoll(item.c_str(), &end, 10);
        if (item.empty() || *end != '\0' || v < 1 || v > (1 << 20))
            throw UsageError(std::string(flag) +
                             " needs a comma-separated list of positive "
                             "integers, got '" +
                             s + "'");
        out.push_back(v);
    }
    if (out.empty()) throw UsageError(std::string(flag) + " is empty");
    return out;
}

struct Row {
    int64_t pp, tg, pl, n_kv;
    double t_pp, t_tg;
};

// B sequences, each one shared prefix of n_prefix tokens plus n_own of its
// own, submitted one after another (each once the one before has its first
// token; the earlier ones keep decoding, so a newcomer's prompt shares its
// passes with their decode tokens, as under a server): the prefill time of
// each (submit to first token), its cached tokens, and the KV pages they
// hold together against B unshared copies.
int shared_prefix_measure(runtime::Engine& engine, const model::Model& model, int64_t n_prefix,
                          int64_t n_own, int64_t n_seqs, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.hp.n_vocab - 1));
    std::vector<int32_t> prefix(static_cast<size_t>(n_prefix));
    for (auto& t : prefix) t = tok(rng);
    std::printf(
        "| seq | prompt | cached | prefill ms | vs first "
        "|\n|-----|--------|--------|------------|----------|\n");
    double first_ms = 0;
    std::vector<runtime::RequestId> ids;
    for (int64_t i = 0; i < n_seqs; ++i) {
        runtime::GenParams gp;
        gp.prompt = prefix;
        for (int64_t j = 0; j < n_own; ++j) gp.prompt.push_back(tok(rng));
        gp.n_predict = -1;  // held until the end: all B sequences hold their pages at once
        gp.ignore_eos = true;
        gp.sampling.temp = 0.0f;
        bool got = false;
        runtime::RequestCallbacks cb;
        cb.on_token = [&](const runtime::TokenEvent&) {
            got = true;
            return true;
        };
        const auto t0 = std::chrono::steady_clock::now();
        const int64_t hits_before = engine.stats().prefix_hit_tokens;
        ids.push_back(engine.submit(std::move(gp), std::move(cb)));
        while (!got) engine.step();
        const double ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count();
        if (i == 0) first_ms = ms;
        std::printf("| %3lld | %6lld | %6lld | %10.1f | %7.1f%% |\n", static_cast<long long>(i + 1),
                    static_cast<long long>(n_prefix + n_own),
                    static_cast<long long>(engine.stats().prefix_hit_tokens - hits_before), ms,
                    100.0 * ms / first_ms);
        std::fflush(stdout);
    }
    const runtime::EngineStats st = engine.stats();
    const int64_t P = st.page_cells;
    const int64_t unshared = n_seqs * ((n_prefix + n_own + 1 + P - 1) / P);
    std::printf(
        "\nKV pages held by the %lld sequences: %lld; %lld unshared copies would need %lld "
        "(%.3f of that)\n",
        static_cast<long long>(n_seqs), static_cast<long long>(st.pages_used),
        static_cast<long long>(n_seqs), static_cast<long long>(unshared),
        static_cast<double>(st.pages_used) / static_cast<double>(unshared));
    std::fputs(engine.kv_page_map().c_str(), stdout);
    for (auto id : ids) engine.cancel(id);
    engine.step();
    return 0;
}

}  // namespace

int cmd_batched_bench(int argc, char** argv, int first) {
    std::string model_path = default_model_path();
    std::string npp_s = "128", ntg_s = "128", npl_s = "1,4,8,16", output = "md";
    bool pps = false, mem_report = false;
    int64_t n_prefix = 0;
    uint64_t seed = 1234;
    int64_t seed_arg = 1234;
    EngineFlags eng;
    ConstraintFlags constraint_flags;
    eng.ctx_size = 8192;
    eng.batch_size = 2048;
    ArgParser p("minfer batched-bench",
                "Throughput of many sequences in one engine, as llama-batched-bench.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
    p.option({"-npp"}, &npp_s, "LIST", "prompt tokens per sequence (comma-separated)");
    p.option({"-ntg"}, &ntg_s, "LIST", "generated tokens per sequence (comma-separated)");
    p.option({"-npl"}, &npl_s, "LIST", "parallel sequences B (comma-separated)");
    p.flag({"-pps"}, &pps, "one prompt shared by all sequences (mapped from the prefix cache)");
    p.option({"-o", "--output"}, &output, "FMT", "md (table on stdout) or json (JSON lines)");
    p.option({"--seed"}, &seed_arg, "N", "seed of the random prompts");
    p.option({"-npfx"}, &n_prefix, "N",
             "instead of the table: the shared-prefix measure, B = max(-npl) sequences of one "
             "N-token prefix plus -npp own tokens, run one after another");
    p.flag({"--mem-report"}, &mem_report,
           "print the KV page map (who holds which page) when each prefill ends, to stderr");
    eng.add_to(p, /*with_ctx=*/true);
    constraint_flags.add_to(p, /*schema_file_only=*/true);
    p.epilog(
        "N_KV = B*(PP+TG) (PP + B*TG with -pps); S_PP = prompt tokens / T_PP; S_TG = B*TG /\n"
        "T_TG; S = N_KV / T. With --json-schema-file every sequence is constrained to the\n"
        "schema: one whose output is complete before TG tokens ends there, and S_TG counts\n"
        "the tokens generated. Example:\n"
        "  minfer batched-bench -m model.gguf -c 8192 -b 2048 -t 2 -ctk f16 -ctv f16 \\\n"
        "      -npp 128 -ntg 128 -npl 1,4,8,16");
    if (!p.parse(argc, argv, first)) return 0;
    if (output != "md" && output != "json") throw UsageError("-o must be md or json");
    seed = static_cast<uint64_t>(seed_arg);
    const std::vector<int64_t> npp = parse_list(npp_s, "-npp"), ntg = parse_list(ntg_s, "-ntg"),
                               npl = parse_list(npl_s, "-npl");
    const runtime::SessionOptions so = eng.session_options();
    if (eng.ctx_size < 1) throw UsageError("-c must be >= 1");

    model::Model model = eng.load_model(model_path, eng.batch_size);
    std::shared_ptr<const structured::Constraint> constraint;
    if (constraint_flags.given())
        constraint = constraint_flags.compile(tokenizer::Tokenizer::from_gguf(model.file));
    runtime::EngineOptions eo;
    eo.n_ctx = eng.ctx_size;
    eo.n_batch = eng.batch_size;
    eo.n_threads = so.n_threads;
    eo.kv_type_k = eo.kv_type_v = so.kv_type;
    eo.batch_invariant = so.batch_invariant;
    int64_t max_pl = 1;
    for (int64_t b : npl) max_pl = std::max(max_pl, b);
    eo.n_parallel = static_cast<int32_t>(max_pl);
    eo.prefill_first = true;  // the two phases of llama-batched-bench
    runtime::Engine engine(model, eo);
    if (constraint)
        std::fprintf(stderr, "minfer: --json-schema-file %s compiled in %.2f ms\n",
                     constraint_flags.json_schema_file.c_str(), constraint->compile_ms);

    if (n_prefix > 0) return shared_prefix_measure(engine, model, n_prefix, npp[0], max_pl, seed);

    FILE* table = output == "json" ? stderr : stdout;
    std::fprintf(table,
                 "\nmain: n_kv_max = %lld, n_batch = %lld, is_pp_shared = %d, n_threads = %d\n\n",
                 static_cast<long long>(eng.ctx_size), static_cast<long long>(eng.batch_size),
                 pps ? 1 : 0, engine.options().n_threads);
    std::fprintf(table,
                 "|%6s | %6s | %4s | %6s | %8s | %8s | %8s | %8s | %8s | %8s |\n"
                 "|%s|%s|%s|%s|%s|%s|%s|%s|%s|%s|\n",
                 "PP", "TG", "B", "N_KV", "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s",
                 "S t/s", "-------", "--------", "------", "--------", "----------", "----------",
                 "----------", "----------", "----------", "----------");
    std::fflush(table);

    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(model.hp.n_vocab - 1));
    using Clock = std::chrono::steady_clock;
    for (int64_t pp : npp)
        for (int64_t tg : ntg)
            for (int64_t pl : npl) {
                const int64_t n_kv = pps ? pp + pl * tg : pl * (pp + tg);
                // llama-batched-bench skips what does not fit; so do we, in
                // pages (a sequence's last page is partly empty; with -pps
                // only the prompt's full pages are shared).
                const int64_t P = engine.stats().page_cells;
                const int64_t per_seq = (pp + tg + P - 1) / P,
                              shared_pages = pps ? (pp - 1) / P : 0;
                const int64_t pages = shared_pages + pl * (per_seq - shared_pages);
                if (pages > engine.stats().pages_total) {
                    std::fprintf(stderr,
                                 "minfer: skipping PP %lld TG %lld B %lld: %lld KV pages needed, "
                                 "%lld in -c %lld\n",
                                 static_cast<long long>(pp), static_cast<long long>(tg),
                                 static_cast<long long>(pl), static_cast<long long>(pages),
                                 static_cast<long long>(engine.stats().pages_total),
                                 static_cast<long long>(eng.ctx_size));
                    continue;
                }
                std::vector<int32_t> shared(static_cast<size_t>(pp));
                for (auto& t : shared) t = tok(rng);
                int64_t first_tokens = 0, finished = 0, generated = 0, complete = 0;
                std::vector<float> mask_us, mask_first_us;
                const double mask_wait_before = engine.stats().mask_wait_ms;
                Clock::time_point t0 = Clock::now(), t_first{};
                bool failed = false;
                std::string error;
                for (int64_t s = 0; s < pl; ++s) {
                    runtime::GenParams gp;
                    gp.prompt = shared;
                    if (!pps)
                        for (auto& t : gp.prompt) t = tok(rng);
                    gp.n_predict = tg + 1;  // the first from the prompt, then TG decode steps
                    gp.ignore_eos = true;
                    gp.sampling.temp = 0.0f;
                    gp.constraint = constraint;
                    runtime::RequestCallbacks cb;
                    cb.on_token = [&](const runtime::TokenEvent&) {
                        if (++first_tokens == pl) t_first = Clock::now();
                        return true;
                    };
                    cb.on_finish = [&](const runtime::RequestResult& r) {
                        ++finished;
                        generated += r.generated;
                        if (!r.mask_us.empty()) {
                            // the first token's mask: before the decode phase
                            mask_us.insert(mask_us.end(), r.mask_us.begin() + 1, r.mask_us.end());
                            mask_first_us.push_back(r.mask_us.front());
                        }
                        // A constrained output complete before TG tokens.
                        if (constraint && r.reason == runtime::FinishReason::Stop) {
                            ++complete;
                            return;
                        }
                        if (r.reason != runtime::FinishReason::Length) {
                            failed = true;
                            error = runtime::finish_reason_name(r.reason);
                        }
                    };
                    engine.submit(std::move(gp), std::move(cb));
                }
                t0 = Clock::now();
                bool shown = false;
                while (finished < pl) {
                    engine.step();
                    if (mem_report && !shown && first_tokens == pl) {
                        const auto st = engine.stats();
                        std::fprintf(stderr,
                                     "\nB = %lld after the prompts: activations %.1f MiB\n%s",
                                     static_cast<long long>(pl),
                                     static_cast<double>(st.activation_bytes) / (1024.0 * 1024.0),
                                     engine.kv_page_map().c_str());
                        shown = true;
                    }
                }
                const Clock::time_point t1 = Clock::now();
                if (failed)
                    throw Error("batched-bench: a sequence finished early (" + error +
                                "); a larger -c is needed");
                Row r{pp,
                      tg,
                      pl,
                      n_kv,
                      std::chrono::duration<double>(t_first - t0).count(),
                      std::chrono::duration<double>(t1 - t_first).count()};
                const double pp_tokens = static_cast<double>(pps ? pp : pl * pp);
                const double s_pp = pp_tokens / r.t_pp;
                // Decode tokens: all but each sequence's first (the prompt's).
                const double s_tg = static_cast<double>(generated - pl) / r.t_tg;
                const double t = r.t_pp + r.t_tg;
                const double s = static_cast<double>(n_kv) / t;
                std::fprintf(table,
                             "|%6lld | %6lld | %4lld | %6lld | %8.3f | %8.2f | %8.3f | %8.2f | "
                             "%8.3f | %8.2f |\n",
                             static_cast<long long>(pp), static_cast<long long>(tg),
                             static_cast<long long>(pl), static_cast<long long>(n_kv), r.t_pp, s_pp,
                             r.t_tg, s_tg, t, s);
                if (constraint)
                    std::fprintf(
                        table,
                        "constraint: %lld of %lld outputs complete before TG (mean %.1f tokens a "
                        "sequence); mask per decode token %s; first tokens' masks %s; sampling "
                        "waited %.2f ms for masks\n",
                        static_cast<long long>(complete), static_cast<long long>(pl),
                        static_cast<double>(generated) / static_cast<double>(pl),
                        mask_time_summary(mask_us).c_str(),
                        mask_time_summary(mask_first_us).c_str(),
                        engine.stats().mask_wait_ms - mask_wait_before);
                std::fflush(table);
                if (output == "json") {
                    nlohmann::json j{{"n_kv_max", eng.ctx_size},
                                     {"n_batch", eng.batch_size},
                                     {"n_ubatch", eng.batch_size},
                                     {"flash_attn", 0},
                                     {"is_pp_shared", pps ? 1 : 0},
                                     {"n_gpu_layers", 0},
                                     {"n_threads", engine.options().n_threads},
                                     {"n_threads_batch", engine.options().n_threads},
                                     {"pp", pp},
                                     {"tg", tg},
                                     {"pl", pl},
                                     {"n_kv", n_kv},
                                     {"t_pp", r.t_pp},
                                     {"speed_pp", s_pp},
                                     {"t_tg", r.t_tg},
                                     {"speed_tg", s_tg},
                                     {"t", t},
                                     {"speed", s}};
                    std::printf("%s\n", j.dump().c_str());
                    std::fflush(stdout);
                }
            }
    const runtime::EngineStats st = engine.stats();
    std::fprintf(
        table,
        "\nengine: %lld steps, %lld graphs built, %lld preemptions, prefix hits %lld of "
        "%lld tokens (%lld copied), KV pages %lld x %lld cells, activations held %.1f MiB\n",
        static_cast<long long>(st.steps), static_cast<long long>(st.graphs_built),
        static_cast<long long>(st.preemptions), static_cast<long long>(st.prefix_hit_tokens),
        static_cast<long long>(st.prefix_lookup_tokens), static_cast<long long>(st.copied_cells),
        static_cast<long long>(st.pages_total), static_cast<long long>(st.page_cells),
        static_cast<double>(st.activation_bytes) / (1024.0 * 1024.0));
    return 0;
}

}  // namespace minfer::cli
