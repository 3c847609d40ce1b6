// Prefill matmul: weight rows are unpacked once per tile into a common form
// (int8 values, a float scale per 16, optionally a float min per 16;
// gemm_unpack.h) and multiplied with many tokens, so each weight byte
// loaded serves every token of the pass. This is the door the matmul and
// MoE kernels call; gemm.cpp sends each call to the current level's GEMM:
// x86/gemm_avx512.cpp (vpdpbusd), x86/gemm_avx2.cpp (vpmaddubsw or
// AVX-VNNI) or arm/gemm_neon.cpp (smmla, sdot, plain NEON). The integer sums per (sub-)block
// equal those of the vec_dot path (ggml's); only the order of the float
// accumulation differs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu {

// Which GEMM runs at the current level (isa.h), for reports: "avx512
// vpdpbusd", "avx2 vpmaddubsw", "neon smmla" (i8mm), "neon sdot" (dotprod),
// "neon vmull" (neon); nullptr at the scalar level (prompts take the dot
// products).
const char* gemm_name();

// True when a GEMM runs at the current level (gemm_name() is not null) and
// the weight type has an unpacker (Q4_0, Q5_0, Q8_0 with Q8_0 activations;
// Q4_K, Q5_K, Q6_K with Q8_K) and K is a multiple of 64.
bool gemm_supported(tensor::DType weight, int64_t K);

// Bytes of one token's activation row in the GEMM form for K elements of
// activation type act (Q8_0 or Q8_K).
size_t gemm_act_row_bytes(tensor::DType act, int64_t K);
// Converts one activation row (act_type(weight) blocks, as quantize_act_row
// made it) into the GEMM form:
// - q [K]: the int8 q; at the AVX-512 level, Q8_0 rows store q ^ 0x80
//   (vpdpbusd multiplies unsigned by signed, and Q8_0 / Q4_0 / Q5_0
//   weights are signed; the K-quants' are not, so Q8_K rows stay signed);
// - float d per 16 [K/16];
// - Q8_K only (Q8_0 rows end before it), the sums of q the weights'
//   offsets and mins take. On x86-64: the sum per 32 as int16 [K/32]
//   (Q4_K / Q5_K mins, multiplied in integers once per super-block), then
//   -32 times the sum per 16 as int32 [K/16] (the AVX-512 Q6_K kernel
//   starts each group's sum there). On ARM64: the sum per 32 as float
//   [K/32].
void gemm_pack_act(tensor::DType act, const void* row, int64_t K, void* out);
// One float row of K straight into the GEMM form: the bytes of
// quantize_act_row then gemm_pack_act. tmp holds one activation row of act
// (tensor::row_size(act, K) bytes) for the levels that take those two
// steps; the AVX-512 level quantizes Q8_K without it.
void gemm_quantize_act(tensor::DType act, const float* x, int64_t K, void* out, void* tmp);

// Most rows one gemm_rows call takes (the micro-tile's rows).
int64_t gemm_tile_rows();
// Bytes of per-thread scratch gemm_rows needs for rows of K.
size_t gemm_scratch_bytes(int64_t K);
// out[t * out_stride + r - r0] = dot(weight row r, token t) for rows
// [r0, r1) (at most gemm_tile_rows()) of w (interleaved: tensor/interleave.h) (row stride
// w_row_bytes) and tokens [0, n_tokens), whose GEMM-form rows are act + t * act_stride.
void gemm_rows(tensor::DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes,
               int64_t K, int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride,
               int64_t n_tokens, float* out, int64_t out_stride, void* scratch);

}  // namespace minfer::cpu
