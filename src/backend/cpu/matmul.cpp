#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "tensor/interleave.h"
#include "util/error.h"

namespace minfer::cpu {

using tensor::DType;

namespace {
constexpr int kMaxParts = 3;
// Dot-product path: a thread takes kOwnClaim rows at a time from the front
// of its own stretch and kRowBlock rows from the back of another's.
constexpr int64_t kRowBlock = 16;
constexpr int64_t kOwnClaim = 64;
constexpr int kMaxThreads = 256;  // stretches kept on the stack
// Below this many activation elements the caller quantizes alone (a decode
// row of a few thousand floats takes well under a microsecond).
constexpr int64_t kParallelQuantizeMin = 1 << 15;
// From this many tokens on, weight types with a GEMM kernel take it: the
// unpacking of a weight tile costs about as much as a few tokens' dots.
constexpr int64_t kGemmMinTokens = 4;
}  // namespace

bool matmul_batch_invariant(const tensor::TensorView& w) {
    return !gemm_supported(w.type, w.ne[0]) ||
           (w.layout == tensor::TensorView::Layout::Rows16 && group_dot_fn(w.type) != nullptr);
}

bool matmul_takes_gemm(const tensor::TensorView& w, int64_t n_tokens, bool batch_invariant) {
    return (n_tokens >= kGemmMinTokens || batch_invariant) && gemm_supported(w.type, w.ne[0]);
}

void matmul(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
            int64_t n_tokens, float* out, int64_t out_stride, ThreadPool& pool,
            bool batch_invariant) {
    MINFER_ASSERT(n_parts >= 1 && n_parts <= kMaxParts);
    const int64_t K = parts[0].w->ne[0];
    struct PartInfo {
        const tensor::TensorView* w;
        int64_t row_begin;  // in the concatenated rows
        int64_t out_col;
        VecDotFn dot;
        bool interleaved;               // tensor/interleave.h layout
        GroupDotFn group_dot;           // for interleaved weights, or nullptr
        GroupDotManyFn group_dot_many;  // for interleaved weights, or nullptr
        int act;                        // index into act_types
        const uint8_t* data;            // row 0 (hoisted: TensorView::row looks the type up)
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
        const bool rows16 = w->layout == tensor::TensorView::Layout::Rows16;
        info[p] = {w,
                   M,
                   parts[p].out_col,
                   vec_dot_fn(w->type),
                   rows16,
                   group_dot_fn(w->type),
                   rows16 ? group_dot_many_fn(w->type) : nullptr,
                   a,
                   static_cast<const uint8_t*>(w->data),
                   w->row_bytes()};
        MINFER_ASSERT_MSG(info[p].dot != nullptr, "matmul: weight type has no dot product");
        M += w->ne[1];
    }

    // The GEMM path when every part has one (fused QKV parts share a type).
    // It keeps only the GEMM form of the activations: each token's blocks
    // go through a per-thread row (less scratch: the pool keeps its peak).
    bool gemm = true;
    for (int p = 0; p < n_parts && gemm; ++p)
        gemm = matmul_takes_gemm(*info[p].w, n_tokens, batch_invariant);
    // A few tokens on regrouped weights that have a many-token group kernel
    // take the dot path instead (kGroupDotManyMaxTokens).
    bool many = n_tokens > 1 && n_tokens <= kGroupDotManyMaxTokens;
    for (int p = 0; p < n_parts && many; ++p) many = info[p].group_dot_many != nullptr;
    if (many) gemm = false;
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
                    gemm_quantize_act(act_types[a], x + t * x_stride, K,
                                      act + gemm_offset[a] + static_cast<size_t>(t) * gemm_row[a],
                                      pool.scratch(ith, act_row_bytes[a]));
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
                    gemm_rows(pi.w->type, pi.interleaved, pi.data, pi.row_bytes, K,
                              b0 - pi.row_begin, b1 - pi.row_begin, act + gemm_offset[pi.act],
                              gemm_row[pi.act], n_tokens, out + pi.out_col + (b0 - pi.row_begin),
                              out_stride, scratch);
                }
            }
        };
        pool.run_chunks(n_rt, gemm_work);
        return;
    }

    // 2. Dot products. Each thread owns one contiguous stretch of rows,
    // of equal weight bytes (parts may differ in type: fused QKV in the
    // K-quant files mixes Q4_K and Q6_K), and streams it from the front:
    // the hardware prefetchers follow one stretch far better than many
    // tiles handed out alternately. A thread done with its stretch takes
    // blocks from the back of the others', so a thread slowed by another
    // process (or a slower part) does not hold the rest back.
    const int n_ranges = pool.size();
    MINFER_ASSERT(n_ranges <= kMaxThreads);
    struct alignas(64) Range {
        std::atomic<uint64_t> span;  // front row << 32 | back row: rows [front, back) are left
    };
    Range ranges[kMaxThreads];
    {
        size_t total = 0;
        for (int p = 0; p < n_parts; ++p)
            total += info[p].row_bytes * static_cast<size_t>(info[p].w->ne[1]);
        int64_t row = 0;
        size_t done = 0;
        int p = 0;
        for (int i = 0; i < n_ranges; ++i) {
            const int64_t begin = row;
            const size_t goal = total / static_cast<size_t>(n_ranges) * static_cast<size_t>(i + 1);
            while (row < M && (i == n_ranges - 1 || done < goal)) {
                while (p + 1 < n_parts && row >= info[p + 1].row_begin) ++p;
                done += info[p].row_bytes;
                ++row;
            }
            // whole blocks of rows (a block's outputs are a few cache lines)
            int64_t end =
                i == n_ranges - 1 ? M : std::min(M, (row + kRowBlock / 2) / kRowBlock * kRowBlock);
            end = std::max(end, begin);
            row = end;
            ranges[i].span.store(static_cast<uint64_t>(begin) << 32 | static_cast<uint64_t>(end),
                                 std::memory_order_relaxed);
        }
        MINFER_ASSERT(row == M);
    }
    auto dot_rows = [&](int ith, int64_t r0, int64_t r1) {
        int p = 0;
        for (int64_t r = r0; r < r1; ++r) {
            while (p + 1 < n_parts && r >= info[p + 1].row_begin) ++p;
            const PartInfo& pi = info[p];
            const int64_t m = r - pi.row_begin;
            const uint8_t* arow = act + act_offset[pi.act];
            const size_t abytes = act_row_bytes[pi.act];
            float* o = out + pi.out_col + m;
            if (pi.interleaved) {
                // The claim's rows of one group of 16 (all of it, normally).
                const int64_t l0 = m % tensor::kInterleaveRows;
                const int64_t n_here = std::min(tensor::kInterleaveRows - l0, r1 - r);
                const uint8_t* group = pi.data + static_cast<size_t>(m - l0) * pi.row_bytes;
                if (many && n_here == tensor::kInterleaveRows) {
                    pi.group_dot_many(K, group, arow, abytes, n_tokens, o, out_stride);
                    r += n_here - 1;
                    continue;
                }
                for (int64_t t = 0; t < n_tokens; ++t) {
                    const uint8_t* a = arow + static_cast<size_t>(t) * abytes;
                    float* ot = o + t * out_stride;
                    if (pi.group_dot && n_here == tensor::kInterleaveRows) {
                        pi.group_dot(K, group, a, ot);
                    } else if (pi.group_dot) {
                        float all[tensor::kInterleaveRows];
                        pi.group_dot(K, group, a, all);
                        std::copy(all + l0, all + l0 + n_here, ot);
                    } else {
                        auto* row = static_cast<uint8_t*>(pool.scratch(ith, pi.row_bytes));
                        for (int64_t j = 0; j < n_here; ++j) {
                            tensor::deinterleave_row(pi.w->type, pi.data, K, m + j, row);
                            ot[j] = pi.dot(K, row, a);
                        }
                    }
                }
                r += n_here - 1;
                continue;
            }
            const uint8_t* wrow = pi.data + static_cast<size_t>(m) * pi.row_bytes;
            // the row stays in L1 while every token reads it
            for (int64_t t = 0; t < n_tokens; ++t)
                o[t * out_stride] = pi.dot(K, wrow, arow + static_cast<size_t>(t) * abytes);
        }
    };
    // Claims rows from the front (own stretch, kOwnClaim at a time) or the
    // back (another's, kRowBlock at a time) of a range; false when empty.
    auto claim = [](Range& rg, bool front, int64_t& r0, int64_t& r1) {
        uint64_t cur = rg.span.load(std::memory_order_relaxed);
        for (;;) {
            const auto f = static_cast<int64_t>(cur >> 32),
                       b = static_cast<int64_t>(cur & 0xFFFFFFFFu);
            if (f >= b) return false;
            const int64_t n = std::min<int64_t>(front ? kOwnClaim : kRowBlock, b - f);
            r0 = front ? f : b - n;
            r1 = r0 + n;
            const uint64_t next =
                front ? (static_cast<uint64_t>(f + n) << 32 | static_cast<uint64_t>(b))
                      : (static_cast<uint64_t>(f) << 32 | static_cast<uint64_t>(b - n));
            if (rg.span.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return true;
        }
    };
    pool.run_chunks(n_ranges, [&](int ith, int64_t c) {
        int64_t r0 = 0, r1 = 0;
        while (claim(ranges[c], true, r0, r1)) dot_rows(ith, r0, r1);
        for (int k = 1; k < n_ranges; ++k) {
            Range& other = ranges[(c + k) % n_ranges];
            while (claim(other, false, r0, r1)) dot_rows(ith, r0, r1);
        }
    });
}

}  // namespace minfer::cpu
