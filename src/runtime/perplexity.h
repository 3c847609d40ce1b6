// Perplexity as llama-perplexity computes it: the text in consecutive
// windows of n_ctx tokens, each run from an empty cache, scoring the second
// half of every window (the first half only gives context).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>

#include "runtime/session.h"

namespace minfer::runtime {

struct PerplexityResult {
    double ppl = 0;
    double uncertainty = 0;  // llama.cpp's "+/-": ppl * stddev(nll) / sqrt(n - 1)
    int64_t n_chunks = 0;
    int64_t n_scored = 0;  // tokens scored
};

// `on_chunk(i, n_chunks, running_ppl)` is called after every window.
// Throws minfer::Error when the text has fewer than 2 * n_ctx tokens (as
// llama-perplexity does) or n_ctx exceeds the session's context.
PerplexityResult perplexity(Session& session, std::span<const int32_t> tokens, int64_t n_ctx,
                            std::optional<int32_t> bos,
                            const std::function<void(int64_t, int64_t, double)>& on_chunk = {});

}  // namespace minfer::runtime
