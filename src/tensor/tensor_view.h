// A non-owning view of a tensor's bytes: a weight inside the mapped GGUF file
// or a tensor a test made. ggml shape order: ne[0] is the row length.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "tensor/dtype.h"
#include "util/error.h"

namespace minfer::tensor {

struct TensorView {
    std::string name;
    DType type = DType::F32;
    std::array<int64_t, 4> ne{1, 1, 1, 1};  // [ne0 = row length, rows, ...]
    const void* data = nullptr;             // row-major, rows of row_size(type, ne[0]) bytes
    size_t nbytes = 0;
    // Rows16: groups of 16 rows interleaved block by block (tensor/interleave.h),
    // read by the matmul kernels only; row() is then not a row.
    enum class Layout : uint8_t { Rows, Rows16 } layout = Layout::Rows;

    int64_t n_elements() const { return ne[0] * ne[1] * ne[2] * ne[3]; }
    int64_t n_rows() const { return ne[1] * ne[2] * ne[3]; }
    size_t row_bytes() const { return row_size(type, ne[0]); }
    const uint8_t* row(int64_t r) const {
        MINFER_ASSERT(layout == Layout::Rows);
        return static_cast<const uint8_t*>(data) + static_cast<size_t>(r) * row_bytes();
    }
};

}  // namespace minfer::tensor
