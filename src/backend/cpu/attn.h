// The inner loop of causal attention for one KV head: scores against n_kv
// cached keys, softmax, the weighted sum of V rows — with AVX-512 or AVX2
// (FMA, F16C), whichever cpu::isa_level() allows, or NEON (the scalar loop
// in kernels.cpp stays the reference). The regions are laid out as
// ir/kv_layout.h says: V row-major, K element-major in blocks of cells.
#pragma once

#include <cstddef>
#include <cstdint>

#include "backend/cpu/isa.h"
#include "ir/kv_layout.h"
#include "tensor/dtype.h"

namespace minfer::cpu {

// True when attn_rows_simd can run head_dim hd at the current ISA level
// (AVX2 or better, hd a multiple of 16 up to 256).
bool attn_simd_supported(int64_t hd);

// Several tokens of ONE sequence against one KV head: rows are (token i,
// head h of the group), q row at q + i * q_stride + h * hd, output at
// out + i * out_stride + h * hd; token i sees keys [0, n_kv[i]). As ggml:
// with an f16 cache q is rounded to f16 for the scores and the
// probabilities to f16 for the sum; the softmax sums each 16 exponentials in
// float, then in double; a score is one FMA chain over the head's dims (d
// ascending from zero), so it differs from the scalar reference only in
// float rounding. A row's result does not depend
// on the other rows of the call (keys past its n_kv add exact zeros), so
// it is the same whatever else shares the pass.
//
// Paged KV: with `pages`, key j lives in cell pages[j / page_cells] *
// page_cells + j % page_cells of the region (page_cells a multiple of
// graph::kKBlockCells: a page is whole K blocks); without, key j is cell j.
struct AttnRows {
    bool f16 = false;
    const float* q = nullptr;
    int64_t q_stride = 0;
    const int32_t* n_kv = nullptr;  // [n_tokens]
    int64_t n_tokens = 0, group = 1;
    const void* k = nullptr;  // region bases, cells of kv_row elements, this head at off
    const void* v = nullptr;
    const int32_t* pages = nullptr;  // the sequence's page table, or nullptr: cell = key
    int64_t page_cells = 0;
    int64_t kv_row = 0, off = 0, hd = 0;
    float scale = 1.0f;
    float* out = nullptr;
    int64_t out_stride = 0;
};
// Key j's cell (through the page table when there is one).
inline int64_t kv_cell(const AttnRows& a, int64_t j) {
    if (a.pages) return int64_t{a.pages[j / a.page_cells]} * a.page_cells + j % a.page_cells;
    return j;
}
// Element offset of key j's V row (this head's slice) in the V region.
inline int64_t v_elem(const AttnRows& a, int64_t j) {
    return kv_cell(a, j) * a.kv_row + a.off;
}
// Element offset of dim 0 of key j's K (this head) in the K region; dim d
// is d * graph::kKBlockCells further on, key j + 1 (in the same block) one.
inline int64_t k_elem(const AttnRows& a, int64_t j) {
    return graph::k_index(kv_cell(a, j), a.off, a.kv_row);
}
// Keys [j0, j1) as runs of consecutive cells: fn(j, run) for keys [j, j +
// run), which lie in one page (V rows kv_row apart) and one K block (K
// cells 1 apart). Every SIMD kernel that gathers K or V goes through it.
template <class Fn>
void for_each_kv_run(const AttnRows& a, int64_t j0, int64_t j1, Fn&& fn) {
    for (int64_t j = j0; j < j1;) {
        int64_t run = graph::kKBlockCells - kv_cell(a, j) % graph::kKBlockCells;
        if (a.pages && a.page_cells - j % a.page_cells < run) run = a.page_cells - j % a.page_cells;
        if (j1 - j < run) run = j1 - j;
        fn(j, run);
        j += run;
    }
}
// At most this many rows (n_tokens * group) per call.
constexpr int64_t kAttnMaxRows = 128;
// The score kernels take a call's keys a few at a time and pad its key
// count to a whole step; the scratch holds keys padded to this, a multiple
// of every kernel's step.
constexpr int64_t kAttnMaxKeyStep = 8;
// Floats of scratch attn_rows_simd needs.
size_t attn_rows_scratch_floats(int64_t rows, int64_t n_kv_max, int64_t hd);
void attn_rows_simd(const AttnRows& a, float* scratch);

// One K row (n_kv floats at src) into cell `cell` of the cache's K layout
// (ir/kv_layout.h), stored as kv_type F32 or F16 (tensor::fp32_to_fp16's
// bits), element by element: every level's fallback.
void store_k_row(tensor::DType kv_type, const float* src, void* region, int64_t cell, int64_t n_kv);
// The K rows of n consecutive cells [cell0, cell0 + n) of one K block, row
// i at src + i * src_stride, with store_k_row's bytes. One cell's elements
// lie kKBlockCells apart, so a row alone writes n_kv cache lines; the SIMD
// levels transpose 8 rows at a time and write 8 cells of an element at once.
using StoreKCellsFn = void (*)(tensor::DType kv_type, const float* src, int64_t src_stride,
                               int64_t n, void* region, int64_t cell0, int64_t n_kv);
// The level's entry (kernel_table.h); nullptr: row by row.
StoreKCellsFn store_k_cells_at(IsaLevel level);

}  // namespace minfer::cpu
