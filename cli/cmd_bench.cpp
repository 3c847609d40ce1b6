// minfer bench -m MODEL -p 512 -n 128 [-d D] -t N -r R: llama-bench's tests and
// table (or JSON with -o json) for one model. The table / JSON go to stdout.
#include <cinttypes>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "commands.h"
#include "common.h"
#include "gguf/file_type.h"
#include "model/model.h"
#include "report/observe.h"
#include "runtime/bench.h"
#include "util/error.h"
#include "util/thread_pool.h"

namespace minfer::cli {

namespace {

// "qwen2 0.6B Q8_0": llama.cpp's model description (arch, size, file type).
std::string describe(const model::Model& m, int64_t params) {
    char size[32];
    const double p = static_cast<double>(params);
    if (p >= 1e9) {
        std::snprintf(size, sizeof size, "%.1fB", p / 1e9);
    } else {
        std::snprintf(size, sizeof size, "%.0fM", p / 1e6);
    }
    std::string ft = "?";
    if (auto id = m.file.get_int("general.file_type"))
        if (auto s = gguf::file_type_short_name(static_cast<uint32_t>(*id))) ft = std::string(*s);
    return m.hp.arch_name + " " + size + " " + ft;
}

}  // namespace

int cmd_bench(int argc, char** argv, int first) {
    std::string model_path = default_model_path();
    int64_t n_prompt = 512, n_gen = 128, n_depth = 0;
    int reps = 5;
    std::string output = "md";
    bool roofline = false;
    report::ObserveFlags observe;
    EngineFlags eng;
    ArgParser p("minfer bench", "Prompt-processing and generation throughput, as llama-bench.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
    p.option({"-p", "--n-prompt"}, &n_prompt, "N", "prompt tokens of the ppN test (0: skip it)");
    p.option({"-n", "--n-gen"}, &n_gen, "N", "generated tokens of the tgN test (0: skip it)");
    p.option({"-d", "--n-depth"}, &n_depth, "N",
             "tokens already in the cache before each test (filled once, untimed)");
    p.option({"-r", "--repetitions"}, &reps, "N", "timed repetitions per test (after one warm-up)");
    p.option({"-o", "--output"}, &output, "FMT", "md (a markdown table) or json");
    p.flag({"--roofline"}, &roofline,
           "tgN: also read up to 1 GiB of the weights with the same threads before the first "
           "repetition and after each one, and give each repetition's GB/s as a share of the "
           "larger read rate around it");
    observe.add_to(p);
    eng.add_to(p, /*with_ctx=*/false);
    p.epilog(
        "The context is n_depth + n_prompt + n_gen; token ids are random; times exclude\n"
        "loading and the depth fill.\n"
        "Example: minfer bench -m model.gguf -p 512 -n 128 -d 4096 -t 2 -r 5 -o json");
    if (!p.parse(argc, argv, first)) return 0;
    if (output != "md" && output != "json") throw UsageError("-o must be md or json");
    if (reps < 1) throw UsageError("-r must be >= 1");
    if (n_prompt < 0 || n_gen < 0 || n_depth < 0) throw UsageError("-p, -n and -d must be >= 0");

    model::Model model = eng.load_model(model_path);
    std::fprintf(stderr, "minfer: %s\n", cpu_kernels_note().c_str());
    runtime::BenchParams bp;
    bp.n_prompt = n_prompt;
    bp.n_gen = n_gen;
    bp.n_depth = n_depth;
    bp.reps = reps;
    bp.roofline = roofline;
    bp.session = eng.session_options();
    if (bp.session.n_threads <= 0) bp.session.n_threads = ThreadPool::physical_cores();
    bp.on_start = [&](runtime::Session& s) { observe.attach(s); };
    bp.on_finish = [&](runtime::Session& s) { observe.finish(s, {{"model", model_path}}); };
    const std::vector<runtime::BenchResult> results = runtime::run_bench(model, bp);

    const int64_t params = runtime::model_params(model);
    const double size_mib = static_cast<double>(model.weight_bytes) / (1024.0 * 1024.0);
    const std::string desc = describe(model, params);
    const std::string kv = tensor::dtype_name(bp.session.kv_type).data();
    if (output == "json") {
        nlohmann::json arr = nlohmann::json::array();
        for (const auto& r : results) {
            arr.push_back({{"model_filename", model_path},
                           {"model_type", desc},
                           {"model_size", model.weight_bytes},
                           {"model_n_params", params},
                           {"backend", "CPU"},
                           {"n_threads", bp.session.n_threads},
                           {"type_k", kv},
                           {"n_prompt", r.n_prompt},
                           {"n_gen", r.n_gen},
                           {"n_depth", r.n_depth},
                           {"test", r.test},
                           {"avg_ts", r.avg_ts},
                           {"stddev_ts", r.stddev_ts},
                           {"samples_ts", r.samples_ts},
                           {"gbps", r.gbps},
                           {"gops", r.gops}});
            if (!r.read_gbps.empty()) {
                arr.back()["samples_gbps"] = r.samples_gbps;
                arr.back()["read_gbps"] = r.read_gbps;
            }
        }
        std::printf("%s\n", arr.dump(2).c_str());
        return 0;
    }
    std::printf("| %-30s | %10s | %10s | %-10s | %7s | %15s | %20s | %8s |\n", "model", "size",
                "params", "backend", "threads", "test", "t/s", "GB/s|GOP/s");
    std::printf("| %s | %s: | %s: | %s | %s: | %s: | %s: | %s: |\n", std::string(30, '-').c_str(),
                std::string(9, '-').c_str(), std::string(9, '-').c_str(),
                std::string(10, '-').c_str(), std::string(6, '-').c_str(),
                std::string(14, '-').c_str(), std::string(19, '-').c_str(),
                std::string(7, '-').c_str());
    for (const auto& r : results) {
        char size[32], prm[32], ts[64], rate[32];
        std::snprintf(size, sizeof size, "%.2f MiB", size_mib);
        std::snprintf(prm, sizeof prm, "%.2f M", static_cast<double>(params) / 1e6);
        std::snprintf(ts, sizeof ts, "%.2f ± %.2f", r.avg_ts, r.stddev_ts);
        std::snprintf(rate, sizeof rate, "%.1f", r.n_gen > 0 ? r.gbps : r.gops);
        // "±" is two bytes in UTF-8: widen the field by one so columns line up.
        std::printf("| %-30s | %10s | %10s | %-10s | %7d | %15s | %21s | %8s |\n", desc.c_str(),
                    size, prm, "CPU", bp.session.n_threads, r.test.c_str(), ts, rate);
    }
    for (const auto& r : results) {
        if (r.read_gbps.empty()) continue;
        std::printf("\n%s, weights read per repetition (decode GB/s / streaming read GB/s):\n",
                    r.test.c_str());
        for (size_t i = 0; i < r.read_gbps.size(); ++i)
            std::printf("  %zu: %.1f / %.1f = %.0f %%\n", i + 1, r.samples_gbps[i], r.read_gbps[i],
                        100.0 * r.samples_gbps[i] / r.read_gbps[i]);
    }
    return 0;
}

}  // namespace minfer::cli
