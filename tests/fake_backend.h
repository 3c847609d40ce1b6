// A test backend: the real HostPool plus a few f32 ops computed right here
// (Add, Mul, Silu, SwiGLU), and a log of what the scheduler asked of it.
// Lets the allocator, cache and scheduler be tested without the kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cpu/host_pool.h"
#include "ir/backend.h"
#include "ir/ir.h"
#include "util/error.h"

namespace minfer::testing {

class FakeBackend : public backend::Backend {
  public:
    explicit FakeBackend(std::string name = "fake") : name_(std::move(name)) {}
    std::string_view name() const override { return name_; }
    backend::BufferId allocate(size_t bytes) override { return pool.allocate(bytes); }
    backend::BufferId allocate_fresh(size_t bytes) override {
        ++n_fresh;
        return pool.allocate_fresh(bytes);
    }
    void free(backend::BufferId id) override { pool.free(id); }
    void release(backend::BufferId id) override { pool.release(id); }
    size_t buffer_bytes(backend::BufferId id) const override { return pool.buffer_bytes(id); }
    backend::PoolStats stats() const override { return pool.stats(); }
    void write_host(const backend::BufRef& dst, const void* src, size_t nbytes) override {
        MINFER_ASSERT(dst.backend == self);
        ++n_writes;
        note("write");
        pool.write(dst, src, nbytes);
    }
    void read_host(const backend::BufRef& src, void* dst, size_t nbytes) override {
        MINFER_ASSERT(src.backend == self);
        ++n_reads;
        note("read");
        pool.read(src, dst, nbytes);
    }
    bool supports_op(const graph::Node&) const override { return true; }
    void execute_node(const graph::Node& node, std::span<const backend::BufRef> srcs,
                      const backend::BufRef& out, const backend::KvPair* kv,
                      std::span<const std::array<int64_t, 4>> src_ne = {}) override {
        MINFER_ASSERT(src_ne.size() == srcs.size());
        MINFER_ASSERT(out.backend == self);
        for (const auto& s : srcs) MINFER_ASSERT(s.backend == self);  // never another pool
        executed.push_back(node.name);
        note("exec " + node.name);
        saw_kv.push_back(kv != nullptr);
        const size_t n = out.len / sizeof(float);
        auto* o = reinterpret_cast<float*>(pool.resolve(out));
        auto in = [&](size_t i) { return reinterpret_cast<const float*>(pool.resolve(srcs[i])); };
        // Read everything first: out may alias src0 (in place). A source may
        // be shorter than the output (a KV store's output is the whole
        // region): only its own bytes are read, the rest counts as zero.
        std::vector<float> a(n), b(n);
        auto take = [&](size_t i, std::vector<float>& dst) {
            const size_t m = std::min(n, srcs[i].len / sizeof(float));
            std::memcpy(dst.data(), in(i), m * sizeof(float));
        };
        if (!srcs.empty()) take(0, a);
        if (srcs.size() > 1) take(1, b);
        for (size_t i = 0; i < n; ++i) {
            const float silu = a[i] / (1.0f + std::exp(-a[i]));
            switch (node.op) {
                case graph::Op::Add:
                    o[i] = a[i] + b[i];
                    break;
                case graph::Op::Mul:
                    o[i] = a[i] * b[i];
                    break;
                case graph::Op::Silu:
                    o[i] = silu;
                    break;
                case graph::Op::SwiGLU:
                    o[i] = silu * b[i];
                    break;
                default:
                    o[i] = a[i];
                    break;
            }
        }
    }
    void submit() override {
        ++n_submits;
        note("submit");
    }
    void synchronize() override {
        ++n_syncs;
        note("sync");
    }
    // Events of every backend sharing one log, as "<backend> <event>".
    void note(const std::string& what) {
        if (log) log->push_back(name_ + " " + what);
    }
    std::vector<std::string>* log = nullptr;

    backend::HostPool pool;
    graph::BackendId self = 0;  // index in the backend list, for sanity checks
    std::vector<std::string> executed;
    std::vector<bool> saw_kv;
    int n_reads = 0, n_writes = 0, n_fresh = 0, n_submits = 0, n_syncs = 0;

  private:
    std::string name_;
};

}  // namespace minfer::testing
