#include "backend/cpu/kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/attn.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/moe.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/vec_ops.h"
#include "ir/kv_layout.h"
#include "tensor/interleave.h"
#include "util/error.h"

namespace minfer::cpu {

using graph::Node;
using graph::Op;
using tensor::DType;
using tensor::TensorView;

namespace {

// Element-wise work below this many elements runs on the caller alone:
// waking the pool costs about a microsecond, a decode row of 896 floats less.
constexpr int64_t kParallelMinElements = 1 << 14;
constexpr int64_t kMaxHeadDim = 1024;

// Calls fn(i0, i1) on contiguous ranges of [0, n_items), one per thread,
// or once on the caller when the whole job is small.
template <typename Fn>
void parallel_ranges(ThreadPool& pool, int64_t n_items, int64_t elems_per_item, Fn&& fn) {
    if (n_items <= 0) return;
    if (pool.size() == 1 || n_items == 1 || n_items * elems_per_item < kParallelMinElements) {
        fn(int64_t{0}, n_items);
        return;
    }
    // Chunks of at least kParallelMinElements / 2 elements, about 4 per
    // thread, taken by whichever threads are awake.
    const int64_t min_items =
        std::max<int64_t>(1, kParallelMinElements / 2 / std::max<int64_t>(1, elems_per_item));
    const int64_t per = std::max(min_items, (n_items + 4 * pool.size() - 1) / (4 * pool.size()));
    const int64_t n_chunks = (n_items + per - 1) / per;
    pool.run_chunks(n_chunks, [&](int, int64_t c) {
        const int64_t i0 = c * per;
        fn(i0, std::min(n_items, i0 + per));
    });
}

const float* f32_weight(const Node& node, size_t i, int64_t want_ne0) {
    MINFER_ASSERT(i < node.weights.size());
    const TensorView* w = node.weights[i];
    if (w == nullptr) return nullptr;
    if (w->type != DType::F32)
        throw Error("node '" + node.name + "': weight '" + w->name + "' has type " +
                    std::string(tensor::dtype_name(w->type)) + ", expected f32");
    if (want_ne0 > 0 && w->ne[0] != want_ne0)
        throw Error("node '" + node.name + "': weight '" + w->name + "' has " +
                    std::to_string(w->ne[0]) + " elements, expected " + std::to_string(want_ne0));
    return static_cast<const float*>(w->data);
}

const std::array<int64_t, 4>& src_ne(const Node& node, const NodeData& data, size_t i) {
    MINFER_ASSERT_MSG(data.src_ne.size() > i, "NodeData.src_ne must give the source shapes");
    (void)node;
    return data.src_ne[i];
}

void check_positions(const Node& node, const int32_t* pos, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        if (pos[i] < 0 || pos[i] >= node.meta.n_ctx)
            throw Error("node '" + node.name + "': position " + std::to_string(pos[i]) +
                        " is past the context size " + std::to_string(node.meta.n_ctx));
    }
}

// The cell each token's K/V row goes to: src `cells_src` when the node has
// it (paged KV), else the token's position. Checked against the region; -1
// is a padding token that stores nothing.
const int32_t* kv_cells(const Node& node, const NodeData& data, size_t cells_src,
                        const int32_t* pos, int64_t n) {
    if (node.src.size() <= cells_src) return pos;
    MINFER_ASSERT(src_ne(node, data, cells_src)[0] >= n);
    const auto* cells = static_cast<const int32_t*>(data.src[cells_src]);
    for (int64_t i = 0; i < n; ++i)
        if (cells[i] < -1 || cells[i] >= node.meta.n_ctx)
            throw Error("node '" + node.name + "': KV cell " + std::to_string(cells[i]) +
                        " is outside the cache's " + std::to_string(node.meta.n_ctx) + " cells");
    return cells;
}

void add_row(const float* a, const float* b, float* y, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
}

// ---- the KV cache rows ---------------------------------------------------------
// A cell holds n_kv_embd elements of kv_type (F32 or F16): V rows are
// contiguous, K cells element-major in blocks (ir/kv_layout.h).

void store_v_row(DType t, const float* src, void* region, int64_t cell, int64_t n) {
    if (t == DType::F32) {
        std::memcpy(static_cast<float*>(region) + cell * n, src, static_cast<size_t>(n) * 4);
    } else {
        uint16_t* dst = static_cast<uint16_t*>(region) + cell * n;
        for (int64_t i = 0; i < n; ++i) dst[i] = tensor::fp32_to_fp16(src[i]);
    }
}

// The K rows of n tokens (row i at src + i * src_stride) into their cells
// (cells[i] < 0: a padding token, not stored): runs of consecutive cells
// of one K block go to the level's store_k_cells at once.
void store_k_rows(DType t, const float* src, int64_t src_stride, const int32_t* cells, int64_t n,
                  void* region, int64_t n_kv) {
    const StoreKCellsFn cells_fn = kernels().store_k_cells;
    for (int64_t i = 0; i < n;) {
        if (cells[i] < 0) {
            ++i;
            continue;
        }
        int64_t run = 1;
        while (i + run < n && cells[i + run] == cells[i] + run &&
               (cells[i] + run) % graph::kKBlockCells != 0)
            ++run;
        if (cells_fn)
            cells_fn(t, src + i * src_stride, src_stride, run, region, cells[i], n_kv);
        else
            for (int64_t r = 0; r < run; ++r)
                store_k_row(t, src + (i + r) * src_stride, region, cells[i] + r, n_kv);
        i += run;
    }
}

// The K layout stores whole blocks of cells: a region of a part of a block
// would be read and written past its end.
void check_kv_region(const Node& node) {
    if (node.meta.n_ctx % graph::kKBlockCells != 0)
        throw Error("node '" + node.name + "': the KV regions' " + std::to_string(node.meta.n_ctx) +
                    " cells are not a multiple of " + std::to_string(graph::kKBlockCells));
}

void head_norm_row(const float* x, const float* w, float* y, int64_t n_heads, int64_t head_dim,
                   float eps) {
    for (int64_t h = 0; h < n_heads; ++h)
        rms_norm_row(x + h * head_dim, w, y + h * head_dim, head_dim, eps);
}

// ---- ops ------------------------------------------------------------------------------

void op_get_rows(const Node& node, const NodeData& data, ThreadPool& pool) {
    const TensorView* table = node.weights.at(0);
    MINFER_ASSERT(table != nullptr);
    const auto* ids = static_cast<const int32_t*>(data.src[0]);
    const int64_t n = node.ne[1], ne0 = node.ne[0];
    MINFER_ASSERT(table->ne[0] == ne0);
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || ids[i] >= table->ne[1])
            throw Error("node '" + node.name + "': token id " + std::to_string(ids[i]) +
                        " is outside the vocabulary [0, " + std::to_string(table->ne[1]) +
                        ") of '" + table->name + "'");
    }
    auto* out = static_cast<float*>(data.out);
    const bool interleaved = table->layout == TensorView::Layout::Rows16;
    parallel_ranges(pool, n, ne0, [&](int64_t i0, int64_t i1) {
        // an interleaved table (tied embeddings regrouped for the output
        // matmul) gives its rows back one at a time
        std::vector<uint8_t> row(interleaved ? table->row_bytes() : 0);
        for (int64_t i = i0; i < i1; ++i) {
            const void* src = nullptr;
            if (interleaved) {
                tensor::deinterleave_row(table->type, table->data, ne0, ids[i], row.data());
                src = row.data();
            } else {
                src = table->row(ids[i]);
            }
            dequant_row(table->type, src, out + i * ne0, ne0);
        }
    });
}

