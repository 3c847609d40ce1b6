// Reference (scalar) quantization and dequantization of every tensor type,
// one row at a time. These define the numbers; fast kernels are tested
// against them. n must be a multiple of the type's block size.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::tensor {

// dst gets n floats. Works for every DType except I32.
void dequantize_row(DType type, const void* src, float* dst, int64_t n);

// dst gets row_size(type, n) bytes. Mirrors ggml's reference quantizers
// (quantize_row_*_ref, and for the K-quants the same search llama.cpp's
// quantizer uses without an importance matrix), so that minfer's files
// carry the same error as llama.cpp's.
void quantize_row(DType type, const float* src, void* dst, int64_t n);

// The activation format a weight type's dot product uses on the CPU
// (Q8_0 for the 32-blocks, Q8_K for the 256-blocks, F32 for plain types
// in the reference path) — what llama.cpp calls vec_dot_type.
DType vec_dot_type(DType weight_type);

}  // namespace minfer::tensor
