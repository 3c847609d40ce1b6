#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "backend/cpu/gemm.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"
#include "ir/moe_layout.h"
#include "tensor/interleave.h"
#include "util/error.h"

namespace minfer::cpu {

using graph::Node;
using tensor::TensorView;

namespace {

// The k of a node: TopK's output width (its own ne0, or a source's).
int64_t experts_per_token(const NodeData& data, size_t topk_src) {
    MINFER_ASSERT(data.src_ne.size() > topk_src);
    return data.src_ne[topk_src][0];
}

int64_t n_experts_of_group(const NodeData& data, size_t group_src, int64_t n_slots) {
    MINFER_ASSERT(data.src_ne.size() > group_src);
    const int64_t n_expert = data.src_ne[group_src][0] - 1 - 2 * n_slots;
    MINFER_ASSERT_MSG(n_expert >= 1, "MoeGroup output too small for its slots");
    return n_expert;
}

}  // namespace

TensorView expert_slice(const TensorView& w, int64_t e) {
    MINFER_ASSERT(e >= 0 && e < w.ne[2] && w.ne[3] == 1);
    TensorView s = w;
    s.ne = {w.ne[0], w.ne[1], 1, 1};
    s.nbytes = w.row_bytes() * static_cast<size_t>(w.ne[1]);
    s.data = static_cast<const uint8_t*>(w.data) + static_cast<size_t>(e) * s.nbytes;
    return s;
}

void op_softmax(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t ne0 = node.ne[0], n = node.ne[1];
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    for (int64_t t = 0; t < n; ++t) softmax_row(x + t * ne0, y + t * ne0, ne0);
}

void op_top_k(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t k = node.ne[0], n = node.ne[1];
    const int64_t n_expert = data.src_ne.at(0)[0];
    MINFER_ASSERT(k >= 1 && k <= n_expert);
    const auto* p = static_cast<const float*>(data.src[0]);
    auto* out = static_cast<int32_t*>(data.out);
    std::vector<int32_t> idx(static_cast<size_t>(n_expert));
    for (int64_t t = 0; t < n; ++t) {
        const float* row = p + t * n_expert;
        // ggml's argsort (what llama.cpp's top-k is) sorts the indices with
        // std::sort and a strict "greater" comparison: with the same standard
        // library the same sort gives tied experts in the same order (for 16
        // or fewer experts, libstdc++'s insertion sort keeps index order).
        std::iota(idx.begin(), idx.end(), 0);
        std::sort(idx.begin(), idx.end(), [row](int32_t a, int32_t b) { return row[a] > row[b]; });
        std::copy(idx.begin(), idx.begin() + k, out + t * k);
    }
}

void op_moe_weights(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t k = node.ne[0], n = node.ne[1];
    const int64_t n_expert = data.src_ne.at(0)[0];
    MINFER_ASSERT(experts_per_token(data, 1) == k);
    const auto* p = static_cast<const float*>(data.src[0]);
    const auto* ids = static_cast<const int32_t*>(data.src[1]);
    auto* w = static_cast<float*>(data.out);
    for (int64_t t = 0; t < n; ++t) {
        double sum = 0.0;  // ggml_sum_rows: a double sum, rounded to float
        for (int64_t j = 0; j < k; ++j) {
            const int32_t e = ids[t * k + j];
            if (e < 0 || e >= n_expert)
                throw Error("node '" + node.name + "': expert id " + std::to_string(e) +
                            " is outside [0, " + std::to_string(n_expert) + ")");
            w[t * k + j] = p[t * n_expert + e];
            sum += static_cast<double>(w[t * k + j]);
        }
        if (!node.meta.moe_norm) continue;
        // llama.cpp clamps the sum at the smallest normal f16 (no division by 0)
        const float s = std::max(static_cast<float>(sum), 6.103515625e-5f);
        for (int64_t j = 0; j < k; ++j) w[t * k + j] /= s;
    }
}

void op_moe_group(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t k = data.src_ne.at(0)[0], n = data.src_ne.at(0)[1];
    const int64_t n_slots = k * n, n_expert = node.meta.n_expert;
    MINFER_ASSERT(n_expert >= 1 && node.ne[0] == graph::moe_group_size(n_expert, n_slots));
    const auto* ids = static_cast<const int32_t*>(data.src[0]);
    auto* out = static_cast<int32_t*>(data.out);
    int32_t* offset = out;
    std::fill(offset, offset + n_expert + 1, 0);
    for (int64_t s = 0; s < n_slots; ++s) {
        if (ids[s] < 0 || ids[s] >= n_expert)
            throw Error("node '" + node.name + "': expert id " + std::to_string(ids[s]) +
                        " is outside [0, " + std::to_string(n_expert) + ")");
        ++offset[ids[s] + 1];
    }
    for (int64_t e = 0; e < n_expert; ++e) offset[e + 1] += offset[e];
    // a counting sort, slots in order within each expert
    std::vector<int32_t> next(offset, offset + n_expert);
    auto* slot_at = out + n_expert + 1;
    auto* position = slot_at + n_slots;
    for (int64_t s = 0; s < n_slots; ++s) {
        const int32_t g = next[static_cast<size_t>(ids[s])]++;
        slot_at[g] = static_cast<int32_t>(s);
        position[s] = g;
    }
}

void op_moe_gather(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t K = node.ne[0], n_slots = node.ne[1];
    const int64_t n = data.src_ne.at(0)[1];
    MINFER_ASSERT(data.src_ne.at(0)[0] == K && n >= 1 && n_slots % n == 0);
    const int64_t k = n_slots / n;
    const graph::MoeGroupView gv(static_cast<const int32_t*>(data.src[1]),
                                 n_experts_of_group(data, 1, n_slots), n_slots);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    for (int64_t g = 0; g < n_slots; ++g) {
        const int64_t t = gv.slot_at[g] / k;
        MINFER_ASSERT(t >= 0 && t < n);
        std::memcpy(y + g * K, x + t * K, static_cast<size_t>(K) * 4);
    }
}

namespace {

// Rows of one dot-product work item. Threads claim items in turn, so a
// thread's items are not adjacent in memory, and a thread streams fastest
// through long contiguous stretches (the dense matmul gives each thread one
// stretch for the same reason): an item is as long as it can be while each
// thread still gets kDotItemsPerThread of the pass's items to balance over
// (a decode step on a few threads: one item per chosen expert). Whole
// 16-row groups, at least 64 rows; an expert's last item may be shorter.
constexpr int64_t kDotItemsPerThread = 4;
int64_t dot_item_rows(int64_t dot_rows_in_pass, int n_threads) {
    const int64_t share = dot_rows_in_pass / (kDotItemsPerThread * std::max(n_threads, 1));
    const int64_t groups = (share + tensor::kInterleaveRows - 1) / tensor::kInterleaveRows;
    return std::max<int64_t>(64, groups * tensor::kInterleaveRows);
}
// Below this many activation elements the caller quantizes alone (as the
// dense matmul does).
constexpr int64_t kParallelQuantizeMin = 1 << 15;

struct ExpertItem {
    int32_t expert;
    int32_t r0, r1;  // weight rows of this item within the expert's slice
    bool gemm;       // the GEMM over the expert's rows, or dot products
};

}  // namespace

void op_matmul_id(const Node& node, const NodeData& data, ThreadPool& pool) {
    // MatMulId: one weight. MatMulIdSwiGLU: gate and up, same shape and type
    // (the fusion checks it), and the output is silu(gate) * up.
    const bool swiglu = node.op == graph::Op::MatMulIdSwiGLU;
    MINFER_ASSERT(node.weights.size() == (swiglu ? 2u : 1u));
    const TensorView* w = node.weights[0];
    const TensorView* w_up = swiglu ? node.weights[1] : nullptr;
    MINFER_ASSERT(w != nullptr && (!swiglu || w_up != nullptr));
    const int64_t K = w->ne[0], M = w->ne[1], n_expert = w->ne[2], n_slots = node.ne[1];
    MINFER_ASSERT(node.ne[0] == M && data.src_ne.at(0)[0] == K && data.src_ne.at(0)[1] == n_slots);
    MINFER_ASSERT(!swiglu ||
                  (w_up->type == w->type && w_up->ne == w->ne && w_up->layout == w->layout));
    MINFER_ASSERT(n_experts_of_group(data, 1, n_slots) == n_expert);
    const graph::MoeGroupView gv(static_cast<const int32_t*>(data.src[1]), n_expert, n_slots);
    MINFER_ASSERT(gv.offset[0] == 0 && gv.offset[n_expert] == n_slots);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);

