#include "backend/cpu/attn.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "backend/cpu/kernel_table.h"
#include "util/error.h"

namespace minfer::cpu {

size_t attn_rows_scratch_floats(int64_t rows, int64_t n_kv_max, int64_t hd) {
    // q^T, scores, key counts, K and V rows as floats (the AVX-512 kernel
    // gathers them all; the AVX2 one converts a block of 32 keys at a time)
    const int64_t lanes = (rows + 15) / 16 * 16,
                  n_kv_pad = (n_kv_max + kAttnMaxKeyStep - 1) / kAttnMaxKeyStep * kAttnMaxKeyStep;
    const int64_t k_blocks = (n_kv_max + graph::kKBlockCells - 1) / graph::kKBlockCells;
    return static_cast<size_t>(
        lanes * hd + n_kv_pad * lanes + lanes +
        (std::max<int64_t>(k_blocks, 1) * graph::kKBlockCells + std::max<int64_t>(n_kv_pad, 32)) *
            hd);
}

#if !defined(__x86_64__) || !defined(__GNUC__)

// x86-64 has its kernels in x86/attn_x86.cpp; ARM64's attention
// (arm/attn_neon.cpp) picks its level itself, so the table has none.
AttnRowsFn attn_rows_at(IsaLevel) {
    return nullptr;
}
StoreKCellsFn store_k_cells_at(IsaLevel) {
    return nullptr;
}

#endif

#if !(defined(__x86_64__) && defined(__GNUC__)) && !defined(__aarch64__)

bool attn_simd_supported(int64_t) {
    return false;
}

void attn_rows_simd(const AttnRows&, float*) {
    MINFER_ASSERT_MSG(false, "attn_rows_simd without AVX2");
}

#endif

}  // namespace minfer::cpu
