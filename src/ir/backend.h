// The one virtual interface of the engine: what the allocator and the
// scheduler need from a device. A GPU backend implements the same calls.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "ir/ir.h"

namespace minfer::backend {

using graph::BackendId;
using BufferId = uint32_t;

// A window into a pool buffer: a pool buffer may be longer than the node it
// serves (size classes), so every consumer uses [offset, offset + len).
struct BufRef {
    BackendId backend = graph::kNoBackend;
    BufferId id = 0;
    size_t offset = 0;  // bytes
    size_t len = 0;     // bytes
    bool valid() const { return backend != graph::kNoBackend; }
    bool same_buffer(const BufRef& o) const { return backend == o.backend && id == o.id; }
};

// A layer's persistent K and V regions, [n_kv_embd, n_ctx] each.
struct KvPair {
    BufRef k, v;
};

struct PoolStats {
    size_t n_buffers = 0;    // ever created (ids are stable, never reused for other sizes)
    size_t bytes = 0;        // sum of the sizes of the buffers not released
    size_t allocations = 0;  // buffers created (not recycled) since construction
    size_t recycled = 0;     // allocate() calls served from the free list
    size_t released = 0;     // buffers whose memory went back to the system
};

class Backend {
  public:
    virtual ~Backend() = default;
    virtual std::string_view name() const = 0;

    // --- pool: ids are stable and memory never moves -----------------------
    // A free buffer of exactly `bytes` if there is one (recycled, zeroed),
    // else a new one.
    virtual BufferId allocate(size_t bytes) = 0;
    // Always a new buffer, never from the free list (split staging).
    virtual BufferId allocate_fresh(size_t bytes) = 0;
    // Back to the free list (idempotent).
    virtual void free(BufferId id) = 0;
    // The buffer's memory back to the system; the id is dead afterwards.
    // A backend that cannot give memory back keeps it on its free list.
    virtual void release(BufferId id) { free(id); }
    virtual size_t buffer_bytes(BufferId id) const = 0;
    virtual PoolStats stats() const = 0;

    // --- host access of a window; only when no kernel is pending on it -----
    virtual void write_host(const BufRef& dst, const void* src, size_t nbytes) = 0;
    virtual void read_host(const BufRef& src, void* dst, size_t nbytes) = 0;

    // --- execution ---------------------------------------------------------
    virtual bool supports_op(const graph::Node& node) const = 0;
    // Run (or record, on a queue backend) one node. srcs[i] is where
    // node.src[i] can be read on this backend; kv is the layer's regions for
    // ops that read or write the cache; src_ne[i] is node.src[i]'s shape
    // (the kernels need it: Attn's q row stride, KvStore's token count,
    // SelectRows' bounds). The graph must stay alive until synchronize().
    virtual void execute_node(const graph::Node& node, std::span<const BufRef> srcs,
                              const BufRef& out, const KvPair* kv,
                              std::span<const std::array<int64_t, 4>> src_ne = {}) = 0;
    // End of a split: a queue backend starts running what it recorded.
    virtual void submit() {}
    // Wait until everything submitted has finished.
    virtual void synchronize() = 0;

    // Bytes of scratch the backend's kernels hold (their peak so far).
    virtual size_t scratch_bytes() const { return 0; }
};

}  // namespace minfer::backend
