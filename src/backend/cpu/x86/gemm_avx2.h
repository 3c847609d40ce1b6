// Prefill matmul on 256-bit vectors (AVX2 + FMA + F16C), the Avx2 level of
// backend/cpu/isa.h: the same tiles, common weight form and activation
// GEMM form as gemm_avx512.cpp's AVX-512 VNNI one, with 8 weight rows per vector
// and int8 products summed by vpmaddubsw / vpmaddwd. gemm.cpp dispatches
// the GEMM here, quant_dot.cpp the Avx2 level's group kernels.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu::avx2 {

// Rows one gemm_rows call takes at most (4 panels of 8).
int64_t gemm_tile_rows();
// Per-thread scratch gemm_rows needs for rows of K.
size_t gemm_scratch_bytes(int64_t K);
// As cpu::gemm_rows (gemm.h), with activation rows whose q are signed
// (gemm_pack_act without the ^ 0x80 of the AVX-512 level's Q8_0 rows).
void gemm_rows(tensor::DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes,
               int64_t K, int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride,
               int64_t n_tokens, float* out, int64_t out_stride, void* scratch);

// The decode kernel for one interleaved 16-row group (tensor/interleave.h)
// of Q8_0, Q5_0, Q4_K or Q6_K against one activation row in the dot products'
// form (block_q8_0 / block_q8_K): out[16]. It does per row the GEMM
// micro-kernel's float steps on the same values, so a token's outputs are
// bitwise the same alone and in a batch. nullptr for other types. The
// AVX-VNNI variant where avx_vnni (the same sums, so the same bits).
using GroupDot = void (*)(int64_t n, const void* group, const void* a, float* out);
GroupDot group_dot(tensor::DType t, bool avx_vnni);

}  // namespace minfer::cpu::avx2
