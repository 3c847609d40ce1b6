// The allocator stage: decides where every node's output lives (liveness over
// BUILD order, buffer reuse by size class, in-place aliasing), owns the
// persistent KV regions, fills the host inputs, and mints split-boundary
// staging buffers. Mirrors llama.cpp's ggml_gallocr: buffers are shared
// between nodes whose live ranges do not overlap. Sizes are in BYTES.
//
// The allocator owns no memory: the pools belong to the backends, and the
// allocator holds references to them (index = BackendId). What it owns is
// the bookkeeping — one allocation plan per "slot" (the graph cache keeps
// a prefill and a decode graph alive at once, slot = kind) plus the KV
// regions shared by every plan.
//
// With the arena planner every plan of every slot lives in ONE activation
// arena per backend, shared: plans of different slots never run at the same
// time (a pass fills its inputs, executes, and its outputs are read before
// the next pass starts), so they may overlap in bytes. The arena grows only
// when a plan needs more than it holds — the old arena is released to the
// system first, then one of exactly the new need is made and every stored
// plan is pointed at it (their offsets still fit: it only grew) — and it
// never shrinks. So the activation bytes held are the largest plan planned
// so far, and once the largest pass has been planned nothing is allocated
// again, whatever mix of prompt lengths and batch sizes follows.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ir/backend.h"
#include "ir/ir.h"
#include "ir/pass_options.h"

namespace minfer::graph {

using backend::BufferId;
using backend::BufRef;
using backend::KvPair;

// Size class of a request: powers of two up to 16 KiB, then multiples of
// 16 KiB. Every buffer of a class has the same length, so a rebuild with a
// slightly different n_tokens finds the previous graph's buffers (the pool
// recycles by exact length only).
constexpr size_t kSizeClassStep = 16 * 1024;
size_t class_size(size_t bytes);

// Arena offsets are multiples of this (SIMD rows, cache lines).
constexpr size_t kArenaAlign = 64;

// A region that is never freed and never recycled ("kv.<layer>.k" / ".v").
struct PersistentBuf {
    std::string name;
    BufRef ref;         // the whole region: offset 0, len = its bytes
    bool is_k = false;  // a K region (cells element-major in blocks, ir/kv_layout.h), else V
};

// Figures of one allocated graph.
struct PlanStats {
    size_t n_nodes = 0;
    size_t n_live = 0;           // nodes with an output buffer
    size_t n_buffers = 0;        // distinct pool buffers this plan uses (KV regions excluded;
                                 // arena: the shared arenas it is placed in)
    size_t naive_bytes = 0;      // every live node its own exact-size buffer (KV nodes excluded)
    size_t pool_bytes = 0;       // bytes this plan needs (its high-water mark; classes: the
                                 // buffers it holds, arena: its extent in the shared arenas)
    size_t dead_nodes = 0;       // no consumers, not an output: no buffer
    size_t aliased_nodes = 0;    // in place on their src[0]'s buffer
    size_t staging_buffers = 0;  // split-boundary staging minted so far for this graph
    Planner planner = Planner::Classes;       // the planner that made the plan
    std::vector<size_t> buffers_per_backend;  // [n_backends] of n_buffers
};

// Process-lifetime counters.
struct AllocCounters {
    size_t graphs_allocated = 0;
    size_t staging_created = 0;  // allocate_fresh calls for staging
    size_t kv_regions = 0;
    size_t kv_bytes = 0;
    size_t dead_nodes = 0;          // summed over all allocated graphs
    size_t aliased_nodes = 0;       // summed over all allocated graphs
    size_t largest_plan_bytes = 0;  // max pool_bytes of any plan so far
    size_t arena_growths = 0;       // times a shared arena was (re)made larger
};

class GraphAllocator {
  public:
    // Without a planner argument: the design's size classes (the allocator's
    // own tests are written against them). The runtime always passes its
    // options' planner, whose default is planner_from_env() (ir/pass_options.h).
    explicit GraphAllocator(std::vector<backend::Backend*> backends,
                            Planner planner = Planner::Classes);
    ~GraphAllocator();  // returns every buffer it holds (plans, staging, KV) to the pools
    GraphAllocator(const GraphAllocator&) = delete;
    GraphAllocator& operator=(const GraphAllocator&) = delete;

