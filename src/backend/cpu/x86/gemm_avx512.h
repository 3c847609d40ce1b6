// The prompt GEMM of the Avx512 level (backend/cpu/isa.h): AVX-512 VNNI
// (vpdpbusd) on panels of 16 weight rows, one row per int32 lane. gemm.cpp
// dispatches here; x86/gemm_avx2.cpp has the AVX2 level's GEMM and
// arm/gemm_neon.cpp the ARM64 ones, on the same common weight form
// (gemm_unpack.h) and activation GEMM form (gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu::avx512 {

// Rows one gemm_rows call takes at most (the micro-tile's panels of 16).
int64_t gemm_tile_rows();
// Per-thread scratch gemm_rows needs for rows of K.
size_t gemm_scratch_bytes(int64_t K);
// As cpu::gemm_rows (gemm.h), with activation rows in this level's GEMM
// form (gemm_pack_act: Q8_0 rows store q ^ 0x80, as vpdpbusd multiplies
// unsigned by signed; Q8_K rows are signed, the K-quant weights being the
// unsigned operand). x86-64 only.
void gemm_rows(tensor::DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes,
               int64_t K, int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride,
               int64_t n_tokens, float* out, int64_t out_stride, void* scratch);

}  // namespace minfer::cpu::avx512
