// Row helpers at the kernel level in force: each level's kernel table
// (kernel_table.h) holds its variant (NEON, AVX2, AVX-512 or plain loops).
#pragma once

#include <cstdint>

namespace minfer::cpu {

// y = silu(a) * b (b null: silu(a) alone). silu(x) = x / (1 + exp(-x)).
void swiglu_row(const float* a, const float* b, float* y, int64_t n);

// sum of x[i] * x[i], each square in float and the sum in double (as ggml's
// rms_norm), in 16 double lanes rather than one chain.
double sum_squares(const float* x, int64_t n);

}  // namespace minfer::cpu