void op_select_rows(const Node& node, const NodeData& data, ThreadPool&) {
    const auto* src = static_cast<const float*>(data.src[0]);
    const auto* ids = static_cast<const int32_t*>(data.src[1]);
    const int64_t n = node.ne[1], ne0 = node.ne[0];
    const int64_t n_src_rows = data.src_ne.size() > 0 ? data.src_ne[0][1] : -1;
    auto* out = static_cast<float*>(data.out);
    for (int64_t i = 0; i < n; ++i) {
        if (ids[i] < 0 || (n_src_rows >= 0 && ids[i] >= n_src_rows))
            throw Error("node '" + node.name + "': row id " + std::to_string(ids[i]) +
                        " is out of range");
        std::memmove(out + i * ne0, src + static_cast<int64_t>(ids[i]) * ne0,
                     static_cast<size_t>(ne0) * 4);
    }
}

void op_rms_norm(const Node& node, const NodeData& data, ThreadPool& pool) {
    const int64_t n = node.ne[1], ne0 = node.ne[0];
    const float* w = f32_weight(node, 0, ne0);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    parallel_ranges(pool, n, ne0, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
            rms_norm_row(x + i * ne0, w, y + i * ne0, ne0, node.meta.eps);
    });
}

void op_head_norm(const Node& node, const NodeData& data, ThreadPool& pool) {
    const int64_t n = node.ne[1], ne0 = node.ne[0], hd = node.meta.head_dim;
    MINFER_ASSERT(hd > 0 && ne0 % hd == 0);
    const float* w = f32_weight(node, 0, hd);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    parallel_ranges(pool, n, ne0, [&](int64_t i0, int64_t i1) {
        for (int64_t i = i0; i < i1; ++i)
            head_norm_row(x + i * ne0, w, y + i * ne0, ne0 / hd, hd, node.meta.eps);
    });
}

