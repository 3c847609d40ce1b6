// ARM64 kernels (NEON, plus sdot with the dot-product extension and smmla
// with i8mm). The kernel table of each ARM level (kernel_table.cpp) takes
// them from here; a type without a NEON kernel keeps the portable one.
//
// Arithmetic contract: the integer sums per (sub-)block are exact and the
// float accumulation follows the portable kernels' order, so the NEON dot
// products return the portable kernels' results bit for bit.
#pragma once

#include <cstdint>

#include "backend/cpu/isa.h"
#include "backend/cpu/quant_dot.h"
#include "tensor/dtype.h"

namespace minfer::cpu::arm {

// The NEON / dotprod vec_dot of a weight type at `level`, or nullptr (no
// ARM path for that type, or `level` is not an ARM SIMD level).
VecDotFn vec_dot_neon(IsaLevel level, tensor::DType weight);

// vec_ops.h's row helpers on NEON (the ARMv8-A baseline: every ARM level).
void swiglu_row_neon(const float* a, const float* b, float* y, int64_t n);
double sum_squares_neon(const float* x, int64_t n);

}  // namespace minfer::cpu::arm
