// The CPU side of quantized matmul: activation quantizers (what ggml calls
// quantize_row_q8_0 / q8_1 / q8_K on x86), row dequantizers (GetRows) and
// the dot products of a weight row with an activation row in the weight's
// vec_dot_type — ggml's integer arithmetic: int8 products summed in int32
// per (sub-)block, then scaled by the block scales in float. On x86-64,
// for the types its GEMMs take (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K, Q6_K), the
// portable dots take those GEMMs' float steps, which the group kernels
// share: the scalar level gives a row the bits the AVX2 and AVX-512 levels
// give it there.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu {

// The activation format a weight type's dot product consumes (ggml's
// vec_dot_type on the CPU backend): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for
// Q4_1/Q5_1, Q8_K for the K-quants and IQ4_XS, F16 / BF16 / F32 for those.
tensor::DType act_type(tensor::DType weight);

// Converts n floats (n a multiple of the block size of `act`) into an
// activation row of type act (one of Q8_0, Q8_1, Q8_K, F16, BF16, F32).
void quantize_act_row(tensor::DType act, const float* x, void* y, int64_t n);
// Q8_K quantization of n floats straight into the GEMM form of the
// AVX-512 level (gemm.h): the bytes quantize_act_row then gemm_pack_act
// give there. Only at IsaLevel::Avx512 (x86-64).
void quantize_q8_K_row_vnni_gemm(const float* x, void* out, int64_t n);

// n floats of one row of `type` (any type but I32).
void dequant_row(tensor::DType type, const void* x, float* y, int64_t n);

// dot(weight row of n elements, activation row in act_type(weight)).
using VecDotFn = float (*)(int64_t n, const void* w, const void* a);
// The implementation for a weight type; nullptr for I32 / Q8_1 / Q8_K
// (not weight types).
VecDotFn vec_dot_fn(tensor::DType weight);

// out[l] = dot(row l, activation row) for the 16 rows of one interleaved
// group (tensor/interleave.h) at `group`: one row per vector lane, so block
// scales and high bits are handled once for all 16.
using GroupDotFn = void (*)(int64_t n, const void* group, const void* a, float* out);
// The implementation for an interleaved weight type on this CPU, or nullptr
// (the caller then de-interleaves rows for vec_dot_fn). Each does per row
// the float steps of its level's GEMM on the same groups, so its outputs
// are bitwise the GEMM's (see matmul_batch_invariant).
GroupDotFn group_dot_fn(tensor::DType weight);

// out[t * out_stride + l] = group_dot(n, group, a + t * a_stride)[l] for
// n_tok tokens, bitwise (the same float steps per token), with the group's
// weights loaded once for several tokens: what an expert that a few tokens
// chose multiplies without unpacking a GEMM tile. nullptr where none is
// written (the caller loops over group_dot_fn's).
using GroupDotManyFn = void (*)(int64_t n, const void* group, const void* a, size_t a_stride,
                                int64_t n_tok, float* out, int64_t out_stride);
GroupDotManyFn group_dot_many_fn(tensor::DType weight);
// Up to this many tokens, a matmul (or an expert) on regrouped weights with
// a many-token group kernel takes it instead of the GEMM: it reads the
// regrouped rows as they are, where the GEMM unpacks each tile first, a
// cost a few tokens do not repay. The sums are the GEMM's, so batch
// invariance holds either way.
constexpr int64_t kGroupDotManyMaxTokens = 16;

// Plain f32 dot product with float accumulation in 16 lanes (ggml's
// ggml_vec_dot_f32 sums in float SIMD registers too).
float dot_f32(const float* a, const float* b, int64_t n);

}  // namespace minfer::cpu
