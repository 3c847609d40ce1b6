// Element-wise rows with AVX-512 where the CPU has it, else plain loops:
// y = silu(a) * b (b null: silu(a) alone). silu(x) = x / (1 + exp(-x)).
#pragma once

#include <cstdint>

namespace minfer::cpu {

void swiglu_row(const float* a, const float* b, float* y, int64_t n);

}  // namespace minfer::cpu
