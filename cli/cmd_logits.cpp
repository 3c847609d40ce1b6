// minfer logits: run a token list as a prompt and write its logits in the
// format of llama.cpp's reference dumps (../shared/ref/README.md), so that
// compare_logits.py can check parity.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "commands.h"
#include "common.h"
#include "model/model.h"
#include "report/observe.h"
#include "runtime/session.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

std::vector<int32_t> read_token_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error("cannot open token file '" + path + "'");
    nlohmann::json j;
    try {
        in >> j;
    } catch (const std::exception& e) {
        throw Error("token file '" + path + "' is not valid JSON: " + e.what());
    }
    const nlohmann::json* ids = j.is_array() ? &j : (j.contains("ids") ? &j["ids"] : nullptr);
    if (!ids || !ids->is_array())
        throw Error("token file '" + path + "' needs {\"ids\": [...]} or a JSON array");
    std::vector<int32_t> out;
    for (const auto& v : *ids) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
            throw Error("token file '" + path + "': every id must be a non-negative integer");
        out.push_back(v.get<int32_t>());
    }
    if (out.empty()) throw Error("token file '" + path + "' holds no ids");
    return out;
}

}  // namespace

int cmd_logits(int argc, char** argv, int first) {
    std::string model_path = default_model_path(), tokens_path, out_dir;
    EngineFlags eng;
    eng.ctx_size = 0;
    eng.batch_size = 0;
    ArgParser p("minfer logits",
                "Runs the ids of a token file as one prompt and writes logits_topk.jsonl (top 10\n"
                "logits and the log-sum-exp of every position) and logits_last8.f32 (all logits\n"
                "of the last 8 positions) into a folder, in the format of llama.cpp's dumps.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
    p.option({"--tokens"}, &tokens_path, "FILE", "token file: {\"ids\": [...]}");
    p.option({"--out"}, &out_dir, "DIR", "output folder (created)");
    eng.add_to(p);
    report::ObserveFlags observe;
    observe.add_to(p);
    p.epilog(
        "-c 0 sizes the context to the prompt; -b 0 runs the whole prompt in one pass.\n"
        "Example: minfer logits -m model.gguf --tokens tokens.json --out out -b 64");
    if (!p.parse(argc, argv, first)) return 0;
    if (tokens_path.empty()) throw UsageError("--tokens FILE is required");
    if (out_dir.empty()) throw UsageError("--out DIR is required");

    const std::vector<int32_t> ids = read_token_file(tokens_path);
    model::Model model = eng.load_model(model_path, eng.batch_size);
    const int64_t n = static_cast<int64_t>(ids.size());
    auto ctx = runtime::plan_context(eng.ctx_size > 0 ? eng.ctx_size : n, eng.ctx_size > 0,
                                     model.hp.n_ctx_train, n);
    if (!ctx.warning.empty()) warn(ctx.warning);
    if (eng.batch_size == 0) eng.batch_size = n;
    runtime::SessionOptions so = eng.session_options();
    so.n_ctx = ctx.n_ctx;
    runtime::Session session(model, so);
    observe.attach(session);
    const std::vector<float> logits = session.eval(ids, /*all_logits=*/true);
    observe.finish(session, {{"model", model_path}, {"tokens", tokens_path}});
    const int64_t n_vocab = model.hp.n_vocab;

    std::filesystem::create_directories(out_dir);
    std::ofstream topk(out_dir + "/logits_topk.jsonl");
    if (!topk) throw Error("cannot write '" + out_dir + "/logits_topk.jsonl'");
    std::vector<int32_t> order(static_cast<size_t>(n_vocab));
    for (int64_t i = 0; i < n; ++i) {
        const float* row = logits.data() + i * n_vocab;
        double mx = -INFINITY;
        for (int64_t v = 0; v < n_vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double sum = 0;
        for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - mx);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(
            order.begin(), order.begin() + std::min<int64_t>(10, n_vocab), order.end(),
            [row](int32_t a, int32_t b) { return row[a] > row[b] || (row[a] == row[b] && a < b); });
        nlohmann::json line;
        line["pos"] = i;
        line["lse"] = mx + std::log(sum);
        nlohmann::json top = nlohmann::json::array();
        for (int64_t k = 0; k < std::min<int64_t>(10, n_vocab); ++k)
            top.push_back({order[static_cast<size_t>(k)], row[order[static_cast<size_t>(k)]]});
        line["top"] = top;
        topk << line.dump() << "\n";
    }
    std::ofstream last(out_dir + "/logits_last8.f32", std::ios::binary);
    if (!last) throw Error("cannot write '" + out_dir + "/logits_last8.f32'");
    const int64_t first_row = std::max<int64_t>(0, n - 8);
    last.write(reinterpret_cast<const char*>(logits.data() + first_row * n_vocab),
               static_cast<std::streamsize>((n - first_row) * n_vocab * sizeof(float)));
    std::fprintf(stderr, "minfer: wrote logits of %lld positions to %s (%s)\n",
                 static_cast<long long>(n), out_dir.c_str(), cpu_kernels_note().c_str());
    return 0;
}

}  // namespace minfer::cli
