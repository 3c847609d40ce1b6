#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "util/error.h"

namespace minfer::runtime {

PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int64_t n_ctx,
                            std::optional<int32_t> bos,
                            const std::function<void(int64_t, int64_t, double)>& on_chunk) {
    const int64_t n_tokens = static_cast<int64_t>(tokens.size());
    if (n_ctx < 4) throw Error("perplexity needs a context of at least 4 tokens");
    if (n_ctx > session.n_ctx())
        throw Error("perplexity window " + std::to_string(n_ctx) +
                    " exceeds the session's context " + std::to_string(session.n_ctx()));
    if (n_tokens < 2 * n_ctx)
        throw Error("the text has " + std::to_string(n_tokens) + " tokens; perplexity with -c " +
                    std::to_string(n_ctx) + " needs at least " + std::to_string(2 * n_ctx));
    PerplexityResult r;
    r.n_chunks = n_tokens / n_ctx;
    const int64_t first = n_ctx / 2;
    const int64_t n_vocab = session.n_vocab();
    double nll = 0, nll2 = 0;
    std::vector<int32_t> window(static_cast<size_t>(n_ctx));
    for (int64_t c = 0; c < r.n_chunks; ++c) {
        const int64_t start = c * n_ctx;
        std::copy(tokens.begin() + start, tokens.begin() + start + n_ctx, window.begin());
        if (bos) window[0] = *bos;  // llama-perplexity replaces the first token by BOS
        session.truncate(0);
        const std::vector<float> logits = session.eval(window, /*all_logits=*/true);
        for (int64_t j = first; j < n_ctx - 1; ++j) {
            const float* row = logits.data() + j * n_vocab;
            float mx = row[0];
            for (int64_t v = 1; v < n_vocab; ++v) mx = std::max(mx, row[v]);
            double sum = 0;
            for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v] - mx));
            const int32_t next = tokens[static_cast<size_t>(start + j + 1)];
            const double logp = static_cast<double>(row[next] - mx) - std::log(sum);
            nll -= logp;
            nll2 += logp * logp;
            ++r.n_scored;
        }
        if (on_chunk) on_chunk(c, r.n_chunks, std::exp(nll / static_cast<double>(r.n_scored)));
    }
    const double mean = nll / static_cast<double>(r.n_scored);
    r.ppl = std::exp(mean);
    double var = nll2 / static_cast<double>(r.n_scored) - mean * mean;
    r.uncertainty = var > 0 ? std::sqrt(var / static_cast<double>(r.n_scored - 1)) * r.ppl : 0;
    return r;
}

}  // namespace minfer::runtime
