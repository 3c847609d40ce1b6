// The allocator under random graphs: the input bytes drive the graph
// generator the randomized test uses (tests/random_graph.h: element-wise ops,
// KV stores, fused Q/K/V with the bias-RoPE-store epilogue, two backends,
// random outputs). Byte 0 picks the planner and the graphs per run; each graph
// is planned into one of two slots of one allocator (rebuilds, like the
// cache) and every plan goes through the independent checker
// (tests/alloc_checker.h). Any problem it reports, or any exception from a
// valid graph, is a finding.
#include <cstddef>
#include <cstdint>
#include <string>

#include "alloc_checker.h"
#include "fake_backend.h"
#include "fuzz_common.h"
#include "graph/alloc.h"
#include "random_graph.h"

namespace {

// Values from the input, two bytes each; zeros once it is used up (a short
// input still makes a small valid graph).
struct ByteSource {
    const uint8_t* data;
    size_t size, at = 0;
    uint32_t operator()(uint32_t bound) {
        uint32_t v = 0;
        for (int k = 0; k < 2; ++k) v = (v << 8) | (at < size ? data[at++] : 0u);
        return bound == 0 ? 0 : v % bound;
    }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    using namespace minfer;
    if (size == 0) return 0;
    const graph::Planner planner = (data[0] & 1) ? graph::Planner::Classes : graph::Planner::Arena;
    const int n_graphs = 1 + ((data[0] >> 1) & 3);
    const int n_backends = 1 + ((data[0] >> 3) & 1);
    ByteSource rnd{data + 1, size - 1};
    testing::FakeBackend b0{"cpu"}, b1{"queue"};
    b1.self = 1;
    std::vector<backend::Backend*> backends{&b0};
    if (n_backends == 2) backends.push_back(&b1);
    graph::GraphAllocator alloc(backends, planner);
    for (int k = 0; k < n_graphs; ++k) {
        const graph::Graph g = testing::random_graph(rnd, n_backends, 60);
        try {
            alloc.alloc_graph(g, k % 2);
        } catch (const Error& e) {
            std::fprintf(stderr, "alloc_graph threw on a valid graph: %s\n", e.what());
            fuzz::fail("the allocator refused a valid graph");
        }
        const testing::AllocAudit audit = testing::audit_allocation(g, alloc);
        if (!audit.problems.empty()) {
            for (const auto& p : audit.problems)
                std::fprintf(stderr, "%s: %s\n", graph::planner_name(planner), p.c_str());
            fuzz::fail("a plan broke the allocation contract");
        }
    }
    return 0;
}
