// minfer perplexity: llama-perplexity's measure, windows of -c tokens, the
// second half of each scored; a progress bar on stderr.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "commands.h"
#include "common.h"
#include "model/model.h"
#include "runtime/perplexity.h"
#include "runtime/session.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace minfer::cli {

int cmd_perplexity(int argc, char** argv, int first) {
    std::string model_path = default_model_path(), text_path;
    EngineFlags eng;
    eng.ctx_size = 512;
    eng.batch_size = 2048;
    ArgParser p("minfer perplexity",
                "Perplexity of the model over a text file, computed as llama-perplexity does:\n"
                "consecutive windows of -c tokens, each from an empty cache, the second half of\n"
                "every window scored. Prints running values and a final estimate.");
    p.option({"-m", "--model"}, &model_path, "FILE", "GGUF model");
    p.option({"-f", "--file"}, &text_path, "FILE", "text to score");
    eng.add_to(p);
    p.epilog("Example: minfer perplexity -m model.gguf -f heldout.txt -c 256");
    if (!p.parse(argc, argv, first)) return 0;
    if (text_path.empty()) throw UsageError("-f FILE is required");
    std::ifstream in(text_path, std::ios::binary);
    if (!in) throw Error("cannot read '" + text_path + "'");
    std::ostringstream os;
    os << in.rdbuf();

    model::Model model = eng.load_model(model_path, eng.batch_size);
    tokenizer::Tokenizer tok = tokenizer::Tokenizer::from_gguf(model.file);
    const std::vector<int32_t> ids = tok.encode(os.str(), /*parse_special=*/false);
    const int64_t n_ctx = eng.ctx_size;
    if (n_ctx > model.hp.n_ctx_train)
        throw Error("-c " + std::to_string(n_ctx) + " exceeds the model's trained context length " +
                    std::to_string(model.hp.n_ctx_train));
    runtime::SessionOptions so = eng.session_options();
    so.n_ctx = n_ctx;
    so.n_batch = std::min(eng.batch_size, n_ctx);
    runtime::Session session(model, so);
    std::fprintf(stderr, "minfer: %zu tokens, %lld windows of %lld tokens, %s\n", ids.size(),
                 static_cast<long long>(static_cast<int64_t>(ids.size()) / n_ctx),
                 static_cast<long long>(n_ctx), cpu_kernels_note().c_str());
    const auto t0 = std::chrono::steady_clock::now();
    std::optional<int32_t> bos;
    if (tok.add_bos() && tok.bos() >= 0) bos = tok.bos();
    auto r = runtime::perplexity(session, ids, n_ctx, bos, [&](int64_t i, int64_t n, double ppl) {
        std::printf("[%lld]%.4f,", static_cast<long long>(i + 1), ppl);
        std::fflush(stdout);
        const int width = 30;
        const int filled = static_cast<int>(width * (i + 1) / n);
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::fprintf(stderr, "\r[%s%s] %lld/%lld windows, %.1f s, ETA %.1f s ",
                     std::string(static_cast<size_t>(filled), '#').c_str(),
                     std::string(static_cast<size_t>(width - filled), '.').c_str(),
                     static_cast<long long>(i + 1), static_cast<long long>(n), s,
                     s / static_cast<double>(i + 1) * static_cast<double>(n - i - 1));
    });
    std::fprintf(stderr, "\n");
    std::printf("\nFinal estimate: PPL = %.4f +/- %.5f\n", r.ppl, r.uncertainty);
    return 0;
}

}  // namespace minfer::cli