void op_rope(const Node& node, const NodeData& data, ThreadPool& pool) {
    const int64_t n = node.ne[1], ne0 = node.ne[0], hd = node.meta.head_dim;
    MINFER_ASSERT(hd > 0 && hd % 2 == 0 && hd <= kMaxHeadDim && ne0 % hd == 0);
    const auto* x = static_cast<const float*>(data.src[0]);
    const auto* pos = static_cast<const int32_t*>(data.src[1]);
    auto* y = static_cast<float*>(data.out);
    parallel_ranges(pool, n, ne0, [&](int64_t i0, int64_t i1) {
        std::array<float, kMaxHeadDim> cs;  // cos/sin table, no allocation per op
        for (int64_t i = i0; i < i1; ++i) {
            if (y != x) std::memcpy(y + i * ne0, x + i * ne0, static_cast<size_t>(ne0) * 4);
            rope_table(pos[i], hd, node.meta.rope_freq_base, cs.data());
            rope_row(y + i * ne0, ne0 / hd, hd, cs.data());
        }
    });
}

template <typename Fn>
void elementwise(const Node& node, const NodeData& data, ThreadPool& pool, Fn fn) {
    const int64_t n = node.n_elements();
    auto* y = static_cast<float*>(data.out);
    parallel_ranges(pool, n, 1, [&](int64_t i0, int64_t i1) { fn(y, i0, i1); });
}

void op_kv_store(const Node& node, const NodeData& data, ThreadPool&) {
    const int64_t n = src_ne(node, data, 0)[1];
    const int64_t n_kv_embd = int64_t{node.meta.n_head_kv} * node.meta.head_dim;
    MINFER_ASSERT(src_ne(node, data, 0)[0] == n_kv_embd && data.k && data.v);
    const auto* pos = static_cast<const int32_t*>(data.src[2]);
    check_kv_region(node);
    check_positions(node, pos, n);
    const int32_t* cells = kv_cells(node, data, 3, pos, n);
    const auto* k = static_cast<const float*>(data.src[0]);
    const auto* v = static_cast<const float*>(data.src[1]);
    store_k_rows(node.meta.kv_type, k, n_kv_embd, cells, n, data.k, n_kv_embd);
    for (int64_t i = 0; i < n; ++i)
        if (cells[i] >= 0)
            store_v_row(node.meta.kv_type, v + i * n_kv_embd, data.v, cells[i], n_kv_embd);
}

bool scalar_attn_forced() {
    const char* e = std::getenv("MINFER_SCALAR_ATTN");
    return e != nullptr && e[0] == '1';
}

