#include "graph/alloc.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "util/error.h"
#include "util/out_of_memory.h"

namespace minfer::graph {

size_t class_size(size_t bytes) {
    if (bytes <= kSizeClassStep) {
        size_t c = 1;
        while (c < bytes) c <<= 1;
        return bytes == 0 ? 0 : c;
    }
    return (bytes + kSizeClassStep - 1) / kSizeClassStep * kSizeClassStep;
}

namespace {

std::string node_label(const Graph& g, NodeId id) {
    return "node " + std::to_string(id) + " ('" + g.node(id).name + "', " +
           std::string(op_name(g.node(id).op)) + ")";
}

// Ops that write the KV regions: they run even when nothing consumes their
// output, so they are never "dead" — unless fusion cut them off (a store
// with no sources, replaced by the epilogue, has nothing to write).
bool has_side_effect(const Node& node) {
    return (node.op == Op::KvStore || node.op == Op::QkvBiasRopeStore) && !node.src.empty();
}

bool in_place_capable(Op op) {
    return op == Op::Silu || op == Op::Rope || op == Op::QkvBiasRopeStore;
}

bool touches_kv(Op op) {
    return op == Op::KvStore || op == Op::Attn || op == Op::FusedQKV || op == Op::QkvBiasRopeStore;
}

// Bytes of one KV region for a node that only names the layer through its
// meta: [n_head_kv * head_dim, n_ctx] of kv_type.
size_t meta_kv_bytes(const Graph& g, NodeId id) {
    const NodeMeta& m = g.node(id).meta;
    if (m.n_head_kv <= 0 || m.head_dim <= 0 || m.n_ctx <= 0)
        throw Error("alloc: " + node_label(g, id) +
                    " needs meta n_head_kv, head_dim and n_ctx to size its layer's KV regions");
    return tensor::row_size(m.kv_type, static_cast<int64_t>(m.n_head_kv) * m.head_dim) *
           static_cast<size_t>(m.n_ctx);
}

}  // namespace

GraphAllocator::GraphAllocator(std::vector<backend::Backend*> backends, Planner planner)
    : backends_(std::move(backends)), planner_(planner), arenas_(backends_.size()) {
    MINFER_ASSERT_MSG(!backends_.empty(), "the allocator needs at least one backend");
    for (auto* b : backends_) MINFER_ASSERT(b != nullptr);
}

GraphAllocator::~GraphAllocator() {
    for (auto& [slot, p] : plans_) free_plan(p);
    for (size_t b = 0; b < arenas_.size(); ++b)
        if (arenas_[b].bytes) backends_[b]->release(arenas_[b].id);
    for (const auto& pb : persistent_) backends_[pb.ref.backend]->free(pb.ref.id);
}

BufferId GraphAllocator::ensure_arena(BackendId b, size_t need) {
    Arena& a = arenas_[static_cast<size_t>(b)];
    if (a.bytes >= need) return a.id;
    // Release before making the larger one, so the two never coexist (the
    // peak is the new arena alone). Nothing in the old one is needed: no
    // pass is running, and a pass's outputs were read before this rebuild.
    const bool had = a.bytes != 0;
    const BufferId old = a.id;
    if (had) backend(b).release(old);
    a.bytes = 0;
    try {
        a.id = backend(b).allocate_fresh(need);
    } catch (const OutOfMemory& e) {
        // Stored plans still name the released arena: drop them all, so no
        // later use_plan can reach it (the cache rebuilds them).
        for (auto& [slot, p] : plans_) free_plan(p);
        plans_.clear();
        current_ = -1;
        throw OutOfMemory(e.bytes(), "the activations of one forward pass (the " +
                                         std::string(backend(b).name()) + " arena)");
    }
    a.bytes = need;
    ++counters_.arena_growths;
    if (had)
        for (auto& [slot, p] : plans_)
            for (auto& ref : p.node_to_buf)
                if (ref && ref->backend == b && ref->id == old) ref->id = a.id;
    return a.id;
}

size_t GraphAllocator::arena_bytes(BackendId b) const {
    MINFER_ASSERT(b >= 0 && static_cast<size_t>(b) < arenas_.size());
    return arenas_[static_cast<size_t>(b)].bytes;
}

size_t GraphAllocator::activation_bytes_held() const {
    size_t n = 0;
    for (const Arena& a : arenas_) n += a.bytes;
    for (const auto& [slot, p] : plans_) {
        for (auto [b, id] : p.owned) n += backend(b).buffer_bytes(id);
        for (const auto& [key, ref] : p.cross) n += backend(ref.backend).buffer_bytes(ref.id);
    }
    return n;
}

backend::Backend& GraphAllocator::backend(BackendId id) const {
    MINFER_ASSERT(id >= 0 && static_cast<size_t>(id) < backends_.size());
    return *backends_[static_cast<size_t>(id)];
}

GraphAllocator::Plan& GraphAllocator::plan() {
    auto it = plans_.find(current_);
    MINFER_ASSERT_MSG(it != plans_.end(), "no graph allocated");
    return it->second;
}
const GraphAllocator::Plan& GraphAllocator::plan() const {
    auto it = plans_.find(current_);
    MINFER_ASSERT_MSG(it != plans_.end(), "no graph allocated");
    return it->second;
}

void GraphAllocator::free_plan(Plan& p) {
    for (auto [b, id] : p.owned) backend(b).free(id);
    // Staging is minted fresh for every graph (never from the free list), so
    // a freed staging buffer could only pile up: its memory goes back now.
    for (auto& [key, ref] : p.cross) backend(ref.backend).release(ref.id);
    p.owned.clear();
    p.cross.clear();
}

void GraphAllocator::release_plan(int slot) {
    auto it = plans_.find(slot);
    if (it == plans_.end()) return;
    free_plan(it->second);
    plans_.erase(it);
    if (current_ == slot) current_ = -1;
}

bool GraphAllocator::has_plan(int slot) const {
    return plans_.count(slot) != 0;
}

void GraphAllocator::use_plan(int slot) {
    MINFER_ASSERT_MSG(plans_.count(slot) != 0, "use_plan: slot was never allocated");
    current_ = slot;
}

KvPair GraphAllocator::ensure_kv(int32_t layer, BackendId b, size_t bytes, const Node& node) {
    if (layer < 0)
        throw Error("alloc: node '" + node.name + "' (" + std::string(op_name(node.op)) +
                    ") has no layer (meta.layer = " + std::to_string(layer) + ")");
    if (auto it = kv_.find(layer); it != kv_.end()) {
        // Sized on first use only: prefill and decode must agree on n_ctx,
        // or a later kernel would write past the region.
        if (it->second.k.backend != b)
            throw Error("alloc: layer " + std::to_string(layer) + "'s KV regions live on backend " +
                        std::to_string(it->second.k.backend) + " but node '" + node.name +
                        "' runs on backend " + std::to_string(b));
        if (bytes > it->second.k.len)
            throw Error("alloc: node '" + node.name + "' needs KV regions of " +
                        std::to_string(bytes) + " bytes but layer " + std::to_string(layer) +
                        "'s were created with " + std::to_string(it->second.k.len) +
                        " (n_ctx changed between graphs?)");
        return it->second;
    }
    auto& be = backend(b);
    KvPair pair;
    try {
        pair.k = BufRef{b, be.allocate(bytes), 0, bytes};
        pair.v = BufRef{b, be.allocate(bytes), 0, bytes};
    } catch (const OutOfMemory& e) {
        throw OutOfMemory(e.bytes(), "the KV cache of layer " + std::to_string(layer) + " (2 x " +
                                         OutOfMemory::mib(bytes) +
                                         "); a smaller context (-c) needs less");
    }
    persistent_.push_back({"kv." + std::to_string(layer) + ".k", pair.k, true});
    persistent_.push_back({"kv." + std::to_string(layer) + ".v", pair.v, false});
    kv_.emplace(layer, pair);
    counters_.kv_regions += 2;
    counters_.kv_bytes += 2 * bytes;
    return pair;
}

bool GraphAllocator::place_kv(const Graph& graph, NodeId id, Plan& p) {
    const Node& node = graph.node(id);
    if (!touches_kv(node.op)) return false;
    const BackendId b = node_backend(node);
    const size_t bytes = node.nbytes();
    // The store's shape mirrors the region; when its meta is complete too,
    // take the larger, so a type/meta mismatch can never make the kernel
    // write past the region.
    size_t kv_bytes = node.op == Op::KvStore ? bytes : meta_kv_bytes(graph, id);
    const NodeMeta& m = node.meta;
    if (node.op == Op::KvStore && m.n_head_kv > 0 && m.head_dim > 0 && m.n_ctx > 0)
        kv_bytes = std::max(kv_bytes, meta_kv_bytes(graph, id));
    const KvPair pair = ensure_kv(node.meta.layer, b, kv_bytes, node);
    if (node.op != Op::KvStore) return false;
    // The node's buffer is the K region (V is its sibling, reached through
    // kv_pair). Never part of a plan: nothing can free or reuse it.
    p.node_to_buf[static_cast<size_t>(id)] = BufRef{b, pair.k.id, 0, bytes};
    return true;
}

void GraphAllocator::plan_classes(const Graph& graph, Plan& p, std::vector<size_t>& last_use,
                                  const std::vector<bool>& pinned,
                                  const std::vector<int32_t>& n_consumers) {
    const size_t n = graph.size();
    // buf_alive: (backend, id) -> last position its contents are needed.
    // Buffers swept mid-walk go to this plan's own free list (not the
    // pool's) because this plan still names them in node_to_buf: another
    // cached graph's plan must never draw them.
    std::map<std::pair<BackendId, BufferId>, size_t> buf_alive;
    std::map<std::pair<BackendId, size_t>, std::vector<BufferId>> plan_free;  // (backend, class)

    auto sweep = [&](size_t i) {
        for (auto it = buf_alive.begin(); it != buf_alive.end();) {
            if (it->second < i) {
                const auto [b, id] = it->first;
                plan_free[{b, backend(b).buffer_bytes(id)}].push_back(id);
                it = buf_alive.erase(it);
            } else {
                ++it;
            }
        }
    };
    auto alloc_in_pool = [&](BackendId b, size_t bytes, size_t live_until) {
        const size_t cls = class_size(bytes);
        BufferId id;
        auto& fl = plan_free[{b, cls}];
        if (!fl.empty()) {
            id = fl.back();
            fl.pop_back();
        } else {
            try {
                id = backend(b).allocate(cls);
            } catch (const OutOfMemory& e) {
                throw OutOfMemory(e.bytes(), "the activations of one forward pass (" +
                                                 std::to_string(bytes) + "-byte tensor)");
            }
            p.owned.emplace_back(b, id);
        }
        buf_alive[{b, id}] = live_until;
        return BufRef{b, id, 0, bytes};
    };

    for (size_t i = 0; i < n; ++i) {
        sweep(i);
        const NodeId id = static_cast<NodeId>(i);
        const Node& node = graph.nodes[i];
        const BackendId b = node_backend(node);
        const size_t bytes = node.nbytes();
        const bool live = last_use[i] > i || has_side_effect(node);
        if (!live) {
            // e.g. the Silu orphaned by SwiGLU fusion, or a KvStore replaced
            // by the fused epilogue: no buffer, and so never scheduled.
            ++p.stats.dead_nodes;
            continue;
        }
        if (place_kv(graph, id, p)) continue;
        if (in_place_capable(node.op) && !node.src.empty()) {
            // Alias src[0] only when nothing else reads it (we overwrite it),
            // it is on this backend (no host copy of a pending buffer), and it
            // is an ordinary liveness buffer (not a KV region, not an input
            // refilled by the host, not an output read after the graph).
            const auto s = static_cast<size_t>(node.src[0]);
            const auto& sref = p.node_to_buf[s];
            if (sref && sref->backend == b && n_consumers[s] == 1 && !pinned[s] &&
                buf_alive.count({b, sref->id}) != 0 && bytes <= sref->len) {
                p.node_to_buf[i] = BufRef{b, sref->id, sref->offset, bytes};
                p.aliased[i] = true;
                ++p.stats.aliased_nodes;
                // The buffer now carries this node's deadline too.
                auto& until = buf_alive[{b, sref->id}];
                until = std::max(until, last_use[i]);
                last_use[s] = std::max(last_use[s], last_use[i]);
                continue;
            }
        }
        p.node_to_buf[i] = alloc_in_pool(b, bytes, last_use[i]);
    }
}

void GraphAllocator::plan_arena(const Graph& graph, Plan& p, std::vector<size_t>& last_use,
                                const std::vector<bool>& pinned,
                                const std::vector<int32_t>& n_consumers) {
    const size_t n = graph.size();
    // a) Lifetimes as data: which nodes own bytes, which alias whom, and
    // until when every owner's bytes are needed. Same rules as the classes
    // walk: dead nodes nothing, KV stores the K region, in-place ops their
    // sole-consumer, same-backend, unpinned, ordinary source.
    constexpr size_t kNone = SIZE_MAX;
    std::vector<size_t> root(n, kNone);  // the node owning i's bytes; i itself for an owner
    std::vector<size_t> until(n, 0);     // owners: last position their bytes are needed
    for (size_t i = 0; i < n; ++i) {
        const NodeId id = static_cast<NodeId>(i);
        const Node& node = graph.nodes[i];
        const BackendId b = node_backend(node);
        const size_t bytes = node.nbytes();
        if (!(last_use[i] > i || has_side_effect(node))) {
            ++p.stats.dead_nodes;  // no buffer, never scheduled
            continue;
        }
        if (place_kv(graph, id, p)) continue;
        if (in_place_capable(node.op) && !node.src.empty()) {
            const auto s = static_cast<size_t>(node.src[0]);
            if (root[s] != kNone && node_backend(graph.nodes[s]) == b && n_consumers[s] == 1 &&
                !pinned[s] && bytes <= graph.nodes[s].nbytes()) {
                root[i] = root[s];
                p.aliased[i] = true;
                ++p.stats.aliased_nodes;
                until[root[i]] = std::max(until[root[i]], last_use[i]);
                last_use[s] = std::max(last_use[s], last_use[i]);
                continue;
            }
        }
        root[i] = i;
        until[i] = last_use[i];
    }

    // b) Placement per backend, greedy by size: largest first (ties: the
    // earlier start), each at the lowest aligned offset where it overlaps
    // in bytes no placed owner it overlaps in time.
    std::vector<size_t> offset(n, 0);
    for (BackendId b = 0; b < static_cast<BackendId>(backends_.size()); ++b) {
        std::vector<size_t> owners;
        for (size_t i = 0; i < n; ++i)
            if (root[i] == i && node_backend(graph.nodes[i]) == b) owners.push_back(i);
        if (owners.empty()) continue;
        auto span_of = [&](size_t i) {
            return (graph.nodes[i].nbytes() + kArenaAlign - 1) / kArenaAlign * kArenaAlign;
        };
        std::sort(owners.begin(), owners.end(), [&](size_t a, size_t c) {
            const size_t sa = span_of(a), sc = span_of(c);
            return sa != sc ? sa > sc : a < c;
        });
        std::vector<size_t> placed;                   // owners, any order
        std::vector<std::pair<size_t, size_t>> busy;  // [offset, end) of time-overlapping owners
        size_t arena = 0;
        for (size_t i : owners) {
            busy.clear();
            for (size_t j : placed)
                if (i <= until[j] && j <= until[i])
                    busy.emplace_back(offset[j], offset[j] + span_of(j));
            std::sort(busy.begin(), busy.end());
            size_t at = 0;
            const size_t need = span_of(i);
            for (const auto& [lo, hi] : busy) {
                if (at + need <= lo) break;  // fits in the gap before this one
                at = std::max(at, hi);
            }
            offset[i] = at;
            arena = std::max(arena, at + need);
            placed.push_back(i);
        }
        // c) The plan is placed at the start of the backend's shared arena,
        // which grows only when this plan needs more than it holds.
        arena = std::max(arena, kArenaAlign);  // never an empty arena (all-empty tensors)
        const BufferId arena_id = ensure_arena(b, arena);
        p.arena_need[static_cast<size_t>(b)] = arena;
        for (size_t i = 0; i < n; ++i)
            if (root[i] != kNone && node_backend(graph.nodes[i]) == b)
                p.node_to_buf[i] = BufRef{b, arena_id, offset[root[i]], graph.nodes[i].nbytes()};
    }
}

const PlanStats& GraphAllocator::alloc_graph(const Graph& graph, int slot) {
    // 1. Tear down this slot's previous plan: its buffers go back to the
    // pools' free lists. KV regions are not part of any plan; other slots'
    // plans keep their buffers (they may be executed again).
    if (auto it = plans_.find(slot); it != plans_.end()) {
        free_plan(it->second);
        plans_.erase(it);
    }
    if (current_ == slot) current_ = -1;

    // 2. Validate acyclicity only (throws minfer::Error naming a node). The
    // scheduler runs BUILD order, so liveness must use build order too: a
    // Kahn order front-loads source-less nodes and would let a buffer be
    // recycled while its reader still waits (the G3 bug).
    (void)graph.topo_order();
    const size_t n = graph.size();
    for (size_t i = 0; i < n; ++i) {
        const Node& node = graph.nodes[i];
        const BackendId b = node_backend(node);
        if (b < 0 || static_cast<size_t>(b) >= backends_.size())
            throw Error("alloc: " + node_label(graph, static_cast<NodeId>(i)) +
                        " is assigned to backend " + std::to_string(b) + " but only " +
                        std::to_string(backends_.size()) + " exist");
        for (NodeId s : node.src)
            if (static_cast<size_t>(s) >= i)
                throw Error("alloc: " + node_label(graph, static_cast<NodeId>(i)) + " reads node " +
                            std::to_string(s) + " built after it (graphs execute in build order)");
    }

    // 3. Live ranges over build order: a node is live from its own position
    // to its last reader's. Inputs (host-filled before execution — bug 2b)
    // and outputs (read after it) are pinned past the end.
    std::vector<size_t> last_use(n);
    for (size_t i = 0; i < n; ++i) last_use[i] = i;
    for (size_t i = 0; i < n; ++i)
        for (NodeId s : graph.nodes[i].src)
            last_use[static_cast<size_t>(s)] = std::max(last_use[static_cast<size_t>(s)], i);
    std::vector<bool> pinned(n, false);
    for (NodeId o : graph.outputs) {
        MINFER_ASSERT(o >= 0 && static_cast<size_t>(o) < n);
        last_use[static_cast<size_t>(o)] = n;
        pinned[static_cast<size_t>(o)] = true;
    }
    for (NodeId in : graph.inputs) {
        MINFER_ASSERT(in >= 0 && static_cast<size_t>(in) < n);
        last_use[static_cast<size_t>(in)] = n;
        pinned[static_cast<size_t>(in)] = true;
    }

    // 4. Consumers per node: the in-place alias guard.
    const std::vector<int32_t> n_consumers = graph.n_consumers();

    // 5. Placement.
    Plan p;
    p.graph_uid = graph.uid;
    p.n_nodes = n;
    p.node_to_buf.assign(n, std::nullopt);
    p.aliased.assign(n, false);
    p.stats.planner = planner_;
    p.arena_need.assign(backends_.size(), 0);
    if (planner_ == Planner::Arena)
        plan_arena(graph, p, last_use, pinned, n_consumers);
    else
        plan_classes(graph, p, last_use, pinned, n_consumers);

    p.stats.n_nodes = n;
    for (size_t i = 0; i < n; ++i) {
        if (!p.node_to_buf[i]) continue;
        ++p.stats.n_live;
        if (graph.nodes[i].op != Op::KvStore) p.stats.naive_bytes += graph.nodes[i].nbytes();
    }
    p.stats.buffers_per_backend.assign(backends_.size(), 0);
    for (auto [b, bid] : p.owned) {
        p.stats.pool_bytes += backend(b).buffer_bytes(bid);
        ++p.stats.buffers_per_backend[static_cast<size_t>(b)];
    }
    for (size_t b = 0; b < backends_.size(); ++b)
        if (p.arena_need[b]) {
            p.stats.pool_bytes += p.arena_need[b];
            ++p.stats.buffers_per_backend[b];
        }
    for (size_t c : p.stats.buffers_per_backend) p.stats.n_buffers += c;

    ++counters_.graphs_allocated;
    counters_.largest_plan_bytes = std::max(counters_.largest_plan_bytes, p.stats.pool_bytes);
    counters_.dead_nodes += p.stats.dead_nodes;
    counters_.aliased_nodes += p.stats.aliased_nodes;
    auto& stored = plans_[slot] = std::move(p);
    current_ = slot;
    return stored.stats;
}

std::optional<BufRef> GraphAllocator::node_buffer(NodeId id) const {
    const Plan& p = plan();
    MINFER_ASSERT(id >= 0 && static_cast<size_t>(id) < p.n_nodes);
    return p.node_to_buf[static_cast<size_t>(id)];
}

bool GraphAllocator::is_aliased(NodeId id) const {
    const Plan& p = plan();
    MINFER_ASSERT(id >= 0 && static_cast<size_t>(id) < p.n_nodes);
    return p.aliased[static_cast<size_t>(id)];
}

const PlanStats& GraphAllocator::plan_stats() const {
    return plan().stats;
}

std::vector<BufRef> GraphAllocator::plan_buffers() const {
    const Plan& p = plan();
    std::vector<BufRef> out;
    for (auto [b, id] : p.owned) out.push_back(BufRef{b, id, 0, backend(b).buffer_bytes(id)});
    for (size_t b = 0; b < p.arena_need.size(); ++b)
        if (p.arena_need[b])
            out.push_back(BufRef{static_cast<BackendId>(b), arenas_[b].id, 0, p.arena_need[b]});
    return out;
}

std::vector<std::pair<NodeId, BufRef>> GraphAllocator::plan_staging() const {
    std::vector<std::pair<NodeId, BufRef>> out;
    for (const auto& [key, ref] : plan().cross) out.emplace_back(key.first, ref);
    return out;
}

void GraphAllocator::fill_input(const Graph& graph, std::string_view name,
                                std::span<const int32_t> data) {
    const Plan& p = plan();
    MINFER_ASSERT_MSG(p.graph_uid == graph.uid && p.n_nodes == graph.size(),
                      "fill_input: not the graph the current plan was made for");
    NodeId found = -1;
    for (NodeId in : graph.inputs)
        if (graph.node(in).name == name) found = in;
    if (found < 0)
        throw Error("fill_input: the graph has no input named '" + std::string(name) + "'");
    const auto& ref = p.node_to_buf[static_cast<size_t>(found)];
    MINFER_ASSERT_MSG(ref.has_value(), "inputs are pinned, so always have a buffer");
    const size_t nbytes = data.size() * sizeof(int32_t);
    if (nbytes != ref->len)
        throw Error("fill_input: input '" + std::string(name) + "' holds " +
                    std::to_string(ref->len / sizeof(int32_t)) + " values, got " +
                    std::to_string(data.size()));
    backend(ref->backend).write_host(*ref, data.data(), nbytes);
}

BufRef GraphAllocator::cross_staging(NodeId id, BackendId dst) {
    Plan& p = plan();
    if (auto it = p.cross.find({id, dst}); it != p.cross.end()) return it->second;
    MINFER_ASSERT(id >= 0 && static_cast<size_t>(id) < p.n_nodes);
    const auto& src = p.node_to_buf[static_cast<size_t>(id)];
    MINFER_ASSERT_MSG(src.has_value(), "cross_staging of a bufferless node");
    MINFER_ASSERT_MSG(src->backend != dst, "cross_staging onto the node's own backend");
    const BufRef ref{dst, backend(dst).allocate_fresh(class_size(src->len)), 0, src->len};
    p.cross.emplace(std::make_pair(id, dst), ref);
    ++p.stats.staging_buffers;
    ++counters_.staging_created;
    return ref;
}

std::optional<KvPair> GraphAllocator::kv_pair(int32_t layer) const {
    auto it = kv_.find(layer);
    if (it == kv_.end()) return std::nullopt;
    return it->second;
}

}  // namespace minfer::graph
