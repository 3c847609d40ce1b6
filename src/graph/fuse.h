// Fusion: rewrites the builder's plain graph into fused ops, in place.
// Node ids never change; a node that fusion makes unnecessary is left where
// it is with no consumers (and its sources cut), so the allocator gives it
// no buffer and the scheduler skips it — a dead node cannot corrupt memory.
#pragma once

#include "ir/ir.h"
#include "ir/pass_options.h"

namespace minfer::graph {

struct FuseStats {
    int qkv = 0;   // layers whose Q/K/V were fused
    int ffn = 0;   // SwiGLU nodes made
    int dead = 0;  // nodes left without consumers
};

FuseStats fuse(Graph& g, const FuseOptions& opt);

// Cuts the sources of every node that no output depends on; returns how many
// nodes are dead. Inputs are kept (they are pinned and host-filled).
int eliminate_dead(Graph& g);

}  // namespace minfer::graph