// Where attention finds each token's keys: its sequence's page table (paged
// KV: src3 kv_rows, src4 kv_pages) or the region itself (cell = position).
struct KvPages {
    const int32_t* rows = nullptr;   // [n] page-table row per token
    const int32_t* pages = nullptr;  // [n_seqs, per_seq]
    int64_t cells = 0, per_seq = 0;  // cells per page, pages per table row
    const int32_t* table(int64_t t) const {
        return pages ? pages + int64_t{rows[t]} * per_seq : nullptr;
    }
    int64_t cell(const int32_t* tab, int64_t j) const {
        return tab ? int64_t{tab[j / cells]} * cells + j % cells : j;
    }
};

// Checks every page a token will read: a bad table is an error, never a
// read outside the region.
KvPages kv_pages_of(const Node& node, const NodeData& data, const int32_t* pos, int64_t n) {
    KvPages kp;
    if (node.src.size() < 5) return kp;
    const auto& m = node.meta;
    // whole K blocks: the SIMD kernels read up to a block of keys from a
    // multiple of its size as consecutive cells
    if (m.kv_page <= 0 || m.kv_page % graph::kKBlockCells != 0 || m.n_ctx % m.kv_page != 0)
        throw Error("node '" + node.name + "': page tables need meta.kv_page a multiple of " +
                    std::to_string(graph::kKBlockCells) + " dividing n_ctx");
    kp.rows = static_cast<const int32_t*>(data.src[3]);
    kp.pages = static_cast<const int32_t*>(data.src[4]);
    kp.cells = m.kv_page;
    kp.per_seq = m.n_ctx / m.kv_page;
    const int64_t n_rows = src_ne(node, data, 4)[0] / kp.per_seq;
    for (int64_t t = 0; t < n; ++t) {
        if (kp.rows[t] < 0 || kp.rows[t] >= n_rows)
            throw Error("node '" + node.name + "': page-table row " + std::to_string(kp.rows[t]) +
                        " of token " + std::to_string(t) + " is outside [0, " +
                        std::to_string(n_rows) + ")");
        const int32_t* tab = kp.table(t);
        for (int64_t p = 0; p <= pos[t] / kp.cells; ++p)
            if (tab[p] < 0 || tab[p] >= kp.per_seq)
                throw Error("node '" + node.name + "': page " + std::to_string(tab[p]) +
                            " in row " + std::to_string(kp.rows[t]) + " is outside the cache's " +
                            std::to_string(kp.per_seq) + " pages");
    }
    return kp;
}

