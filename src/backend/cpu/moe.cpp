#include "backend/cpu/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "backend/cpu/ops.h"
#include "ir/moe_layout.h"
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

void op_matmul_id(const Node& node, const NodeData& data, ThreadPool& pool) {
    const TensorView* w = node.weights.at(0);
    MINFER_ASSERT(w != nullptr);
    const int64_t K = w->ne[0], M = w->ne[1], n_expert = w->ne[2], n_slots = node.ne[1];
    MINFER_ASSERT(node.ne[0] == M && data.src_ne.at(0)[0] == K && data.src_ne.at(0)[1] == n_slots);
    MINFER_ASSERT(n_experts_of_group(data, 1, n_slots) == n_expert);
    const graph::MoeGroupView gv(static_cast<const int32_t*>(data.src[1]), n_expert, n_slots);
    MINFER_ASSERT(gv.offset[0] == 0 && gv.offset[n_expert] == n_slots);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    // Each expert some slot chose: its slice once over its rows, with the
    // dense matmul (every weight type and ISA level; a row's sums do not
    // depend on how many rows share the call where the dense path's do not).
    for (int64_t e = 0; e < n_expert; ++e) {
        const int64_t r0 = gv.offset[e], r1 = gv.offset[e + 1];
        MINFER_ASSERT(r0 <= r1);
        if (r0 == r1) continue;
        const TensorView slice = expert_slice(*w, e);
        const MatMulPart part{&slice, 0};
        matmul(&part, 1, x + r0 * K, K, r1 - r0, y + r0 * M, M, pool);
    }
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