    // Every expert some slot chose, in one dispatch over (expert, row block)
    // items: each expert's slice streamed once for all its rows (the GEMM
    // when the dense matmul would take it for that many tokens, so a row's
    // sums are those of the dense path for its expert's token count), an
    // expert nobody chose never read, and the threads balanced over the
    // whole layer rather than one small matrix at a time. Fused with the
    // SwiGLU, an item computes the same rows of gate and up and writes their
    // product: one dispatch instead of three, the activations quantized once.
    const tensor::DType at = act_type(w->type);
    const bool interleaved = w->layout == TensorView::Layout::Rows16;
    const VecDotFn dot = vec_dot_fn(w->type);
    const GroupDotFn group_dot = interleaved ? group_dot_fn(w->type) : nullptr;
    const GroupDotManyFn group_dot_many = interleaved ? group_dot_many_fn(w->type) : nullptr;
    MINFER_ASSERT_MSG(dot != nullptr, "MatMulId: weight type has no dot product");
    const size_t w_row_bytes = w->row_bytes();
    const size_t slice_bytes = w_row_bytes * static_cast<size_t>(M);

    // The items, counted first: they and the activations share the pool's
    // scratch (steady-state decode allocates nothing).
    enum class Path { None, Dot, Gemm };
    auto path_of = [&](int64_t e) {
        const int64_t n_e = gv.offset[e + 1] - gv.offset[e];
        MINFER_ASSERT(n_e >= 0);
        if (n_e == 0) return Path::None;
        // bitwise the GEMM's sums (quant_dot.h), so batch invariance holds either
        // way; a token chooses an expert once, so a decode batch of up to
        // kGroupDotManyMaxTokens never needs the GEMM
        if (group_dot_many != nullptr && n_e <= kGroupDotManyMaxTokens) return Path::Dot;
        return matmul_takes_gemm(*w, n_e, data.batch_invariant) ? Path::Gemm : Path::Dot;
    };
    // Both row counts are whole 16-row groups (asserted), so a fused item's
    // SwiGLU starts on a vector boundary and gives each element what the
    // whole-row SwiGLU gives it, whichever path the expert took.
    int64_t dot_rows_in_pass = 0;
    for (int64_t e = 0; e < n_expert; ++e)
        if (path_of(e) == Path::Dot) dot_rows_in_pass += M;
    const int64_t dot_rows = dot_item_rows(dot_rows_in_pass, pool.size());
    MINFER_ASSERT(!swiglu || gemm_tile_rows() % tensor::kInterleaveRows == 0);
    auto rows_per_item = [&](Path p) { return p == Path::Gemm ? gemm_tile_rows() : dot_rows; };
    int64_t n_items = 0;
    bool any_dot = false, any_gemm = false;
    for (int64_t e = 0; e < n_expert; ++e) {
        const Path p = path_of(e);
        if (p == Path::None) continue;
        n_items += (M + rows_per_item(p) - 1) / rows_per_item(p);
        (p == Path::Gemm ? any_gemm : any_dot) = true;
    }
    if (n_items == 0) return;
    const size_t dot_row = tensor::row_size(at, K);
    const size_t gemm_row = any_gemm ? gemm_act_row_bytes(at, K) : 0;
    auto round64 = [](size_t b) { return (b + 63) / 64 * 64; };
    const size_t items_bytes = round64(sizeof(ExpertItem) * static_cast<size_t>(n_items));
    const size_t dot_bytes = any_dot ? round64(dot_row * static_cast<size_t>(n_slots)) : 0;
    auto* base = static_cast<uint8_t*>(pool.scratch(
        pool.size(), items_bytes + dot_bytes + gemm_row * static_cast<size_t>(n_slots)));
    auto* items = reinterpret_cast<ExpertItem*>(base);
    uint8_t* act_dot = base + items_bytes;
    uint8_t* act_gemm = act_dot + dot_bytes;
    {
        int64_t i = 0;
        for (int64_t e = 0; e < n_expert; ++e) {
            const Path p = path_of(e);
            if (p == Path::None) continue;
            const int64_t step = rows_per_item(p);
            for (int64_t r = 0; r < M; r += step)
                items[i++] = {static_cast<int32_t>(e), static_cast<int32_t>(r),
                              static_cast<int32_t>(std::min(M, r + step)), p == Path::Gemm};
        }
        MINFER_ASSERT(i == n_items);
    }

