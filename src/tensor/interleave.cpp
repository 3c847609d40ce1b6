#include "tensor/interleave.h"

#include <cstring>

#include "tensor/blocks.h"
#include "util/error.h"

namespace minfer::tensor {

namespace {

// A block field: byte offset in the block, unit size, number of units.
struct Field {
    int offset, unit, count;
};
struct BlockFields {
    int n = 0;
    Field f[4];
};

// The fields of the types the kernels read interleaved (ggml's block
// layouts, blocks.h).
BlockFields fields_of(DType t) {
    switch (t) {
        case DType::Q5_0:  // d | qh (4 bytes) | qs (16 bytes)
            return {3, {{0, 2, 1}, {2, 4, 1}, {6, 4, 4}}};
        case DType::Q4_K:  // d | dmin | scales (12 bytes) | qs (128 bytes)
            return {4, {{0, 2, 1}, {2, 2, 1}, {4, 4, 3}, {16, 4, 32}}};
        default:
            return {};
    }
}

}  // namespace

bool can_interleave(DType t, int64_t K, int64_t M) {
    return fields_of(t).n > 0 && K > 0 && K % traits(t).block_size == 0 && M > 0 &&
           M % kInterleaveRows == 0;
}

void interleave_rows(DType t, const void* src, int64_t K, int64_t M, void* dst) {
    MINFER_ASSERT(can_interleave(t, K, M));
    const BlockFields bf = fields_of(t);
    const size_t bsz = traits(t).type_size, rb = row_size(t, K);
    const int64_t nb = K / traits(t).block_size;
    const auto* in = static_cast<const uint8_t*>(src);
    auto* out = static_cast<uint8_t*>(dst);
    for (int64_t g = 0; g < M / kInterleaveRows; ++g)
        for (int64_t b = 0; b < nb; ++b)
            for (int i = 0; i < bf.n; ++i) {
                const Field& f = bf.f[i];
                for (int k = 0; k < f.count; ++k)
                    for (int64_t l = 0; l < kInterleaveRows; ++l) {
                        const uint8_t* from = in +
                                              static_cast<size_t>(g * kInterleaveRows + l) * rb +
                                              static_cast<size_t>(b) * bsz + f.offset + k * f.unit;
                        std::memcpy(out, from, static_cast<size_t>(f.unit));
                        out += f.unit;
                    }
            }
}

void deinterleave_row(DType t, const void* data, int64_t K, int64_t r, void* row) {
    const BlockFields bf = fields_of(t);
    MINFER_ASSERT(bf.n > 0);
    const size_t bsz = traits(t).type_size, rb = row_size(t, K);
    const int64_t nb = K / traits(t).block_size, g = r / kInterleaveRows, l = r % kInterleaveRows;
    const auto* in =
        static_cast<const uint8_t*>(data) + static_cast<size_t>(g * kInterleaveRows) * rb;
    auto* out = static_cast<uint8_t*>(row);
    for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = in + static_cast<size_t>(b) * bsz * kInterleaveRows;
        for (int i = 0; i < bf.n; ++i) {
            const Field& f = bf.f[i];
            for (int k = 0; k < f.count; ++k) {
                std::memcpy(out + static_cast<size_t>(b) * bsz + f.offset + k * f.unit,
                            blk + static_cast<size_t>(l) * f.unit, static_cast<size_t>(f.unit));
                blk += kInterleaveRows * f.unit;
            }
        }
    }
}

}  // namespace minfer::tensor