void op_attn(const Node& node, const NodeData& data, ThreadPool& pool) {
    const auto& m = node.meta;
    const int64_t n = node.ne[1], hd = m.head_dim, n_head = m.n_head, n_head_kv = m.n_head_kv;
    MINFER_ASSERT(hd > 0 && n_head > 0 && n_head_kv > 0 && n_head % n_head_kv == 0);
    MINFER_ASSERT(node.ne[0] == n_head * hd && data.k && data.v);
    const int64_t group = n_head / n_head_kv;
    const int64_t kv_row = n_head_kv * hd;
    const int64_t q_stride = src_ne(node, data, 0)[0];
    MINFER_ASSERT(q_stride >= n_head * hd);
    const auto* q = static_cast<const float*>(data.src[0]);
    const auto* pos = static_cast<const int32_t*>(data.src[2]);
    check_kv_region(node);
    check_positions(node, pos, n);
    const KvPages kp = kv_pages_of(node, data, pos, n);
    int32_t max_pos = 0;
    for (int64_t i = 0; i < n; ++i) max_pos = std::max(max_pos, pos[i]);
    auto* out = static_cast<float*>(data.out);
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    const bool f16 = m.kv_type == DType::F16;
    MINFER_ASSERT(f16 || m.kv_type == DType::F32);
    const int64_t n_items = n * n_head;
    // MINFER_SCALAR_ATTN=1 keeps the scalar reference loop (tests compare).
    const bool simd = attn_simd_supported(hd) && !scalar_attn_forced();

    if (simd) {
        // Every token count takes attn_rows_simd, decode too: a token's
        // result must not depend on how many tokens share its pass (batch
        // invariance), and that kernel's rows are independent (its few-rows
        // and many-rows paths give the same bits). Items (KV head, block of
        // tokens of ONE sequence): the block's rows (token, head of the
        // group), over which each K/V row read (and converted from f16) is
        // shared: as many as kAttnMaxRows allows in whole 16-lane vectors
        // (the kernel skips the keys no row of a vector sees, so a long
        // block costs no extra scores), else at least 64 rows.
        int64_t tb = 0;
        for (int64_t t = kAttnMaxRows / group; t * group >= 64 && tb == 0; --t)
            if (t * group % 16 == 0) tb = t;
        if (tb == 0)
            tb = std::min(std::max<int64_t>(1, (64 + group - 1) / group),
                          std::max<int64_t>(1, kAttnMaxRows / group));
        std::vector<std::pair<int64_t, int64_t>> blocks;  // [t0, t1)
        for (int64_t t0 = 0; t0 < n;) {
            int64_t t1 = t0 + 1;
            while (t1 < n && t1 - t0 < tb && (!kp.rows || kp.rows[t1] == kp.rows[t0])) ++t1;
            blocks.emplace_back(t0, t1);
            t0 = t1;
        }
        const auto n_tb = static_cast<int64_t>(blocks.size());
        pool.run_chunks(n_head_kv * n_tb, [&](int ith, int64_t c) {
            const int64_t kvh = c / n_tb;
            const auto [t0, t1] = blocks[static_cast<size_t>(c % n_tb)];
            std::array<int32_t, kAttnMaxRows> n_kv{};
            int64_t n_kv_max = 0;
            for (int64_t t = t0; t < t1; ++t) {
                n_kv[static_cast<size_t>(t - t0)] = pos[t] + 1;
                n_kv_max = std::max<int64_t>(n_kv_max, pos[t] + 1);
            }
            AttnRows a;
            a.f16 = f16;
            a.q = q + t0 * q_stride + kvh * group * hd;
            a.q_stride = q_stride;
            a.n_kv = n_kv.data();
            a.n_tokens = t1 - t0;
            a.group = group;
            a.k = data.k;
            a.v = data.v;
            a.pages = kp.table(t0);
            a.page_cells = kp.cells;
            a.kv_row = kv_row;
            a.off = kvh * hd;
            a.hd = hd;
            a.scale = scale;
            a.out = out + t0 * node.ne[0] + kvh * group * hd;
            a.out_stride = node.ne[0];
            auto* scratch = static_cast<float*>(
                pool.scratch(ith, attn_rows_scratch_floats((t1 - t0) * group, n_kv_max, hd) * 4));
            attn_rows_simd(a, scratch);
        });
        return;
    }
    // Items (token, head) in chunks of a few heads: a chunk's heads share
    // K/V rows of one group where they can.
    const int64_t per = std::max<int64_t>(1, std::min<int64_t>(group, n_items / (4 * pool.size())));
    const int64_t n_chunks = (n_items + per - 1) / per;
    pool.run_chunks(n_chunks, [&](int ith, int64_t c) {
        const int64_t it0 = c * per, it1 = std::min(n_items, it0 + per);
        // scores [max_pos + 1], and for f16 caches a q and a k/v row as floats
        auto* s = static_cast<float*>(pool.scratch(
            ith, (static_cast<size_t>(max_pos) + 1 + 2 * static_cast<size_t>(hd)) * 4));
        float* qf = s + max_pos + 1;
        float* rowf = qf + hd;
        for (int64_t it = it0; it < it1; ++it) {
            const int64_t t = it / n_head, h = it % n_head, kvh = h / group;
            const int64_t n_kv = int64_t{pos[t]} + 1;  // causal: positions 0..pos
            const int32_t* tab = kp.table(t);
            const float* qh = q + t * q_stride + h * hd;
            float* o = out + t * node.ne[0] + h * hd;
            // Scores: ggml's mul_mat(k, q) then soft_max_ext(scale). An f16
            // cache makes ggml convert q to f16 first (vec_dot_type of f16).
            if (f16) {
                for (int64_t d = 0; d < hd; ++d)
                    qf[d] = tensor::fp16_to_fp32(tensor::fp32_to_fp16(qh[d]));
                const auto* kr = static_cast<const uint16_t*>(data.k);
                for (int64_t j = 0; j < n_kv; ++j) {
                    const uint16_t* kj = kr + graph::k_index(kp.cell(tab, j), kvh * hd, kv_row);
                    for (int64_t d = 0; d < hd; ++d)
                        rowf[d] = tensor::fp16_to_fp32(kj[d * graph::kKBlockCells]);
                    s[j] = dot_f32(qf, rowf, hd) * scale;
                }
            } else {
                const auto* kr = static_cast<const float*>(data.k);
                for (int64_t j = 0; j < n_kv; ++j) {
                    const float* kj = kr + graph::k_index(kp.cell(tab, j), kvh * hd, kv_row);
                    for (int64_t d = 0; d < hd; ++d) rowf[d] = kj[d * graph::kKBlockCells];
                    s[j] = dot_f32(qh, rowf, hd) * scale;
                }
            }
            softmax_row(s, s, n_kv);
            // out = sum_j p_j v_j (ggml: mul_mat(v, kq); an f16 V makes it
            // round kq to f16).
            std::fill(o, o + hd, 0.0f);
            if (f16) {
                const auto* vr = static_cast<const uint16_t*>(data.v);
                for (int64_t j = 0; j < n_kv; ++j) {
                    const float p = tensor::fp16_to_fp32(tensor::fp32_to_fp16(s[j]));
                    const uint16_t* vj = vr + kp.cell(tab, j) * kv_row + kvh * hd;
                    for (int64_t d = 0; d < hd; ++d) o[d] += p * tensor::fp16_to_fp32(vj[d]);
                }
            } else {
                const auto* vr = static_cast<const float*>(data.v);
                for (int64_t j = 0; j < n_kv; ++j) {
                    const float p = s[j];
                    const float* vj = vr + kp.cell(tab, j) * kv_row + kvh * hd;
                    for (int64_t d = 0; d < hd; ++d) o[d] += p * vj[d];
                }
            }
        }
    });
}