    // 1. Activations, once per slot, in the form its expert's path reads.
    auto quantize_expert = [&](int ith, int64_t e) {
        const int64_t g0 = gv.offset[e], g1 = gv.offset[e + 1];
        if (g0 == g1) return;
        const bool gemm = path_of(e) == Path::Gemm;
        for (int64_t g = g0; g < g1; ++g) {
            if (gemm) {
                gemm_quantize_act(at, x + g * K, K, act_gemm + static_cast<size_t>(g) * gemm_row,
                                  pool.scratch(ith, dot_row));
            } else {
                quantize_act_row(at, x + g * K, act_dot + static_cast<size_t>(g) * dot_row, K);
            }
        }
    };
    if (pool.size() == 1 || n_slots * K < kParallelQuantizeMin) {
        for (int64_t e = 0; e < n_expert; ++e) quantize_expert(0, e);
    } else {
        pool.run_chunks(n_expert, quantize_expert);
    }

    // 2. The items. out[t * ldo + r - it.r0] for the item's rows r of the
    // expert's n_e tokens t, from one weight tensor; `spare` is the thread's
    // scratch beyond what the caller uses.
    auto compute = [&](const ExpertItem& it, const uint8_t* w_data, float* out, int64_t ldo,
                       uint8_t* spare) {
        const int64_t g0 = gv.offset[it.expert], n_e = gv.offset[it.expert + 1] - g0;
        const uint8_t* slice = w_data + static_cast<size_t>(it.expert) * slice_bytes;
        if (it.gemm) {
            gemm_rows(w->type, interleaved, slice, w_row_bytes, K, it.r0, it.r1,
                      act_gemm + static_cast<size_t>(g0) * gemm_row, gemm_row, n_e, out, ldo,
                      spare);
            return;
        }
        const uint8_t* a0 = act_dot + static_cast<size_t>(g0) * dot_row;
        if (interleaved) {
            for (int64_t r = it.r0; r < it.r1; r += tensor::kInterleaveRows) {
                const uint8_t* group = slice + static_cast<size_t>(r) * w_row_bytes;
                float* o = out + (r - it.r0);
                if (group_dot_many) {
                    group_dot_many(K, group, a0, dot_row, n_e, o, ldo);
                    continue;
                }
                for (int64_t t = 0; t < n_e; ++t) {
                    const uint8_t* a = a0 + static_cast<size_t>(t) * dot_row;
                    if (group_dot) {
                        group_dot(K, group, a, o + t * ldo);
                    } else {
                        for (int64_t j = 0; j < tensor::kInterleaveRows; ++j) {
                            tensor::deinterleave_row(w->type, slice, K, r + j, spare);
                            o[t * ldo + j] = dot(K, spare, a);
                        }
                    }
                }
            }
            return;
        }
        for (int64_t r = it.r0; r < it.r1; ++r) {
            const uint8_t* wrow = slice + static_cast<size_t>(r) * w_row_bytes;
            // the row stays in L1 while every token of the expert reads it
            for (int64_t t = 0; t < n_e; ++t)
                out[t * ldo + r - it.r0] = dot(K, wrow, a0 + static_cast<size_t>(t) * dot_row);
        }
    };
    const size_t spare_bytes =
        round64(std::max(any_gemm ? gemm_scratch_bytes(K) : size_t{0}, w_row_bytes));
    const auto* w_data = static_cast<const uint8_t*>(w->data);
    if (!swiglu) {
        pool.run_chunks(n_items, [&](int ith, int64_t i) {
            const ExpertItem& it = items[i];
            compute(it, w_data, y + gv.offset[it.expert] * M + it.r0, M,
                    static_cast<uint8_t*>(pool.scratch(ith, spare_bytes)));
        });
        return;
    }
    const auto* up_data = static_cast<const uint8_t*>(w_up->data);
    pool.run_chunks(n_items, [&](int ith, int64_t i) {
        const ExpertItem& it = items[i];
        const int64_t g0 = gv.offset[it.expert], n_e = gv.offset[it.expert + 1] - g0;
        const int64_t width = it.r1 - it.r0;
        // gate and up rows [n_e, width] side by side, then the spare
        const size_t tile_bytes = round64(sizeof(float) * static_cast<size_t>(n_e * width));
        auto* s = static_cast<uint8_t*>(pool.scratch(ith, 2 * tile_bytes + spare_bytes));
        auto* gate = reinterpret_cast<float*>(s);
        auto* up = reinterpret_cast<float*>(s + tile_bytes);
        compute(it, w_data, gate, width, s + 2 * tile_bytes);
        compute(it, up_data, up, width, s + 2 * tile_bytes);
        swiglu_tile(gate, up, n_e, width, y + g0 * M + it.r0, M);
    });
}

