// The options of a pass that the runtime's public options carry and the
// graph stage acts on: how fusion rewrites the graph and how the allocator
// places it. They live below the graph stage so that the runtime's public
// headers (and so the server) need not see graph/.
#pragma once

namespace minfer::graph {

struct FuseOptions {
    bool qkv = true;  // FusedQKV + QkvBiasRopeStore (MINFER_NO_FUSE_QKV=1 turns it off)
    bool ffn = true;  // SwiGLU (MINFER_NO_FUSE_FFN=1 turns it off)
};

// Reads MINFER_NO_FUSE_QKV / MINFER_NO_FUSE_FFN.
FuseOptions fuse_options_from_env();

// How a plan places the live nodes of a graph (graph/alloc.h).
//  - Classes (the design's §2.3): one pool buffer per size class, recycled
//    through a per-plan free list along the build-order sweep.
//  - Arena: every node gets an offset inside the backend's shared
//    activation arena, placed greedy-by-size (largest first, lowest offset
//    that collides in time with no placed node) — TFLite's arena planner.
//    Gets within a few percent of the lower bound on transformer graphs.
enum class Planner { Arena, Classes };
// MINFER_PLANNER=classes | arena (default: arena). Throws minfer::Error on
// another value.
Planner planner_from_env();
const char* planner_name(Planner p);

}  // namespace minfer::graph