void op_matmul(const Node& node, const NodeData& data, ThreadPool& pool) {
    const TensorView* w = node.weights.at(0);
    MINFER_ASSERT(w != nullptr && w->ne[1] == node.ne[0]);
    MatMulPart part{w, 0};
    matmul(&part, 1, static_cast<const float*>(data.src[0]), w->ne[0], node.ne[1],
           static_cast<float*>(data.out), node.ne[0], pool, data.batch_invariant);
}

void op_matmul_swiglu(const Node& node, const NodeData& data, ThreadPool& pool) {
    MINFER_ASSERT(node.weights.size() == 2);
    const TensorView* gate = node.weights[0];
    const TensorView* up = node.weights[1];
    MINFER_ASSERT(gate && up && gate->ne == up->ne && gate->ne[1] == node.ne[0]);
    matmul_swiglu(*gate, *up, static_cast<const float*>(data.src[0]), gate->ne[0], node.ne[1],
                  static_cast<float*>(data.out), node.ne[0], pool, data.batch_invariant);
}

void op_fused_qkv(const Node& node, const NodeData& data, ThreadPool& pool) {
    MINFER_ASSERT(node.weights.size() == 3);
    const TensorView* wq = node.weights[0];
    const TensorView* wk = node.weights[1];
    const TensorView* wv = node.weights[2];
    MINFER_ASSERT(wq && wk && wv);
    MINFER_ASSERT(node.ne[0] == wq->ne[1] + wk->ne[1] + wv->ne[1]);
    const MatMulPart parts[3] = {{wq, 0}, {wk, wq->ne[1]}, {wv, wq->ne[1] + wk->ne[1]}};
    matmul(parts, 3, static_cast<const float*>(data.src[0]), wq->ne[0], node.ne[1],
           static_cast<float*>(data.out), node.ne[0], pool, data.batch_invariant);
}

