// ARM64 kernels (NEON, plus sdot with the dot-product extension and smmla
// with i8mm). Each entry point returns the variant for the current ISA level
// (cpu::isa_at_least) or nullptr/false, so the generic dispatch points
// (quant_dot.cpp, vec_ops.cpp) fall back to the portable code.
//
// Arithmetic contract: the integer sums per (sub-)block are exact and the
// float accumulation follows the portable kernels' order, so the NEON dot
// products return the portable kernels' results bit for bit.
#pragma once

#include <cstdint>

#include "backend/cpu/quant_dot.h"
#include "tensor/dtype.h"

namespace minfer::cpu::arm {

// The NEON / dotprod vec_dot of a weight type at the current level, or
// nullptr (no ARM path for that type, or the level is capped at scalar).
VecDotFn vec_dot_neon(tensor::DType weight);

// vec_ops with NEON at the current level; false when the caller must run
// its portable loop.
bool swiglu_row_neon(const float* a, const float* b, float* y, int64_t n);
bool sum_squares_neon(const float* x, int64_t n, double* out);

}  // namespace minfer::cpu::arm
