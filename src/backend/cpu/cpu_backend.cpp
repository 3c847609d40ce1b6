#include "backend/cpu/cpu_backend.h"

#include "util/error.h"

namespace minfer::backend {

cpu::NodeData resolve_node_data(HostPool& pool, const graph::Node& node,
                                std::span<const BufRef> srcs, const BufRef& out, const KvPair* kv,
                                std::span<const std::array<int64_t, 4>> src_ne) {
    MINFER_ASSERT_MSG(srcs.size() == node.src.size(), "one BufRef per node.src");
    MINFER_ASSERT_MSG(src_ne.size() == node.src.size(), "one shape per node.src");
    MINFER_ASSERT_MSG(out.len >= node.nbytes(), "output window smaller than the node");
    cpu::NodeData d;
    d.src.reserve(srcs.size());
    for (const BufRef& s : srcs) d.src.push_back(pool.resolve(s));
    d.src_ne.assign(src_ne.begin(), src_ne.end());
    d.out = pool.resolve(out);
    if (kv) {
        d.k = pool.resolve(kv->k);
        d.v = pool.resolve(kv->v);
    }
    return d;
}

CpuBackend::CpuBackend(int n_threads, bool batch_invariant)
    : threads_(n_threads), batch_invariant_(batch_invariant) {}

void CpuBackend::write_host(const BufRef& dst, const void* src, size_t nbytes) {
    pool_.write(dst, src, nbytes);
}

void CpuBackend::read_host(const BufRef& src, void* dst, size_t nbytes) {
    pool_.read(src, dst, nbytes);
}

bool CpuBackend::supports_op(const graph::Node&) const {
    return true;
}

void CpuBackend::execute_node(const graph::Node& node, std::span<const BufRef> srcs,
                              const BufRef& out, const KvPair* kv,
                              std::span<const std::array<int64_t, 4>> src_ne) {
    cpu::NodeData data = resolve_node_data(pool_, node, srcs, out, kv, src_ne);
    data.batch_invariant = batch_invariant_;
    cpu::run_node(node, data, threads_);
}

}  // namespace minfer::backend