    // Plan `graph` into `slot` and make that slot current: tears down the
    // slot's previous plan first (its buffers and staging back to the free
    // lists; KV regions and other slots untouched), then the §2.3 walk.
    // Throws minfer::Error when the graph has a cycle (from topo_order) or a
    // node's layer/size is unusable. Returns the new plan's figures.
    const PlanStats& alloc_graph(const Graph& graph, int slot = 0);
    // Make an existing plan current again (no allocation).
    void use_plan(int slot);
    bool has_plan(int slot) const;
    // Give a slot's buffers back to the pools (the graph is gone).
    void release_plan(int slot);
    int current_slot() const { return current_; }

    // --- the current plan --------------------------------------------------
    // Where node id's output lives; nullopt for dead nodes.
    std::optional<BufRef> node_buffer(NodeId id) const;
    // True when id writes in place into its src[0]'s buffer.
    bool is_aliased(NodeId id) const;
    const PlanStats& plan_stats() const;
    // The pool buffers the current plan holds (each whole: offset 0, len =
    // its bytes), and its split-boundary staging buffers so far.
    std::vector<BufRef> plan_buffers() const;
    std::vector<std::pair<NodeId, BufRef>> plan_staging() const;
    Planner planner() const { return planner_; }
    // Copy host data into the input named `name`; throws minfer::Error naming
    // the input when there is none or the data does not fill its window.
    // `graph` must be the one the current plan was made for (same uid): a bug
    // otherwise (assertion).
    void fill_input(const Graph& graph, std::string_view name, std::span<const int32_t> data);
    // Staging buffer on backend dst for node id's output (a copy across a
    // split boundary). Minted with allocate_fresh on first request — never
    // from the free list, where buffers still referenced by this graph's
    // node_to_buf may sit — and reused by every later execute of the graph.
    BufRef cross_staging(NodeId id, BackendId dst);

    // --- shared by every plan ----------------------------------------------
    std::optional<KvPair> kv_pair(int32_t layer) const;
    const std::vector<PersistentBuf>& persistent() const { return persistent_; }
    const AllocCounters& counters() const { return counters_; }
    // Activation bytes held right now over every backend: the shared arenas
    // (arena planner), every plan's own buffers (classes planner) and split
    // staging. KV regions excluded.
    size_t activation_bytes_held() const;
    // The shared arena's size on backend b (0: none yet / classes planner).
    size_t arena_bytes(BackendId b) const;
    size_t n_backends() const { return backends_.size(); }
    backend::Backend& backend(BackendId id) const;

  private:
    struct Plan {
        uint64_t graph_uid = 0;  // Graph::uid of the graph planned
        size_t n_nodes = 0;
        std::vector<std::optional<BufRef>> node_to_buf;        // [n_nodes]
        std::vector<bool> aliased;                             // [n_nodes]
        std::vector<std::pair<BackendId, BufferId>> owned;     // classes: every buffer of the plan
        std::vector<size_t> arena_need;                        // arena: [n_backends] extent used
        std::map<std::pair<NodeId, BackendId>, BufRef> cross;  // staging
        PlanStats stats;
    };

    Plan& plan();
    const Plan& plan() const;
    void free_plan(Plan& p);
    KvPair ensure_kv(int32_t layer, BackendId b, size_t bytes, const Node& node);
    void plan_classes(const Graph& graph, Plan& p, std::vector<size_t>& last_use,
                      const std::vector<bool>& pinned, const std::vector<int32_t>& n_consumers);
    void plan_arena(const Graph& graph, Plan& p, std::vector<size_t>& last_use,
                    const std::vector<bool>& pinned, const std::vector<int32_t>& n_consumers);
    // The KV arm shared by both planners: makes the layer's regions; true
    // when the node's buffer is the K region (a KvStore) and it is placed.
    bool place_kv(const Graph& graph, NodeId id, Plan& p);
    // The shared arena of backend b, grown to at least `need` bytes (stored
    // plans re-pointed at it); returns its id.
    BufferId ensure_arena(BackendId b, size_t need);

    std::vector<backend::Backend*> backends_;
    Planner planner_;
    std::map<int, Plan> plans_;
    int current_ = -1;
    std::map<int32_t, KvPair> kv_;
    std::vector<PersistentBuf> persistent_;
    struct Arena {
        BufferId id = 0;
        size_t bytes = 0;  // 0: not made yet
    };
    std::vector<Arena> arenas_;  // [n_backends]: the shared activation arenas
    AllocCounters counters_;
};

// Backend a node runs on (kNoBackend is treated as backend 0).
inline BackendId node_backend(const Node& n) {
    return n.backend == kNoBackend ? 0 : n.backend;
}

}  // namespace minfer::graph
