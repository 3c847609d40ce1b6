#include "tensor/interleave.h"

#include <cstring>
#include <vector>

#include "tensor/blocks.h"
#include "util/error.h"

namespace minfer::tensor {

namespace {

// One unit of a block: its byte offset in the GGUF block, its size (2 or 4
// bytes), and whether its bytes are stored ^ 0x80 (int8 quants made
// unsigned, the operand vpdpbusd takes unsigned). The interleaved block
// stores unit after unit, each as 16 rows side by side, in the order the
// kernel reads them, so it streams through memory front to back.
struct Unit {
    int offset, size;
    bool flip;
};

void add(std::vector<Unit>& u, int offset, int size, int count, bool flip = false) {
    for (int k = 0; k < count; ++k) u.push_back({offset + k * size, size, flip});
}

std::vector<Unit> make_units(DType t) {
    std::vector<Unit> u;
    switch (t) {
        case DType::Q5_0:  // d | qh (4 bytes) | qs (16 bytes)
            add(u, 0, 2, 1);
            add(u, 2, 4, 1);
            add(u, 6, 4, 4);
            break;
        case DType::Q8_0:  // d | qs (32 bytes, stored ^ 0x80)
            add(u, 0, 2, 1);
            add(u, 2, 4, 8, true);
            break;
        case DType::Q4_K:  // d | dmin | scales (12 bytes) | qs (128 bytes)
            add(u, 0, 2, 1);
            add(u, 2, 2, 1);
            add(u, 4, 4, 3);
            add(u, 16, 4, 32);
            break;
        case DType::Q6_K:
            // ql (128 bytes) | qh (64) | scales (16) | d: for half h and quad
            // k, the kernel takes ql dwords 16h + k and 16h + 8 + k with qh
            // dword 8h + k; then the scales, then d.
            for (int h = 0; h < 2; ++h)
                for (int k = 0; k < 8; ++k) {
                    add(u, 64 * h + 4 * k, 4, 1);
                    add(u, 64 * h + 32 + 4 * k, 4, 1);
                    add(u, 128 + 32 * h + 4 * k, 4, 1);
                }
            add(u, 192, 4, 4);
            add(u, 208, 2, 1);
            break;
        default:
            break;
    }
    return u;
}

const std::vector<Unit>& units_of(DType t) {
    static const std::vector<Unit> q5_0 = make_units(DType::Q5_0), q8_0 = make_units(DType::Q8_0),
                                   q4_k = make_units(DType::Q4_K), q6_k = make_units(DType::Q6_K),
                                   none;
    switch (t) {
        case DType::Q5_0:
            return q5_0;
        case DType::Q8_0:
            return q8_0;
        case DType::Q4_K:
            return q4_k;
        case DType::Q6_K:
            return q6_k;
        default:
            return none;
    }
}

// Unit u of n rows: from `from` in steps of from_step bytes to `to` in
// steps of to_step (flipping its bytes where u says so). The size and flip
// tests stay out of the row loop: regrouping runs over every weight at load.
inline void copy_units(uint8_t* to, size_t to_step, const uint8_t* from, size_t from_step,
                       int64_t n, const Unit& u) {
    if (u.size == 4) {
        const uint32_t x = u.flip ? 0x80808080u : 0u;
        for (int64_t l = 0; l < n; ++l, to += to_step, from += from_step) {
            uint32_t v;
            std::memcpy(&v, from, 4);
            v ^= x;
            std::memcpy(to, &v, 4);
        }
    } else {
        for (int64_t l = 0; l < n; ++l, to += to_step, from += from_step) std::memcpy(to, from, 2);
    }
}

}  // namespace

bool can_interleave(DType t, int64_t K, int64_t M) {
    return !units_of(t).empty() && K > 0 && K % traits(t).block_size == 0 && M > 0 &&
           M % kInterleaveRows == 0;
}

void interleave_rows(DType t, const void* src, int64_t K, int64_t M, void* dst) {
    MINFER_ASSERT(can_interleave(t, K, M));
    const std::vector<Unit>& units = units_of(t);
    const size_t bsz = traits(t).type_size, rb = row_size(t, K);
    const int64_t nb = K / traits(t).block_size, n_groups = M / kInterleaveRows;
    const size_t group_bytes = kInterleaveRows * rb;
    for (int64_t g = 0; g < n_groups; ++g) {
        const uint8_t* rows =
            static_cast<const uint8_t*>(src) + static_cast<size_t>(g) * group_bytes;
        uint8_t* out = static_cast<uint8_t*>(dst) + static_cast<size_t>(g) * group_bytes;
        for (int64_t b = 0; b < nb; ++b) {
            const uint8_t* blk = rows + static_cast<size_t>(b) * bsz;
            for (const Unit& u : units) {
                copy_units(out, static_cast<size_t>(u.size), blk + u.offset, rb, kInterleaveRows,
                           u);
                out += kInterleaveRows * u.size;
            }
        }
    }
}

void deinterleave_row(DType t, const void* data, int64_t K, int64_t r, void* row) {
    const std::vector<Unit>& units = units_of(t);
    MINFER_ASSERT(!units.empty());
    const size_t bsz = traits(t).type_size, rb = row_size(t, K);
    const int64_t nb = K / traits(t).block_size, g = r / kInterleaveRows, l = r % kInterleaveRows;
    const uint8_t* in =
        static_cast<const uint8_t*>(data) + static_cast<size_t>(g * kInterleaveRows) * rb;
    auto* out = static_cast<uint8_t*>(row);
    for (int64_t b = 0; b < nb; ++b)
        for (const Unit& u : units) {
            copy_units(out + static_cast<size_t>(b) * bsz + u.offset, 0,
                       in + static_cast<size_t>(l) * u.size, 0, 1, u);
            in += kInterleaveRows * u.size;
        }
}

}  // namespace minfer::tensor
