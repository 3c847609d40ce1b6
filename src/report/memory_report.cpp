#include "report/memory_report.h"

#include <algorithm>
#include <memory>

#include "graph/cache.h"
#include "runtime/session.h"

namespace minfer::report {

using graph::Graph;
using graph::GraphAllocator;
using graph::NodeId;
using graph::Op;

std::vector<size_t> live_until(const Graph& g, const GraphAllocator& alloc) {
    const size_t n = g.size();
    std::vector<size_t> last(n);
    for (size_t i = 0; i < n; ++i) last[i] = i;
    for (size_t i = 0; i < n; ++i)
        for (NodeId s : g.nodes[i].src)
            last[static_cast<size_t>(s)] = std::max(last[static_cast<size_t>(s)], i);
    for (NodeId o : g.outputs) last[static_cast<size_t>(o)] = n;
    for (NodeId in : g.inputs) last[static_cast<size_t>(in)] = n;
    // An alias writes into its source's bytes: the chain's root must hold
    // them through every alias's readers. Aliases come after their source
    // in build order, so one backward pass carries deadlines to the root.
    for (size_t k = n; k-- > 0;) {
        const NodeId id = static_cast<NodeId>(k);
        if (!alloc.node_buffer(id) || !alloc.is_aliased(id)) continue;
        const auto s = static_cast<size_t>(g.nodes[k].src[0]);
        last[s] = std::max(last[s], last[k]);
    }
    return last;
}

std::vector<size_t> live_bytes_curve(const Graph& g, const GraphAllocator& alloc) {
    const size_t n = g.size();
    const std::vector<size_t> last = live_until(g, alloc);
    // Difference array: +bytes at the first position, -bytes after the last.
    std::vector<int64_t> delta(n + 1, 0);
    for (size_t i = 0; i < n; ++i) {
        const NodeId id = static_cast<NodeId>(i);
        const auto buf = alloc.node_buffer(id);
        if (!buf || alloc.is_aliased(id) || g.nodes[i].op == Op::KvStore) continue;
        delta[i] += static_cast<int64_t>(buf->len);
        const size_t end = std::min(last[i], n - 1) + 1;
        delta[end] -= static_cast<int64_t>(buf->len);
    }
    std::vector<size_t> curve(n);
    int64_t run = 0;
    for (size_t t = 0; t < n; ++t) {
        run += delta[t];
        curve[t] = static_cast<size_t>(run);
    }
    return curve;
}

size_t lower_bound_bytes(const Graph& g, const GraphAllocator& alloc) {
    const std::vector<size_t> c = live_bytes_curve(g, alloc);
    return c.empty() ? 0 : *std::max_element(c.begin(), c.end());
}

GraphMemory describe_graph(const Graph& g, const GraphAllocator& alloc, std::string kind,
                           int64_t n_tokens) {
    const graph::PlanStats& st = alloc.plan_stats();
    GraphMemory m;
    m.kind = std::move(kind);
    m.n_tokens = n_tokens;
    m.planner = graph::planner_name(st.planner);
    m.n_nodes = st.n_nodes;
    m.n_live = st.n_live;
    m.dead_nodes = st.dead_nodes;
    m.aliased_nodes = st.aliased_nodes;
    m.n_buffers = st.n_buffers;
    m.buffers_per_backend = st.buffers_per_backend;
    for (size_t b = 0; b < alloc.n_backends(); ++b)
        m.backend_names.emplace_back(alloc.backend(static_cast<graph::BackendId>(b)).name());
    m.pool_bytes = st.pool_bytes;
    m.naive_bytes = st.naive_bytes;
    m.lower_bound_bytes = lower_bound_bytes(g, alloc);
    m.staging_buffers = st.staging_buffers;
    return m;
}

MemoryRecorder::MemoryRecorder(runtime::Session& session)
    : session_(session), graphs_(std::make_shared<std::vector<GraphMemory>>()) {
    auto graphs = graphs_;
    session.add_pass_observer(
        [graphs, &session](const Graph& g, const graph::GraphParams& params, bool rebuilt) {
            if (!rebuilt) return;
            graphs->push_back(describe_graph(g, session.allocator(),
                                             params.kind == graph::kDecode ? "decode" : "prefill",
                                             params.n_tokens));
        });
}

MemoryReport MemoryRecorder::report() const {
    MemoryReport r;
    r.graphs = *graphs_;
    const runtime::SessionStats& s = session_.stats();
    r.run.passes = s.passes;
    r.run.decode_steps = s.decode_steps;
    r.run.graphs_built = s.graphs_built;
    r.run.rebuilds_after_first_decode = s.rebuilds_after_first_decode;
    r.run.allocations_after_first_decode = s.allocations_after_first_decode;
    const graph::GraphAllocator& alloc = session_.allocator();
    r.run.activation_bytes_held = alloc.activation_bytes_held();
    r.run.activation_bytes_at_warmup = s.activation_bytes_at_warmup;
    r.run.activation_growth_after_warmup = s.activation_growth_after_warmup;
    r.run.largest_plan_bytes = alloc.counters().largest_plan_bytes;
    r.run.arena_growths = alloc.counters().arena_growths;
    r.run.n_layer = session_.model().hp.n_layer;
    r.run.kv_bytes = alloc.counters().kv_bytes;
    const size_t layers_with_kv = alloc.counters().kv_regions / 2;
    r.run.kv_bytes_per_layer = layers_with_kv ? r.run.kv_bytes / layers_with_kv : 0;
    r.run.weight_bytes = session_.model().weight_bytes;
    r.run.regrouped_bytes = session_.model().regrouped_bytes;
    r.run.weights_moved = r.run.regrouped_bytes > 0;  // interleave_weights moves all or none
    r.run.kernel_scratch_bytes = session_.kernel_scratch_bytes();
    const graph::CParams& cp = session_.cparams();
    if (cp.kv_page > 0) {
        r.run.kv_page_cells = cp.kv_page;
        r.run.kv_pages = cp.n_ctx / cp.kv_page;
        r.run.kv_pages_held = (session_.n_past() + cp.kv_page - 1) / cp.kv_page;
    }
    return r;
}

std::string format_bytes(size_t bytes) {
    char buf[64];
    const double b = static_cast<double>(bytes);
    if (bytes >= (size_t{1} << 30))
        std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1 << 30));
    else if (bytes >= (size_t{1} << 20))
        std::snprintf(buf, sizeof buf, "%.2f MiB", b / (1 << 20));
    else if (bytes >= 1024)
        std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
    else
        std::snprintf(buf, sizeof buf, "%zu B", bytes);
    return buf;
}

