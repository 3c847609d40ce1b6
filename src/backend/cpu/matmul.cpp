#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "util/error.h"

namespace minfer::cpu {

using tensor::DType;

namespace {
constexpr int kMaxParts = 3;
// A tile is kRowBlock weight rows x up to kTokenBlock tokens: the weight rows
// stay in L1 while every token of the tile reads them, the tile's activation
// rows (a few KB each) in L2. Tiles are handed out by an atomic counter so a
// thread slowed by another process does not hold the others back.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kTokenBlock = 32;
constexpr int64_t kRangesPerThread = 1;  // row ranges per thread in the dot-product path (1
                                         // measured best: 2, 4, 8 were 3-15% slower in decode)
// Below this many activation elements the caller quantizes alone (a decode
// row of a few thousand floats takes well under a microsecond).
constexpr int64_t kParallelQuantizeMin = 1 << 15;
// From this many tokens on, weight types with a GEMM kernel take it: the
// unpacking of a weight tile costs about as much as a few tokens' dots.
constexpr int64_t kGemmMinTokens = 4;
}  // namespace

void matmul(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
            int64_t n_tokens, float* out, int64_t out_stride, ThreadPool& pool) {
    MINFER_ASSERT(n_parts >= 1 && n_parts <= kMaxParts);
    const int64_t K = parts[0].w->ne[0];
    struct PartInfo {
        const tensor::TensorView* w;
        int64_t row_begin;  // in the concatenated rows
        int64_t out_col;
        VecDotFn dot;
        int act;              // index into act_types
        const uint8_t* data;  // row 0 (hoisted: TensorView::row looks the type up)
        size_t row_bytes;
    };
    PartInfo info[kMaxParts];
    DType act_types[kMaxParts];
    size_t act_row_bytes[kMaxParts];
    size_t act_offset[kMaxParts];
    int n_act = 0;
    int64_t M = 0;
    size_t act_bytes = 0;
    for (int p = 0; p < n_parts; ++p) {
        const tensor::TensorView* w = parts[p].w;
        MINFER_ASSERT(w != nullptr && w->ne[0] == K);
        const DType at = act_type(w->type);
        int a = 0;
        while (a < n_act && act_types[a] != at) ++a;
        if (a == n_act) {
            act_types[a] = at;
            act_row_bytes[a] = tensor::row_size(at, K);
            act_offset[a] = act_bytes;
            act_bytes += (act_row_bytes[a] * static_cast<size_t>(n_tokens) + 63) / 64 * 64;
            ++n_act;
        }
        info[p] = {w,
                   M,
                   parts[p].out_col,
                   vec_dot_fn(w->type),
                   a,
                   static_cast<const uint8_t*>(w->data),
                   w->row_bytes()};
        MINFER_ASSERT_MSG(info[p].dot != nullptr, "matmul: weight type has no dot product");
        M += w->ne[1];
    }

    // The GEMM path when every part has one (fused QKV parts share a type).
    // It keeps only the GEMM form of the activations: each token's blocks
    // go through a per-thread row (less scratch: the pool keeps its peak).
    bool gemm = n_tokens >= kGemmMinTokens;
    for (int p = 0; p < n_parts && gemm; ++p) gemm = gemm_supported(info[p].w->type, K);
    size_t gemm_row[kMaxParts] = {}, gemm_offset[kMaxParts] = {};
    if (gemm) {
        act_bytes = 0;
        for (int a = 0; a < n_act; ++a) {
            gemm_row[a] = gemm_act_row_bytes(act_types[a], K);
            gemm_offset[a] = act_bytes;
            act_bytes += (gemm_row[a] * static_cast<size_t>(n_tokens) + 63) / 64 * 64;
        }
    }

    // 1. Activations, once, in every format the weights need.
    auto* act = static_cast<uint8_t*>(pool.scratch(pool.size(), act_bytes));
    auto quantize_tokens = [&](int ith, int64_t t0, int64_t t1) {
        for (int a = 0; a < n_act; ++a)
            for (int64_t t = t0; t < t1; ++t) {
                if (gemm) {
                    void* row = pool.scratch(ith, act_row_bytes[a]);
                    quantize_act_row(act_types[a], x + t * x_stride, row, K);
                    gemm_pack_act(act_types[a], row, K,
                                  act + gemm_offset[a] + static_cast<size_t>(t) * gemm_row[a]);
                } else {
                    quantize_act_row(
                        act_types[a], x + t * x_stride,
                        act + act_offset[a] + static_cast<size_t>(t) * act_row_bytes[a], K);
                }
            }
    };
    if (pool.size() == 1 || n_tokens * K < kParallelQuantizeMin || n_tokens < 2) {
        quantize_tokens(0, 0, n_tokens);
    } else {
        const int64_t per =
            std::max<int64_t>(1, (n_tokens + 4 * pool.size() - 1) / (4 * pool.size()));
        pool.run_chunks((n_tokens + per - 1) / per, [&](int ith, int64_t c) {
            quantize_tokens(ith, c * per, std::min(n_tokens, c * per + per));
        });
    }

    if (gemm) {
        // 2'. Row tiles x all tokens: each tile is unpacked once.
        const int64_t tile_rows = gemm_tile_rows();
        const int64_t n_rt = (M + tile_rows - 1) / tile_rows;
        auto gemm_work = [&](int ith, int64_t tile) {
            void* scratch = pool.scratch(ith, gemm_scratch_bytes(K));
            {
                const int64_t r0 = tile * tile_rows, r1 = std::min(M, r0 + tile_rows);
                // Split the tile at part boundaries.
                for (int p = 0; p < n_parts; ++p) {
                    const PartInfo& pi = info[p];
                    const int64_t b0 = std::max(r0, pi.row_begin);
                    const int64_t b1 = std::min(r1, pi.row_begin + pi.w->ne[1]);
                    if (b0 >= b1) continue;
                    gemm_rows(pi.w->type, pi.data, pi.row_bytes, K, b0 - pi.row_begin,
                              b1 - pi.row_begin, act + gemm_offset[pi.act], gemm_row[pi.act],
                              n_tokens, out + pi.out_col + (b0 - pi.row_begin), out_stride,
                              scratch);
                }
            }
        };
        pool.run_chunks(n_rt, gemm_work);
        return;
    }

    // 2. Dot products over tiles.
    const int64_t tb = std::min<int64_t>(n_tokens, kTokenBlock);
    const int64_t n_tb = (n_tokens + tb - 1) / tb;
    // Few, long row ranges: each thread then streams one contiguous stretch
    // of weight memory, which the hardware prefetchers follow far better
    // than many 16-row tiles handed out alternately.
    const int64_t rows_per = std::max<int64_t>(
        kRowBlock, (M / (kRangesPerThread * pool.size()) + kRowBlock - 1) / kRowBlock * kRowBlock);
    const int64_t n_rb = (M + rows_per - 1) / rows_per;
    const int64_t n_tiles = n_rb * n_tb;
    auto work = [&](int, int64_t tile) {
        {
            const int64_t r0 = (tile / n_tb) * rows_per, r1 = std::min(M, r0 + rows_per);
            const int64_t t0 = (tile % n_tb) * tb, t1 = std::min(n_tokens, t0 + tb);
            int p = 0;
            for (int64_t r = r0; r < r1; ++r) {
                while (p + 1 < n_parts && r >= info[p + 1].row_begin) ++p;
                const PartInfo& pi = info[p];
                const int64_t m = r - pi.row_begin;
                const uint8_t* wrow = pi.data + static_cast<size_t>(m) * pi.row_bytes;
                const uint8_t* arow = act + act_offset[pi.act];
                const size_t abytes = act_row_bytes[pi.act];
                float* o = out + pi.out_col + m;
                for (int64_t t = t0; t < t1; ++t)
                    o[t * out_stride] = pi.dot(K, wrow, arow + static_cast<size_t>(t) * abytes);
            }
        }
    };
    pool.run_chunks(n_tiles, work);
}

}  // namespace minfer::cpu
