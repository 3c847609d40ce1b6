// minfer viz: one self-contained HTML page (works offline from file://) that
// shows what the allocator did for every graph a short run built — the graph
// in build order, the buffer timeline, the arena layout, the memory curve
// against the lower bound and the pool, and per-node value statistics.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "graph/kv_pages.h"
#include "model/model.h"
#include "report/observe.h"
#include "report/viz.h"
#include "runtime/engine.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

nlohmann::json read_json_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw Error("cannot open trace file '" + path + "'");
    try {
        return nlohmann::json::parse(in);
    } catch (const std::exception& e) {
        throw Error("trace file '" + path + "' is not valid JSON: " + e.what());
    }
}

// The engine's KV pages while `n` requests of the same prompt run: taken
// once every request has its first token (its prompt is in the cache and
// the shared prefix pages are held by all), then the requests are cancelled.
nlohmann::json engine_kv_pages(const model::Model& model, const runtime::SessionOptions& so,
                               const std::vector<int32_t>& ids, int64_t n_decode, int64_t n) {
    runtime::EngineOptions eo;
    const int64_t per_seq = static_cast<int64_t>(ids.size()) + std::max<int64_t>(n_decode, 1);
    const int64_t P = graph::kKvPageCells;
    // Room for every sequence's pages plus one spare page each.
    eo.n_ctx = n * ((per_seq + P - 1) / P + 1) * P;
    eo.n_batch = 512;
    eo.n_parallel = static_cast<int32_t>(n);
    eo.n_threads = so.n_threads;
    eo.kv_type_k = eo.kv_type_v = so.kv_type;
    runtime::Engine engine(model, eo);
    std::vector<runtime::RequestId> reqs;
    int64_t first_tokens = 0;
    for (int64_t i = 0; i < n; ++i) {
        runtime::GenParams gp;
        gp.prompt = ids;
        gp.n_predict = std::max<int64_t>(n_decode, 1) + 1;  // still running at the snapshot
        gp.ignore_eos = true;
        runtime::RequestCallbacks cb;
        cb.on_token = [&first_tokens, seen = false](const runtime::TokenEvent&) mutable {
            if (!seen) ++first_tokens;
            seen = true;
            return true;
        };
        reqs.push_back(engine.submit(gp, cb));
    }
    while (first_tokens < n && engine.step()) {
    }
    nlohmann::json snap = report::kv_pages_json(
        engine.kv_pages(), P,
        "engine (" + std::to_string(n) + " requests of the prompt, after their first token)");
    for (auto id : reqs) engine.cancel(id);
    while (engine.step()) {
    }
    return snap;
}

}  // namespace

