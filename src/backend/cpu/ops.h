// The individual CPU kernels behind run_node, on plain pointers, exposed so
// tests and benchmarks can call them directly. Rows are contiguous; strides
// are in elements. Every function splits its work over the pool's threads
// and gives the same bits for any thread count.
#pragma once

#include <cstdint>

#include "tensor/tensor_view.h"
#include "util/thread_pool.h"

namespace minfer::cpu {

// One weight of a (possibly fused) matmul and where its outputs go: out row
// t, columns [out_col, out_col + w->ne[1]).
struct MatMulPart {
    const tensor::TensorView* w = nullptr;  // [K, M]
    int64_t out_col = 0;
};

// Whether matmul gives a token's outputs of weight w bitwise the same in a
// batch of any size at the current kernel level, without its batch_invariant
// argument: when w's type has no GEMM (every count takes the
// dot products), or when w is regrouped (tensor/interleave.h) and its type
// has a group kernel for the decode, which does per row the float steps of
// the GEMM (x86-64: Q8_0, Q5_0, Q4_K, Q6_K at Avx2 and at Avx512, Q5_0
// there with BITALG).
bool matmul_batch_invariant(const tensor::TensorView& w);

// Whether matmul takes the GEMM path for n_tokens tokens of w (else the dot
// products): the one rule for the dense matmul and the experts' MatMulId.
bool matmul_takes_gemm(const tensor::TensorView& w, int64_t n_tokens, bool batch_invariant);

// out[t][out_col + m] = dot(w row m, x row t) for every part, x rows
// [K, n_tokens] with stride x_stride; out rows with stride out_stride.
// Activations are converted once to each weight's vec_dot type.
// batch_invariant: every token count takes the GEMM path where the weight
// type has one (decode too), so a token's result does not depend on how many
// tokens share its pass (the one-token kernels sum in another order). Off by
// default: one-token decode is faster without it.
void matmul(const MatMulPart* parts, int n_parts, const float* x, int64_t x_stride,
            int64_t n_tokens, float* out, int64_t out_stride, ThreadPool& pool,
            bool batch_invariant = false);

// out[t][m] = silu(dot(gate row m, x row t)) * dot(up row m, x row t), gate
// and up [K, M]: the two matmuls as matmul computes them (bitwise), and
// swiglu_row over each whole output row, without either matmul's output
// leaving the cache of the thread that made it.
void matmul_swiglu(const tensor::TensorView& gate, const tensor::TensorView& up, const float* x,
                   int64_t x_stride, int64_t n_tokens, float* out, int64_t out_stride,
                   ThreadPool& pool, bool batch_invariant = false);

// ggml_rms_norm of one row (sum of squares in double), times w if non-null.
void rms_norm_row(const float* x, const float* w, float* y, int64_t n, float eps);

// ggml_vec_soft_max_f32 of one row: exp in float, the sum in double (y may be x).
void softmax_row(const float* x, float* y, int64_t n);

// The NEOX RoPE of one token's heads (n_heads heads of head_dim, contiguous)
// with the cos/sin table of its position (see rope_table).
void rope_table(int32_t pos, int64_t head_dim, float freq_base, float* cs /*[head_dim]*/);
void rope_row(float* x, int64_t n_heads, int64_t head_dim, const float* cs);

}  // namespace minfer::cpu
