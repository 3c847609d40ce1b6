// The CPU backend: a HostPool and the cpu:: kernels run synchronously on a
// ThreadPool of n_threads.
#pragma once

#include <array>
#include <span>

#include "backend/cpu/host_pool.h"
#include "backend/cpu/kernels.h"
#include "ir/backend.h"
#include "util/thread_pool.h"

namespace minfer::backend {

// Host pointers for a node's windows in `pool` (shared with the queue
// backend, whose pool is also host memory).
cpu::NodeData resolve_node_data(HostPool& pool, const graph::Node& node,
                                std::span<const BufRef> srcs, const BufRef& out, const KvPair* kv,
                                std::span<const std::array<int64_t, 4>> src_ne);

class CpuBackend : public Backend {
  public:
    // batch_invariant: every matmul takes the GEMM path at any token count
    // (cpu::matmul), so a token's results do not depend on its pass's size.
    explicit CpuBackend(int n_threads = 1, bool batch_invariant = false);

    std::string_view name() const override { return "cpu"; }
    BufferId allocate(size_t bytes) override { return pool_.allocate(bytes); }
    BufferId allocate_fresh(size_t bytes) override { return pool_.allocate_fresh(bytes); }
    void free(BufferId id) override { pool_.free(id); }
    void release(BufferId id) override { pool_.release(id); }
    size_t buffer_bytes(BufferId id) const override { return pool_.buffer_bytes(id); }
    PoolStats stats() const override { return pool_.stats(); }
    void write_host(const BufRef& dst, const void* src, size_t nbytes) override;
    void read_host(const BufRef& src, void* dst, size_t nbytes) override;
    bool supports_op(const graph::Node& node) const override;
    void execute_node(const graph::Node& node, std::span<const BufRef> srcs, const BufRef& out,
                      const KvPair* kv,
                      std::span<const std::array<int64_t, 4>> src_ne = {}) override;
    void synchronize() override {}  // every node ran when execute_node returned
    size_t scratch_bytes() const override { return threads_.scratch_bytes(); }

    ThreadPool& threads() { return threads_; }
    const HostPool& pool() const { return pool_; }

  private:
    HostPool pool_;
    ThreadPool threads_;
    bool batch_invariant_ = false;
};

}  // namespace minfer::backend
