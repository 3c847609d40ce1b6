// Prefill matmul on ARM64, the Neon, Dotprod and I8mm levels of
// backend/cpu/isa.h: x86/gemm_avx512.cpp's tiles, common weight form (gemm_unpack.h)
// and activation GEMM form (signed q, as the AVX2 path's), with 4 weight
// rows per panel and the integer sums of each group by
//   i8mm     smmla: a 2x8 block of two weight rows times 8 values of two
//            tokens per instruction (vmmlaq_s32)
//   dotprod  sdot by lane: 4 values of 4 rows times one activation quad
//            (vdotq_laneq_s32)
//   neon     widening multiplies (vmull_s8) pairwise added (vpadalq_s16)
// The level is read at each call (isa_at_least), so MINFER_CPU caps it.
// Every level makes the same integer sums and the same float operations
// per output, in the same order: the three give the same bits.
// gemm.cpp dispatches here; nothing else calls these.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu::arm {

// Which of the three runs at the current level ("neon smmla", "neon sdot",
// "neon vmull"), or nullptr below the Neon level.
const char* gemm_name();
// Rows one gemm_rows call takes at most (4 panels of 4).
int64_t gemm_tile_rows();
// Per-thread scratch gemm_rows needs for rows of K.
size_t gemm_scratch_bytes(int64_t K);
// As cpu::gemm_rows (gemm.h), with activation rows whose q are signed
// (gemm_pack_act without the ^ 0x80 of the AVX-512 level's Q8_0 rows).
void gemm_rows(tensor::DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes,
               int64_t K, int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride,
               int64_t n_tokens, float* out, int64_t out_stride, void* scratch);

}  // namespace minfer::cpu::arm