// In place on the q|k|v rows. weights: 3 = (bq, bk, bv) biases (qwen2),
// 2 = (q_norm, k_norm) per-head norms (qwen3); a null entry is skipped.
void op_qkv_epilogue(const Node& node, const NodeData& data, ThreadPool& pool) {
    const auto& m = node.meta;
    const int64_t n = node.ne[1], hd = m.head_dim;
    const int64_t n_q = int64_t{m.n_head} * hd, n_kv = int64_t{m.n_head_kv} * hd;
    const int64_t stride = node.ne[0];
    MINFER_ASSERT(stride == n_q + 2 * n_kv && data.k && data.v);
    MINFER_ASSERT(hd > 0 && hd % 2 == 0 && hd <= kMaxHeadDim);
    const bool biases = node.weights.size() == 3;
    MINFER_ASSERT(biases || node.weights.size() == 2);
    const float* bq = biases ? f32_weight(node, 0, n_q) : nullptr;
    const float* bk = biases ? f32_weight(node, 1, n_kv) : nullptr;
    const float* bv = biases ? f32_weight(node, 2, n_kv) : nullptr;
    const float* q_norm = biases ? nullptr : f32_weight(node, 0, hd);
    const float* k_norm = biases ? nullptr : f32_weight(node, 1, hd);
    const auto* pos = static_cast<const int32_t*>(data.src[1]);
    check_kv_region(node);
    check_positions(node, pos, n);
    const int32_t* cells = kv_cells(node, data, 2, pos, n);
    const auto* x = static_cast<const float*>(data.src[0]);
    auto* y = static_cast<float*>(data.out);
    parallel_ranges(pool, n, stride, [&](int64_t i0, int64_t i1) {
        std::array<float, kMaxHeadDim> cs;  // cos/sin table, no allocation per op
        for (int64_t i = i0; i < i1; ++i) {
            float* row = y + i * stride;
            if (y != x) std::memcpy(row, x + i * stride, static_cast<size_t>(stride) * 4);
            float* q = row;
            float* k = row + n_q;
            float* v = row + n_q + n_kv;
            if (bq) add_row(q, bq, q, n_q);
            if (bk) add_row(k, bk, k, n_kv);
            if (bv) add_row(v, bv, v, n_kv);
            if (q_norm) head_norm_row(q, q_norm, q, m.n_head, hd, m.eps);
            if (k_norm) head_norm_row(k, k_norm, k, m.n_head_kv, hd, m.eps);
            rope_table(pos[i], hd, m.rope_freq_base, cs.data());
            rope_row(q, m.n_head, hd, cs.data());
            rope_row(k, m.n_head_kv, hd, cs.data());
            if (cells[i] >= 0) store_v_row(m.kv_type, v, data.v, cells[i], n_kv);  // else padding
        }
        // K after the range's rows: consecutive cells go in together.
        store_k_rows(m.kv_type, y + i0 * stride + n_q, stride, cells + i0, i1 - i0, data.k, n_kv);
    });
}

}  // namespace

void store_k_row(DType t, const float* src, void* region, int64_t cell, int64_t n) {
    const int64_t first = graph::k_index(cell, 0, n);
    if (t == DType::F32) {
        float* dst = static_cast<float*>(region) + first;
        for (int64_t i = 0; i < n; ++i) dst[i * graph::kKBlockCells] = src[i];
    } else {
        uint16_t* dst = static_cast<uint16_t*>(region) + first;
        for (int64_t i = 0; i < n; ++i) dst[i * graph::kKBlockCells] = tensor::fp32_to_fp16(src[i]);
    }
}

void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps) {
    const float mean = static_cast<float>(sum_squares(x, n) / static_cast<double>(n));
    const float scale = 1.0f / std::sqrt(mean + eps);
    if (w) {
        for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * scale) * w[i];
    } else {
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale;
    }
}

void softmax_row(const float* x, float* y, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; ++i) mx = std::max(mx, x[i]);
    double sum = 0.0;
    for (int64_t i = 0; i < n; ++i) {
        y[i] = std::exp(x[i] - mx);
        sum += static_cast<double>(y[i]);
    }
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t i = 0; i < n; ++i) y[i] *= inv;
}

void rope_table(int32_t pos, int64_t head_dim, float freq_base, float* cs) {
    // ggml_rope_cache_init: theta starts at p and is multiplied by
    // theta_scale per pair, in float (not recomputed by pow per pair).
    const float theta_scale = std::pow(freq_base, -2.0f / static_cast<float>(head_dim));
    float theta = static_cast<float>(pos);
    for (int64_t i0 = 0; i0 < head_dim; i0 += 2) {
        cs[i0] = std::cos(theta);
        cs[i0 + 1] = std::sin(theta);
        theta *= theta_scale;
    }
}

