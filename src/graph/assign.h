// Backend assignment: every node gets the backend that runs it. Whole layers
// move together, so a layer's KV regions live on one backend.
#pragma once

#include <span>

#include "ir/backend.h"
#include "ir/ir.h"

namespace minfer::graph {

struct Placement {
    // Layers [first_layer, end_layer) run on `backend`; the rest on backend 0.
    int32_t first_layer = 0;
    int32_t end_layer = 0;
    BackendId backend = 1;
};

// A node whose backend does not support its op falls back to backend 0.
void assign_backends(Graph& g, std::span<backend::Backend* const> backends,
                     const Placement& placement);

}  // namespace minfer::graph