void print_text(const MemoryReport& r, std::FILE* out) {
    std::fprintf(out, "\nminfer: memory report (activation planner: %s)\n",
                 r.graphs.empty() ? "-" : r.graphs.front().planner.c_str());
    for (const GraphMemory& g : r.graphs) {
        std::fprintf(out,
                     "  graph %-7s n_tokens %-5lld nodes %zu (live %zu, dead %zu, aliased %zu)\n",
                     g.kind.c_str(), static_cast<long long>(g.n_tokens), g.n_nodes, g.n_live,
                     g.dead_nodes, g.aliased_nodes);
        std::string per;
        for (size_t b = 0; b < g.buffers_per_backend.size(); ++b)
            per += (b ? ", " : "") + g.backend_names[b] + " " +
                   std::to_string(g.buffers_per_backend[b]);
        std::fprintf(out, "    buffers %zu (%s), staging %zu\n", g.n_buffers, per.c_str(),
                     g.staging_buffers);
        std::fprintf(out,
                     "    pool %s   lower bound %s   pool/bound %.3f   naive %s (%.1fx pool)\n",
                     format_bytes(g.pool_bytes).c_str(), format_bytes(g.lower_bound_bytes).c_str(),
                     g.pool_over_lower_bound(), format_bytes(g.naive_bytes).c_str(),
                     g.pool_bytes ? static_cast<double>(g.naive_bytes) / g.pool_bytes : 0.0);
    }
    const RunMemory& run = r.run;
    const std::string where = run.weights_moved
                                  ? "out of the file, " + format_bytes(run.regrouped_bytes) +
                                        " regrouped 16 rows at a time"
                                  : "mapped";
    std::fprintf(out, "  KV cache %s (%s per layer x %lld layers), weights %s (%s)\n",
                 format_bytes(run.kv_bytes).c_str(), format_bytes(run.kv_bytes_per_layer).c_str(),
                 static_cast<long long>(run.n_layer), format_bytes(run.weight_bytes).c_str(),
                 where.c_str());
    if (run.kv_pages > 0)
        std::fprintf(out,
                     "  KV pages: %lld of %lld cells; the sequence holds %lld (pages 0..%lld), "
                     "%lld free\n",
                     static_cast<long long>(run.kv_pages),
                     static_cast<long long>(run.kv_page_cells),
                     static_cast<long long>(run.kv_pages_held),
                     static_cast<long long>(run.kv_pages_held - 1),
                     static_cast<long long>(run.kv_pages - run.kv_pages_held));
    std::fprintf(out,
                 "  kernel scratch %s (thread pool: quantized activations, GEMM panels, "
                 "attention scores)\n",
                 format_bytes(run.kernel_scratch_bytes).c_str());
    std::fprintf(out,
                 "  activations held %s (largest plan %s, arena grown %zu times); after warm-up "
                 "(the first decode step) %s, grown since by %s\n",
                 format_bytes(run.activation_bytes_held).c_str(),
                 format_bytes(run.largest_plan_bytes).c_str(), run.arena_growths,
                 format_bytes(run.activation_bytes_at_warmup).c_str(),
                 format_bytes(run.activation_growth_after_warmup).c_str());
    std::fprintf(out,
                 "  run: %lld passes, %lld decode steps, %lld graphs built; after the first "
                 "decode (every pass, prefill too): rebuilds %lld, buffers allocated %lld\n",
                 static_cast<long long>(run.passes), static_cast<long long>(run.decode_steps),
                 static_cast<long long>(run.graphs_built),
                 static_cast<long long>(run.rebuilds_after_first_decode),
                 static_cast<long long>(run.allocations_after_first_decode));
}

