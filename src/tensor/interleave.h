// Weights regrouped for the CPU kernels: 16 consecutive rows interleaved
// block by block. Each field of a block (scale, high bits, quants, ...) is
// cut into units of 2 or 4 bytes, and unit k of the 16 rows is stored side
// by side, so one vector load gives the same piece of 16 rows with one row
// per 32-bit lane (or 16-bit lane for the f16 scales): the kernels then
// work on 16 rows at once with no shuffles and no horizontal sums. Same
// bytes as the GGUF rows, in another order (Q8_0's quants stored ^ 0x80).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::tensor {

constexpr int64_t kInterleaveRows = 16;

// Whether rows of type t can be interleaved (M rows of K; M a multiple of 16).
bool can_interleave(DType t, int64_t K, int64_t M);

// src: M rows of K in GGUF layout; dst: the same number of bytes.
void interleave_rows(DType t, const void* src, int64_t K, int64_t M, void* dst);

// Row r of an interleaved tensor back in GGUF layout (row_size(t, K) bytes).
void deinterleave_row(DType t, const void* data, int64_t K, int64_t r, void* row);

}  // namespace minfer::tensor
