#include <algorithm>
#include <atomic>
#include <cstring>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"
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

namespace {

size_t round64(size_t b) {
    return (b + 63) / 64 * 64;
}

// matmul and matmul_swiglu. With swiglu, parts are gate and up (same K and
// M, out_col 0) and a thread computes the same rows of both, then their
// SwiGLU into out while both are in its cache.
void matmul_parts(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
                  int64_t n_tokens, float* out, int64_t out_stride, ThreadPool& pool,
                  bool batch_invariant, bool swiglu) {
    MINFER_ASSERT(n_parts >= 1 && n_parts <= kMaxParts);
    MINFER_ASSERT(!swiglu || n_parts == 2);
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
    // The rows the work is split over: with the SwiGLU, row m stands for
    // gate row m and up row m.
    const int64_t M_work = swiglu ? info[0].w->ne[1] : M;
    MINFER_ASSERT(!swiglu ||
                  (info[1].w->ne[1] == M_work && parts[0].out_col == 0 && parts[1].out_col == 0));
    size_t max_row_bytes = 0;
    for (int p = 0; p < n_parts; ++p) max_row_bytes = std::max(max_row_bytes, info[p].row_bytes);

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
        const int64_t n_rt = (M_work + tile_rows - 1) / tile_rows;
        const size_t kernel_bytes = round64(gemm_scratch_bytes(K));
        // With the SwiGLU, a tile's gate and up rows wait here, [n_tokens,
        // tile_rows] each and contiguous: in out, whose rows are often a
        // multiple of 4 KiB apart, the SwiGLU's loads would alias the
        // previous row's stores.
        const size_t tile_bytes =
            swiglu ? round64(sizeof(float) * static_cast<size_t>(n_tokens * tile_rows)) : 0;
        auto gemm_work = [&](int ith, int64_t tile) {
            auto* scratch = static_cast<uint8_t*>(pool.scratch(ith, kernel_bytes + 2 * tile_bytes));
            if (swiglu) {
                const int64_t r0 = tile * tile_rows, r1 = std::min(M_work, r0 + tile_rows);
                const int64_t width = r1 - r0;
                float* rows[2];
                for (int p = 0; p < 2; ++p) {
                    const PartInfo& pi = info[p];
                    rows[p] = reinterpret_cast<float*>(scratch + kernel_bytes + p * tile_bytes);
                    gemm_rows(pi.w->type, pi.interleaved, pi.data, pi.row_bytes, K, r0, r1,
                              act + gemm_offset[pi.act], gemm_row[pi.act], n_tokens, rows[p], width,
                              scratch);
                }
                swiglu_tile(rows[0], rows[1], n_tokens, width, out + r0, out_stride);
                return;
            }
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
            while (row < M_work && (i == n_ranges - 1 || done < goal)) {
                if (swiglu) {
                    done += info[0].row_bytes + info[1].row_bytes;
                } else {
                    while (p + 1 < n_parts && row >= info[p + 1].row_begin) ++p;
                    done += info[p].row_bytes;
                }
                ++row;
            }
            // whole blocks of rows (a block's outputs are a few cache lines)
            int64_t end = i == n_ranges - 1
                              ? M_work
                              : std::min(M_work, (row + kRowBlock / 2) / kRowBlock * kRowBlock);
            end = std::max(end, begin);
            row = end;
            ranges[i].span.store(static_cast<uint64_t>(begin) << 32 | static_cast<uint64_t>(end),
                                 std::memory_order_relaxed);
        }
        MINFER_ASSERT(row == M_work);
    }
    // Rows [r0, r1) of the concatenated parts; row m of a part goes to
    // dst[t * dst_stride + out_col + m - shift]. `spare` holds a row.
    auto dot_rows = [&](int64_t r0, int64_t r1, float* dst, int64_t dst_stride, int64_t shift,
                        uint8_t* spare) {
        int p = 0;
        for (int64_t r = r0; r < r1; ++r) {
            while (p + 1 < n_parts && r >= info[p + 1].row_begin) ++p;
            const PartInfo& pi = info[p];
            const int64_t m = r - pi.row_begin;
            const uint8_t* arow = act + act_offset[pi.act];
            const size_t abytes = act_row_bytes[pi.act];
            float* o = dst + pi.out_col + m - shift;
            if (pi.interleaved) {
                // The claim's rows of one group of 16 (all of it, normally).
                const int64_t l0 = m % tensor::kInterleaveRows;
                const int64_t n_here = std::min(tensor::kInterleaveRows - l0, r1 - r);
                const uint8_t* group = pi.data + static_cast<size_t>(m - l0) * pi.row_bytes;
                if (many && n_here == tensor::kInterleaveRows) {
                    pi.group_dot_many(K, group, arow, abytes, n_tokens, o, dst_stride);
                    r += n_here - 1;
                    continue;
                }
                for (int64_t t = 0; t < n_tokens; ++t) {
                    const uint8_t* a = arow + static_cast<size_t>(t) * abytes;
                    float* ot = o + t * dst_stride;
                    if (pi.group_dot && n_here == tensor::kInterleaveRows) {
                        pi.group_dot(K, group, a, ot);
                    } else if (pi.group_dot) {
                        float all[tensor::kInterleaveRows];
                        pi.group_dot(K, group, a, all);
                        std::copy(all + l0, all + l0 + n_here, ot);
                    } else {
                        for (int64_t j = 0; j < n_here; ++j) {
                            tensor::deinterleave_row(pi.w->type, pi.data, K, m + j, spare);
                            ot[j] = pi.dot(K, spare, a);
                        }
                    }
                }
                r += n_here - 1;
                continue;
            }
            const uint8_t* wrow = pi.data + static_cast<size_t>(m) * pi.row_bytes;
            // the row stays in L1 while every token reads it
            for (int64_t t = 0; t < n_tokens; ++t)
                o[t * dst_stride] = pi.dot(K, wrow, arow + static_cast<size_t>(t) * abytes);
        }
    };
    // Claims rows from the front (own stretch, kOwnClaim at a time) or the
    // back (another's, up to kRowBlock at a time) of a range; false when
    // empty. Every claim starts on a kRowBlock boundary (the ranges do, and
    // a back claim stops at one), so a SwiGLU over a claim's rows covers
    // the elements that the whole rows' SwiGLU covers with each vector.
    auto claim = [](Range& rg, bool front, int64_t& r0, int64_t& r1) {
        uint64_t cur = rg.span.load(std::memory_order_relaxed);
        for (;;) {
            const auto f = static_cast<int64_t>(cur >> 32),
                       b = static_cast<int64_t>(cur & 0xFFFFFFFFu);
            if (f >= b) return false;
            const int64_t n = front ? std::min<int64_t>(kOwnClaim, b - f)
                                    : b - std::max(f, (b - 1) / kRowBlock * kRowBlock);
            r0 = front ? f : b - n;
            r1 = r0 + n;
            const uint64_t next =
                front ? (static_cast<uint64_t>(f + n) << 32 | static_cast<uint64_t>(b))
                      : (static_cast<uint64_t>(f) << 32 | static_cast<uint64_t>(b - n));
            if (rg.span.compare_exchange_weak(cur, next, std::memory_order_relaxed)) return true;
        }
    };
    const size_t spare_bytes = round64(max_row_bytes);
    // with the SwiGLU, a claim's gate and up rows [n_tokens, <= kOwnClaim] wait here
    const size_t tile_bytes =
        swiglu ? round64(sizeof(float) * static_cast<size_t>(n_tokens * kOwnClaim)) : 0;
    auto claimed = [&](uint8_t* spare, int64_t r0, int64_t r1) {
        if (!swiglu) return dot_rows(r0, r1, out, out_stride, 0, spare);
        auto* gate = reinterpret_cast<float*>(spare + spare_bytes);
        auto* up = reinterpret_cast<float*>(spare + spare_bytes + tile_bytes);
        const int64_t width = r1 - r0;
        dot_rows(r0, r1, gate, width, r0, spare);
        dot_rows(M_work + r0, M_work + r1, up, width, r0, spare);
        swiglu_tile(gate, up, n_tokens, width, out + r0, out_stride);
    };
    pool.run_chunks(n_ranges, [&](int ith, int64_t c) {
        auto* spare = static_cast<uint8_t*>(pool.scratch(ith, spare_bytes + 2 * tile_bytes));
        int64_t r0 = 0, r1 = 0;
        while (claim(ranges[c], true, r0, r1)) claimed(spare, r0, r1);
        for (int k = 1; k < n_ranges; ++k) {
            Range& other = ranges[(c + k) % n_ranges];
            while (claim(other, false, r0, r1)) claimed(spare, r0, r1);
        }
    });
}

}  // namespace

void matmul(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
            int64_t n_tokens, float* out, int64_t out_stride, ThreadPool& pool,
            bool batch_invariant) {
    matmul_parts(parts, n_parts, x, x_stride, n_tokens, out, out_stride, pool, batch_invariant,
                 false);
}

void matmul_swiglu(const tensor::TensorView& gate, const tensor::TensorView& up, const float* x,
                   int64_t x_stride, int64_t n_tokens, float* out, int64_t out_stride,
                   ThreadPool& pool, bool batch_invariant) {
    MINFER_ASSERT(gate.ne == up.ne);
    const MatMulPart parts[2] = {{&gate, 0}, {&up, 0}};
    matmul_parts(parts, 2, x, x_stride, n_tokens, out, out_stride, pool, batch_invariant, true);
}

}  // namespace minfer::cpu
