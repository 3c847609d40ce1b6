// The inner loop of causal attention for one (token, head): scores against
// n_kv cached K rows, softmax, the weighted sum of V rows — with AVX-512 or
// AVX2 (FMA, F16C), whichever cpu::isa_level() allows (the scalar loop in
// kernels.cpp stays the reference).
#pragma once

#include <cstddef>
#include <cstdint>

namespace minfer::cpu {

// True when attn_head_simd can run head_dim hd at the current ISA level
// (AVX2 or better, hd a multiple of 16 up to 256).
bool attn_simd_supported(int64_t hd);

// q [hd]; k, v: the region bases (f32, or f16 when f16) with rows of kv_row
// elements, this head's slice at element offset `off`; s scratch [n_kv]; o
// [hd] is overwritten. As ggml: with an f16 cache q is rounded to f16 for the
// scores and the probabilities to f16 for the sum; the softmax sums each 16
// exponentials in float, then in double.
void attn_head_simd(bool f16, const float* q, const void* k, const void* v, int64_t kv_row,
                    int64_t off, int64_t n_kv, int64_t hd, float scale, float* s, float* o);

// Several tokens of ONE sequence against one KV head: rows are (token i,
// head h of the group), q row at q + i * q_stride + h * hd, output at
// out + i * out_stride + h * hd; token i sees keys [0, n_kv[i]). Same
// softmax arithmetic as attn_head_simd; the score order differs only in
// float rounding (one FMA chain per score). A row's result does not depend
// on the other rows of the call (keys past its n_kv add exact zeros), so
// it is the same whatever else shares the pass.
//
// Paged KV: with `pages`, key j lives in cell pages[j / page_cells] *
// page_cells + j % page_cells of the region; the K/V rows are gathered page
// by page (contiguous runs of up to page_cells rows) into scratch as floats.
// Without, key j is cell j.
struct AttnRows {
    bool f16 = false;
    const float* q = nullptr;
    int64_t q_stride = 0;
    const int32_t* n_kv = nullptr;  // [n_tokens]
    int64_t n_tokens = 0, group = 1;
    const void* k = nullptr;  // region bases, rows of kv_row elements, this head at off
    const void* v = nullptr;
    const int32_t* pages = nullptr;  // the sequence's page table, or nullptr: cell = key
    int64_t page_cells = 0;
    int64_t kv_row = 0, off = 0, hd = 0;
    float scale = 1.0f;
    float* out = nullptr;
    int64_t out_stride = 0;
};
// Element offset of key j's row (this head's slice) in the region bases
// (through the page table when there is one).
inline int64_t kv_elem(const AttnRows& a, int64_t j) {
    int64_t cell = j;
    if (a.pages) cell = int64_t{a.pages[j / a.page_cells]} * a.page_cells + j % a.page_cells;
    return cell * a.kv_row + a.off;
}
// The keys [0, n_kv) of a's sequence as contiguous runs of cells (a page
// each, or one run without a page table): fn(j0, first, run) for keys
// [j0, j0 + run), `first` the element offset of key j0's row (this head's
// slice) in the region bases. Every SIMD kernel gathers K and V through it or kv_elem.
template <class Fn>
void for_each_kv_run(const AttnRows& a, int64_t n_kv, Fn&& fn) {
    for (int64_t j0 = 0; j0 < n_kv;) {
        int64_t run = n_kv - j0;
        if (a.pages) {
            const int64_t left_in_page = a.page_cells - j0 % a.page_cells;
            run = run < left_in_page ? run : left_in_page;
        }
        fn(j0, kv_elem(a, j0), run);
        j0 += run;
    }
}
// At most this many rows (n_tokens * group) per call.
constexpr int64_t kAttnMaxRows = 128;
// Floats of scratch attn_rows_simd needs.
size_t attn_rows_scratch_floats(int64_t rows, int64_t n_kv_max, int64_t hd);
void attn_rows_simd(const AttnRows& a, float* scratch);

}  // namespace minfer::cpu
