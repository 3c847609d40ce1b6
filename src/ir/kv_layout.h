// How a layer's persistent KV regions hold their cells: the contract between
// the kernels that write and read them (backend/cpu) and the runtime that
// copies cells between pages (an admission reusing a running sequence's
// prefix).
//
// V: row-major, cell c's n_kv_embd elements at c * n_kv_embd.
// K: in blocks of kKBlockCells cells, each block element-major: element e
// (= head * head_dim + dim) of cell c at k_index(c, e, n_kv_embd). So one
// dim of one head over 8 or 16 consecutive cells of a block is a single
// vector load, and the attention scores take keys in the vector lanes with
// no transpose (a decode token's few query rows: 2.8x faster scores than
// row-major K transposed in registers, the same FMA chain, the same bits).
// A region is a whole number of blocks: n_ctx a multiple of kKBlockCells.
#pragma once

#include <cstdint>

namespace minfer::graph {

constexpr int64_t kKBlockCells = 32;

// Element index of element e of cell `cell` in a K region whose cells hold
// `row` (n_kv_embd) elements; element e + 1 is kKBlockCells further on.
constexpr int64_t k_index(int64_t cell, int64_t e, int64_t row) {
    return (cell / kKBlockCells) * kKBlockCells * row + e * kKBlockCells + cell % kKBlockCells;
}

}  // namespace minfer::graph
