// The layout of a MoeGroup node's I32 output: a pass's expert slots (slot
// t * k + j = token t's j-th chosen expert) grouped by expert, so that each
// expert's rows are one contiguous run that its matmul takes at once.
//   [0, n_expert]                          offsets: expert e's run is
//                                          [offset[e], offset[e + 1])
//   [n_expert + 1, + slots)                slot at each grouped position
//   [n_expert + 1 + slots, + slots)        grouped position of each slot
// Within an expert the slots keep token order, so the grouping of one
// token's rows never depends on which tokens share the pass beyond their
// count before it (and no row's sums depend on it at all).
#pragma once

#include <cstdint>

namespace minfer::graph {

inline int64_t moe_group_size(int64_t n_expert, int64_t n_slots) {
    return n_expert + 1 + 2 * n_slots;
}

struct MoeGroupView {
    const int32_t* offset;    // [n_expert + 1]
    const int32_t* slot_at;   // [n_slots] grouped position -> slot
    const int32_t* position;  // [n_slots] slot -> grouped position
    MoeGroupView(const int32_t* data, int64_t n_expert, int64_t n_slots)
        : offset(data), slot_at(data + n_expert + 1), position(data + n_expert + 1 + n_slots) {}
};

}  // namespace minfer::graph
