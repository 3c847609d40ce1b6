// How a layer's persistent KV regions hold their cells: the contract between
// the kernels that write and read them (backend/cpu) and the runtime that
// copies cells between pages (an admission reusing a running sequence's
// prefix) and the reports that dump them as rows.
//
// V: row-major, cell c's n_kv_embd elements at c * n_kv_embd.
// K: in blocks of kKBlockCells cells, each block element-major: element e
// (= head * head_dim + dim) of cell c at k_index(c, e, n_kv_embd). So one
// dim of one head over 8 or 16 consecutive cells of a block is a single
// vector load, and the attention scores take keys in the vector lanes with
// no transpose (a decode token's few query rows score faster than on
// row-major K transposed in registers, with the same FMA chain and bits).
// A region is a whole number of blocks: n_ctx a multiple of kKBlockCells.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace minfer::graph {

constexpr int64_t kKBlockCells = 32;

// Element index of element e of cell `cell` in a K region whose cells hold
// `row` (n_kv_embd) elements; element e + 1 is kKBlockCells further on.
constexpr int64_t k_index(int64_t cell, int64_t e, int64_t row) {
    return (cell / kKBlockCells) * kKBlockCells * row + e * kKBlockCells + cell % kKBlockCells;
}

// Copies cells [first, first + n) of a K range to the same cells of another.
// Both ranges start at a K block; `row` elements of `elem_bytes` bytes a cell.
inline void copy_k_cells(uint8_t* dst, const uint8_t* src, int64_t first, int64_t n, int64_t row,
                         size_t elem_bytes) {
    for (int64_t c = first; c < first + n;) {
        // the cells of one block are consecutive for each element
        const int64_t m = std::min(first + n - c, kKBlockCells - c % kKBlockCells);
        for (int64_t e = 0; e < row; ++e) {
            const size_t at = static_cast<size_t>(k_index(c, e, row)) * elem_bytes;
            std::memcpy(dst + at, src + at, static_cast<size_t>(m) * elem_bytes);
        }
        c += m;
    }
}

// The first n_cells cells of a K range (starting at a K block) as rows, cell
// c's `row` elements at c * row, as a V range holds them.
inline void k_cells_as_rows(uint8_t* rows, const uint8_t* k, int64_t n_cells, int64_t row,
                            size_t elem_bytes) {
    for (int64_t c = 0; c < n_cells; ++c)
        for (int64_t e = 0; e < row; ++e)
            std::memcpy(rows + static_cast<size_t>(c * row + e) * elem_bytes,
                        k + static_cast<size_t>(k_index(c, e, row)) * elem_bytes, elem_bytes);
}

}  // namespace minfer::graph
