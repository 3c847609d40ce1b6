#include "graph/assign.h"

#include "util/error.h"

namespace minfer::graph {

void assign_backends(Graph& g, std::span<backend::Backend* const> backends, const Placement& pl) {
    MINFER_ASSERT(!backends.empty());
    const bool use_second = pl.end_layer > pl.first_layer && pl.backend > 0 &&
                            static_cast<size_t>(pl.backend) < backends.size();
    for (auto& n : g.nodes) {
        n.backend = 0;
        if (!use_second || n.op == Op::Input) continue;
        const int32_t l = n.meta.layer;
        if (l >= pl.first_layer && l < pl.end_layer &&
            backends[static_cast<size_t>(pl.backend)]->supports_op(n))
            n.backend = pl.backend;
    }
}

}  // namespace minfer::graph