void op_moe_sum(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t ne0 = node.ne[0], n = node.ne[1];
    const int64_t k = experts_per_token(data, 1), n_slots = k * n;
    MINFER_ASSERT(data.src_ne.at(0)[0] == ne0 && data.src_ne.at(0)[1] == n_slots);
    const graph::MoeGroupView gv(static_cast<const int32_t*>(data.src[2]),
                                 n_experts_of_group(data, 2, n_slots), n_slots);
    const auto* ex = static_cast<const float*>(data.src[0]);
    const auto* w = static_cast<const float*>(data.src[1]);
    auto* y = static_cast<float*>(data.out);
    for (int64_t t = 0; t < n; ++t) {
        float* yr = y + t * ne0;
        // llama.cpp: each expert's output times its weight, then the k
        // products added in choice order
        for (int64_t j = 0; j < k; ++j) {
            const float* er = ex + static_cast<int64_t>(gv.position[t * k + j]) * ne0;
            const float wj = w[t * k + j];
            if (j == 0)
                for (int64_t i = 0; i < ne0; ++i) yr[i] = er[i] * wj;
            else
                for (int64_t i = 0; i < ne0; ++i) yr[i] += er[i] * wj;
        }
    }
}

void op_sigmoid_scale(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t ne0 = node.ne[0], n = node.ne[1];
    MINFER_ASSERT(data.src_ne.at(1)[0] == 1 && data.src_ne.at(1)[1] == n);
    const auto* x = static_cast<const float*>(data.src[0]);
    const auto* g = static_cast<const float*>(data.src[1]);
    auto* y = static_cast<float*>(data.out);
    for (int64_t t = 0; t < n; ++t) {
        // llama.cpp's qwen2moe computes the sigmoid as silu(g) / g
        const float gt = g[t];
        const float s = gt == 0.0f ? 0.5f : gt / (1.0f + std::exp(-gt)) / gt;
        for (int64_t i = 0; i < ne0; ++i) y[t * ne0 + i] = x[t * ne0 + i] * s;
    }
}

}  // namespace minfer::cpu