void rope_row(float* x, int64_t n_heads, int64_t head_dim, const float* cs) {
    const int64_t half = head_dim / 2;
    for (int64_t h = 0; h < n_heads; ++h) {
        float* xh = x + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const float x0 = xh[i], x1 = xh[i + half];
            xh[i] = x0 * c - x1 * s;
            xh[i + half] = x0 * s + x1 * c;
        }
    }
}

void run_node(const Node& node, const NodeData& data, ThreadPool& pool) {
    MINFER_ASSERT(data.src.size() >= node.src.size());
    switch (node.op) {
        case Op::Input:
            return;
        case Op::GetRows:
            return op_get_rows(node, data, pool);
        case Op::SelectRows:
            return op_select_rows(node, data, pool);
        case Op::RmsNorm:
            return op_rms_norm(node, data, pool);
        case Op::MatMul:
            return op_matmul(node, data, pool);
        case Op::Add: {
            const auto* a = static_cast<const float*>(data.src[0]);
            const auto* b = static_cast<const float*>(data.src[1]);
            return elementwise(node, data, pool, [&](float* y, int64_t i0, int64_t i1) {
                add_row(a + i0, b + i0, y + i0, i1 - i0);
            });
        }
        case Op::Mul: {
            const auto* a = static_cast<const float*>(data.src[0]);
            const auto* b = static_cast<const float*>(data.src[1]);
            return elementwise(node, data, pool, [&](float* y, int64_t i0, int64_t i1) {
                for (int64_t i = i0; i < i1; ++i) y[i] = a[i] * b[i];
            });
        }
        case Op::AddBias: {
            const int64_t ne0 = node.ne[0], n = node.ne[1];
            const float* b = f32_weight(node, 0, ne0);
            const auto* a = static_cast<const float*>(data.src[0]);
            auto* y = static_cast<float*>(data.out);
            return parallel_ranges(pool, n, ne0, [&](int64_t i0, int64_t i1) {
                for (int64_t i = i0; i < i1; ++i) add_row(a + i * ne0, b, y + i * ne0, ne0);
            });
        }
        case Op::Silu: {
            const auto* a = static_cast<const float*>(data.src[0]);
            return elementwise(node, data, pool, [&](float* y, int64_t i0, int64_t i1) {
                swiglu_row(a + i0, nullptr, y + i0, i1 - i0);
            });
        }
        case Op::SwiGLU: {
            const auto* a = static_cast<const float*>(data.src[0]);
            const auto* b = static_cast<const float*>(data.src[1]);
            return elementwise(node, data, pool, [&](float* y, int64_t i0, int64_t i1) {
                swiglu_row(a + i0, b + i0, y + i0, i1 - i0);
            });
        }
        case Op::MatMulSwiGLU:
            return op_matmul_swiglu(node, data, pool);
        case Op::HeadNorm:
            return op_head_norm(node, data, pool);
        case Op::Rope:
            return op_rope(node, data, pool);
        case Op::KvStore:
            return op_kv_store(node, data, pool);
        case Op::Attn:
            return op_attn(node, data, pool);
        case Op::FusedQKV:
            return op_fused_qkv(node, data, pool);
        case Op::QkvBiasRopeStore:
            return op_qkv_epilogue(node, data, pool);
        case Op::Softmax:
            return op_softmax(node, data, pool);
        case Op::TopK:
            return op_top_k(node, data, pool);
        case Op::MoeWeights:
            return op_moe_weights(node, data, pool);
        case Op::MoeGroup:
            return op_moe_group(node, data, pool);
        case Op::MoeGather:
            return op_moe_gather(node, data, pool);
        case Op::MatMulId:
        case Op::MatMulIdSwiGLU:
            return op_matmul_id(node, data, pool);
        case Op::MoeSum:
            return op_moe_sum(node, data, pool);
        case Op::SigmoidScale:
            return op_sigmoid_scale(node, data, pool);
    }
    MINFER_ASSERT_MSG(false, "run_node: unknown op");
}

}  // namespace minfer::cpu