int cmd_viz(int argc, char** argv, int first) {
    std::string model_path = default_model_path(), prompt = "And God said", prompt_file, out_path,
                trace_path, save_trace;
    int64_t n_decode = 4, n_parallel = 0;
    bool no_values = false;
    EngineFlags eng;
    eng.ctx_size = 0;
    ArgParser p(
        "minfer viz",
        "Runs a prompt and a few greedy decode steps, then writes ONE self-contained HTML\n"
        "page (no network; open it from file://) showing every graph built: the nodes in\n"
        "build order, the buffer timeline, the arena layout, the memory curve with the\n"
        "lower bound and the pool, and each node's value statistics. With --trace it draws\n"
        "a trace written earlier by MINFER_TRACE=FILE instead of running a model.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
    p.option({"-p", "--prompt"}, &prompt, "TEXT", "prompt");
    p.option({"-f", "--file"}, &prompt_file, "FILE", "read the prompt from a file");
    p.option({"-n", "--n-decode"}, &n_decode, "N",
             "greedy decode steps after the prompt (0 = prefill only)");
    p.option({"-o", "--output"}, &out_path, "FILE", "the HTML page to write (required)");
    p.option({"--trace"}, &trace_path, "FILE",
             "draw this MINFER_TRACE file instead of running a model");
    p.option({"--save-trace"}, &save_trace, "FILE",
             "also write the run's trace document (JSON) to FILE");
    p.option({"--parallel"}, &n_parallel, "N",
             "also run the prompt as N requests at once through the engine and show its\n"
             "KV pages mid-run (full 32-token pages of the prompt are shared)");
    p.flag({"--no-values"}, &no_values,
           "skip the per-node value statistics (no sync after every node)");
    eng.add_to(p);
    p.epilog(
        "-c 0 sizes the context to the prompt plus the decode steps.\n"
        "Examples:\n"
        "  minfer viz -m model.gguf -p \"Hello\" -o page.html\n"
        "  MINFER_TRACE=t.json minfer -p \"And God said\" -n 4 && minfer viz --trace t.json -o "
        "page.html");
    if (!p.parse(argc, argv, first)) return 0;
    if (out_path.empty()) throw UsageError("-o FILE is required");
    if (n_decode < 0) throw UsageError("-n must be >= 0");
    if (n_parallel < 0 || n_parallel > 64) throw UsageError("--parallel must be 0..64");
    if (n_parallel > 0 && !trace_path.empty())
        throw UsageError("--parallel runs a model; it cannot go with --trace");

    nlohmann::json doc;
    if (!trace_path.empty()) {
        doc = read_json_file(trace_path);
    } else {
        if (!prompt_file.empty()) {
            std::ifstream in(prompt_file, std::ios::binary);
            if (!in) throw Error("cannot read prompt file '" + prompt_file + "'");
            std::ostringstream os;
            os << in.rdbuf();
            prompt = os.str();
        }
        model::Model model = eng.load_model(model_path);
        tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(model.file);
        const std::vector<int32_t> ids = tok.encode(prompt, true);
        if (ids.empty()) throw Error("the prompt tokenizes to no tokens");
        const int64_t n = static_cast<int64_t>(ids.size());
        auto ctx = runtime::plan_context(eng.ctx_size > 0 ? eng.ctx_size : n + n_decode,
                                         eng.ctx_size > 0, model.hp.n_ctx_train, n, n_decode);
        if (!ctx.warning.empty()) warn(ctx.warning);
        runtime::SessionOptions so = eng.session_options();
        so.n_ctx = ctx.n_ctx;
        runtime::Session session(model, so);
        report::MemoryRecorder mem(session);
        report::GraphRecorder graphs(session, !no_values);
        std::vector<float> logits = session.eval(ids);
        std::vector<int32_t> generated;
        for (int64_t i = 0; i < n_decode && session.n_past() < session.n_ctx(); ++i) {
            const int32_t next = static_cast<int32_t>(
                std::max_element(logits.begin(), logits.end()) - logits.begin());
            generated.push_back(next);
            logits = session.eval(std::span<const int32_t>(&next, 1));
        }
        nlohmann::json meta = {{"model", model_path},
                               {"prompt", prompt},
                               {"n_prompt_tokens", n},
                               {"generated", tok.decode(generated)}};
        const report::MemoryReport mr = mem.report();
        doc = report::trace_document(graphs.records(), mr, meta);
        doc["kv_pages"] = nlohmann::json::array();
        if (mr.run.kv_pages > 0)
            doc["kv_pages"].push_back(report::kv_pages_json(
                report::session_kv_pages(mr.run.kv_pages, mr.run.kv_pages_held),
                mr.run.kv_page_cells, "session (one sequence)"));
        if (n_parallel > 0)
            doc["kv_pages"].push_back(engine_kv_pages(model, so, ids, n_decode, n_parallel));
        if (!save_trace.empty()) report::write_text_file(save_trace, doc.dump() + "\n");
    }
    const std::string page = report::render_viz_page(doc);
    report::write_text_file(out_path, page);
    std::fprintf(stderr, "minfer: wrote %s (%zu graphs, %.1f KiB)\n", out_path.c_str(),
                 doc["graphs"].size(), static_cast<double>(page.size()) / 1024);
    return 0;
}

}  // namespace minfer::cli
