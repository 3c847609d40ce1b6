#include "runtime/memory_fit.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "util/error.h"
#include "util/out_of_memory.h"

namespace minfer::runtime {

MemoryNeed estimate_memory(const model::HParams& hp, size_t weight_bytes, int64_t n_ctx,
                           int64_t n_batch, int64_t logit_rows, tensor::DType kv_type) {
    MemoryNeed need;
    need.weights = weight_bytes;
    need.kv = static_cast<size_t>(hp.n_layer) * 2 *
              static_cast<size_t>(std::max<int64_t>(n_ctx, 0)) *
              tensor::row_size(kv_type, hp.n_embd_kv());
    // Floats per token of one layer's pass with no buffer reused (the
    // planner does better): the residual and its norm, Q/K/V, the attention
    // output and its projection, then the feed-forward block's tensors.
    const int64_t k = hp.n_expert_used;
    int64_t ffn = 3 * hp.n_ff;
    if (hp.moe())
        ffn = 3 * hp.n_expert + 5 * k + k * hp.n_embd + 3 * k * hp.n_ff_exp + k * hp.n_embd +
              3 * hp.n_ff_shexp + hp.n_embd;
    const int64_t per_token =
        4 * hp.n_embd + 2 * hp.n_embd_q() + 2 * hp.n_embd_kv() + std::max<int64_t>(ffn, 0);
    const int64_t tokens = std::max<int64_t>(n_batch, 1);
    const int64_t rows = std::clamp<int64_t>(logit_rows, 1, tokens);
    need.activations = 4 * static_cast<size_t>(tokens * per_token + rows * hp.n_vocab);
    return need;
}

namespace {
// "123", "512M", "8G" (binary units); nullopt for anything else.
std::optional<size_t> parse_size(const char* s) {
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(s, &end, 10);
    if (end == s || errno != 0) return std::nullopt;
    size_t shift = 0;
    if (*end == 'K' || *end == 'k')
        shift = 10, ++end;
    else if (*end == 'M' || *end == 'm')
        shift = 20, ++end;
    else if (*end == 'G' || *end == 'g')
        shift = 30, ++end;
    if (*end != '\0') return std::nullopt;
    return static_cast<size_t>(v) << shift;
}
}  // namespace

std::optional<AvailableMemory> available_memory() {
    if (const char* e = std::getenv("MINFER_MEM_AVAILABLE")) {
        const auto v = parse_size(e);
        if (!v)
            throw Error("MINFER_MEM_AVAILABLE='" + std::string(e) +
                        "' is not a size (bytes, or a number with K, M or G)");
        return AvailableMemory{*v, "MINFER_MEM_AVAILABLE"};
    }
    std::ifstream in("/proc/meminfo");
    std::string line;
    while (std::getline(in, line)) {
        if (line.rfind("MemAvailable:", 0) != 0) continue;
        std::istringstream is(line.substr(13));
        size_t kib = 0;
        if (is >> kib) return AvailableMemory{kib * 1024, "MemAvailable"};
    }
    return std::nullopt;
}

void check_fits(const MemoryNeed& need, const AvailableMemory& available, const std::string& path) {
    if (need.total() <= available.bytes) return;
    const auto mib = OutOfMemory::mib;
    throw Error("'" + path + "' does not fit in memory: it needs " + mib(need.total()) + " (" +
                mib(need.weights) + " of weights, " + mib(need.kv) + " of KV cache, " +
                mib(need.activations) + " of activations) and " + mib(available.bytes) +
                " is available (" + available.source +
                "); a smaller context (-c), batch (-b) or a smaller "
                "quantization of the model would need less");
}

}  // namespace minfer::runtime
