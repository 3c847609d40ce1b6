// Row helpers at the kernel level in force: each level's kernel table
// (kernel_table.h) holds its variant (NEON, AVX2, AVX-512 or plain loops).
#pragma once

#include <cstdint>

namespace minfer::cpu {

// y = silu(a) * b (b null: silu(a) alone). silu(x) = x / (1 + exp(-x)).
void swiglu_row(const float* a, const float* b, float* y, int64_t n);

// A tile of gate and up rows, [n_tokens, width] each and contiguous, into
// out[t][m] = silu(gate[t][m]) * up[t][m] (out rows out_stride apart;
// gate is overwritten). Every level's SwiGLU vector (4, 8 or 16 lanes)
// divides 16, so a tile cut from whole rows at 16-element boundaries gives
// each element the bits swiglu_row over its whole row gives it, and a
// width of whole 16s takes all tokens in one call.
void swiglu_tile(float* gate, const float* up, int64_t n_tokens, int64_t width, float* out,
                 int64_t out_stride);

// sum of x[i] * x[i], each square in float and the sum in double (as ggml's
// rms_norm), in 16 double lanes rather than one chain.
double sum_squares(const float* x, int64_t n);

}  // namespace minfer::cpu
