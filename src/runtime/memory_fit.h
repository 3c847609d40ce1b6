// Whether a model fits in memory before it is loaded: the weights (one
// copy: regrouping moves them out of the mapped file piece by piece), the KV
// cache and a pass's activations, against what the machine has available.
// A file that cannot fit is refused with both figures instead of being
// killed by the kernel half-way through the load.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "model/model.h"
#include "tensor/dtype.h"

namespace minfer::runtime {

struct MemoryNeed {
    size_t weights = 0;      // every tensor of the file
    size_t kv = 0;           // K and V regions of every layer for n_ctx tokens
    size_t activations = 0;  // an upper estimate for one pass of n_batch tokens
    size_t total() const { return weights + kv + activations; }
};

// n_ctx: KV rows (summed over sequences); n_batch: tokens per pass;
// logit_rows: rows of logits a pass computes (at most n_batch are counted).
MemoryNeed estimate_memory(const model::HParams& hp, size_t weight_bytes, int64_t n_ctx,
                           int64_t n_batch, int64_t logit_rows, tensor::DType kv_type);

struct AvailableMemory {
    size_t bytes = 0;
    const char* source = "";  // "MemAvailable" or "MINFER_MEM_AVAILABLE"
};

// Bytes the kernel can give without swapping: MemAvailable of /proc/meminfo,
// or MINFER_MEM_AVAILABLE (bytes, or with a K/M/G suffix) when set, so tests
// can pretend a smaller machine. nullopt when neither can be read; throws
// minfer::Error for a variable that is not a size.
std::optional<AvailableMemory> available_memory();

// Throws minfer::Error naming the file, what it needs (weights, KV cache,
// activations) and what is available, when need.total() > available.bytes.
void check_fits(const MemoryNeed& need, const AvailableMemory& available, const std::string& path);

}  // namespace minfer::runtime