nlohmann::json to_json(const GraphMemory& g) {
    nlohmann::json per = nlohmann::json::object();
    for (size_t b = 0; b < g.buffers_per_backend.size(); ++b)
        per[g.backend_names[b]] = g.buffers_per_backend[b];
    return {
        {"kind", g.kind},
        {"n_tokens", g.n_tokens},
        {"planner", g.planner},
        {"n_nodes", g.n_nodes},
        {"n_live", g.n_live},
        {"dead_nodes", g.dead_nodes},
        {"aliased_nodes", g.aliased_nodes},
        {"n_buffers", g.n_buffers},
        {"buffers_per_backend", per},
        {"pool_bytes", g.pool_bytes},
        {"naive_bytes", g.naive_bytes},
        {"lower_bound_bytes", g.lower_bound_bytes},
        {"pool_over_lower_bound", g.pool_over_lower_bound()},
        {"staging_buffers", g.staging_buffers},
    };
}

nlohmann::json to_json(const MemoryReport& r) {
    nlohmann::json graphs = nlohmann::json::array();
    for (const GraphMemory& g : r.graphs) graphs.push_back(to_json(g));
    const RunMemory& run = r.run;
    return {
        {"graphs", graphs},
        {"run",
         {{"passes", run.passes},
          {"decode_steps", run.decode_steps},
          {"graphs_built", run.graphs_built},
          {"rebuilds_after_first_decode", run.rebuilds_after_first_decode},
          {"allocations_after_first_decode", run.allocations_after_first_decode},
          {"activation_bytes_held", run.activation_bytes_held},
          {"activation_bytes_at_warmup", run.activation_bytes_at_warmup},
          {"activation_growth_after_warmup", run.activation_growth_after_warmup},
          {"largest_plan_bytes", run.largest_plan_bytes},
          {"arena_growths", run.arena_growths},
          {"n_layer", run.n_layer},
          {"kv_bytes", run.kv_bytes},
          {"kv_bytes_per_layer", run.kv_bytes_per_layer},
          {"kv_pages", run.kv_pages},
          {"kv_page_cells", run.kv_page_cells},
          {"kv_pages_held", run.kv_pages_held},
          {"weight_bytes", run.weight_bytes},
          {"weights_moved", run.weights_moved},
          {"regrouped_bytes", run.regrouped_bytes},
          {"kernel_scratch_bytes", run.kernel_scratch_bytes}}},
    };
}

}  // namespace minfer::report
