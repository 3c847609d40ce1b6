#include "report/graph_dump.h"

#include <cmath>
#include <limits>
#include <map>

#include "report/memory_report.h"

namespace minfer::report {

using graph::Graph;
using graph::GraphAllocator;
using graph::NodeId;
using graph::Op;

namespace {

template <typename T>
ValueStats stats_of(const T* x, size_t n) {
    ValueStats s;
    double sum = 0;
    double lo = std::numeric_limits<double>::infinity(), hi = -lo;
    for (size_t i = 0; i < n; ++i) {
        const double v = static_cast<double>(x[i]);
        if (std::isnan(v)) {
            ++s.nan;
            continue;
        }
        if (std::isinf(v)) ++s.inf;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
        sum += v;
        ++s.count;
    }
    if (s.count) {
        s.min = lo;
        s.max = hi;
        s.mean = sum / static_cast<double>(s.count);
    }
    s.count += s.nan;
    return s;
}

// Built with appends: GCC 12's -Wrestrict misfires on chains of operator+.
std::string buffer_name(const char* kind, const std::string& backend, uint32_t id) {
    std::string s(kind);
    s += ' ';
    s += backend;
    s += '#';
    s += std::to_string(id);
    return s;
}

bool touches_kv(Op op) {
    return op == Op::KvStore || op == Op::Attn || op == Op::FusedQKV || op == Op::QkvBiasRopeStore;
}

}  // namespace

ValueStats value_stats(const float* x, size_t n) {
    return stats_of(x, n);
}
ValueStats value_stats_i32(const int32_t* x, size_t n) {
    return stats_of(x, n);
}

nlohmann::json to_json(const ValueStats& s) {
    // JSON has no inf: a non-finite min/max is written as a string.
    auto num = [](double v) -> nlohmann::json {
        if (std::isfinite(v)) return v;
        return v > 0 ? "inf" : "-inf";
    };
    return {{"count", s.count},    {"min", num(s.min)}, {"max", num(s.max)},
            {"mean", num(s.mean)}, {"nan", s.nan},      {"inf", s.inf}};
}

nlohmann::json graph_record(const Graph& g, const GraphAllocator& alloc, const std::string& kind,
                            int64_t n_tokens) {
    const size_t n = g.size();
    const std::vector<size_t> last = live_until(g, alloc);
    const graph::PlanStats& st = alloc.plan_stats();
    std::vector<bool> is_in(n, false), is_out(n, false);
    for (NodeId i : g.inputs) is_in[static_cast<size_t>(i)] = true;
    for (NodeId o : g.outputs) is_out[static_cast<size_t>(o)] = true;

    nlohmann::json backends = nlohmann::json::array();
    for (size_t b = 0; b < alloc.n_backends(); ++b)
        backends.push_back(std::string(alloc.backend(static_cast<graph::BackendId>(b)).name()));

    // Buffers: the plan's own, then the KV regions and the staging.
    nlohmann::json buffers = nlohmann::json::array();
    const char* own_kind = st.planner == graph::Planner::Arena ? "arena" : "pool";
    for (const auto& ref : alloc.plan_buffers())
        buffers.push_back(
            {{"backend", ref.backend},
             {"id", ref.id},
             {"bytes", ref.len},
             {"kind", own_kind},
             {"name", buffer_name(own_kind, backends[ref.backend].get<std::string>(), ref.id)}});
    std::map<std::pair<int32_t, uint32_t>, std::string> kv_names;
    for (const auto& pb : alloc.persistent()) {
        kv_names[{pb.ref.backend, pb.ref.id}] = pb.name;
        buffers.push_back({{"backend", pb.ref.backend},
                           {"id", pb.ref.id},
                           {"bytes", pb.ref.len},
                           {"kind", "kv"},
                           {"name", pb.name}});
    }
    for (const auto& [node, ref] : alloc.plan_staging())
        buffers.push_back({{"backend", ref.backend},
                           {"id", ref.id},
                           {"bytes", ref.len},
                           {"kind", "staging"},
                           {"node", node},
                           {"name", "staging of " + g.node(node).name}});

    nlohmann::json nodes = nlohmann::json::array();
    for (size_t i = 0; i < n; ++i) {
        const NodeId id = static_cast<NodeId>(i);
        const graph::Node& node = g.nodes[i];
        const auto buf = alloc.node_buffer(id);
        nlohmann::json j = {
            {"id", id},
            {"name", node.name},
            {"op", std::string(graph::op_name(node.op))},
            {"type", std::string(tensor::dtype_name(node.type))},
            {"shape", {node.ne[0], node.ne[1], node.ne[2], node.ne[3]}},
            {"backend", graph::node_backend(node)},
            {"layer", node.meta.layer},
            {"src", node.src},
            {"live", {i, last[i]}},
            {"aliased", buf && alloc.is_aliased(id)},
            {"dead", !buf},
            {"fused", node.fused},
            {"input", is_in[i]},
            {"output", is_out[i]},
            {"kv", touches_kv(node.op)},
        };
        if (buf)
            j["buffer"] = {{"backend", buf->backend},
                           {"id", buf->id},
                           {"offset", buf->offset},
                           {"len", buf->len},
                           {"kv", node.op == Op::KvStore}};
        else
            j["buffer"] = nullptr;
        nodes.push_back(std::move(j));
    }
    const std::vector<size_t> curve = live_bytes_curve(g, alloc);
    size_t lb = 0;
    for (size_t v : curve) lb = std::max(lb, v);
    return {
        {"kind", kind},
        {"n_tokens", n_tokens},
        {"planner", graph::planner_name(st.planner)},
        {"n_nodes", n},
        {"backends", backends},
        {"nodes", nodes},
        {"buffers", buffers},
        {"curve", curve},
        {"lower_bound_bytes", lb},
        {"pool_bytes", st.pool_bytes},
        {"naive_bytes", st.naive_bytes},
    };
}

void print_graph_record(const nlohmann::json& r, std::FILE* out) {
    std::fprintf(
        out, "\nminfer: graph %s n_tokens %lld: %zu nodes, planner %s, pool %s, lower bound %s\n",
        r["kind"].get<std::string>().c_str(), static_cast<long long>(r["n_tokens"].get<int64_t>()),
        r["n_nodes"].get<size_t>(), r["planner"].get<std::string>().c_str(),
        format_bytes(r["pool_bytes"].get<size_t>()).c_str(),
        format_bytes(r["lower_bound_bytes"].get<size_t>()).c_str());
    std::fprintf(out, "  %4s %-22s %-18s %-16s %-6s %-28s %-12s %s\n", "id", "name", "op", "shape",
                 "where", "buffer (backend#id +offset len)", "live", "flags");
    const auto& backends = r["backends"];
    for (const auto& nd : r["nodes"]) {
        const auto& sh = nd["shape"];
        char shape[48];
        std::snprintf(shape, sizeof shape, "[%lld,%lld]",
                      static_cast<long long>(sh[0].get<int64_t>()),
                      static_cast<long long>(sh[1].get<int64_t>()));
        char buf[96] = "-";
        if (!nd["buffer"].is_null()) {
            const auto& b = nd["buffer"];
            std::snprintf(buf, sizeof buf, "%s#%u +%zu %zu",
                          backends[b["backend"].get<size_t>()].get<std::string>().c_str(),
                          b["id"].get<uint32_t>(), b["offset"].get<size_t>(),
                          b["len"].get<size_t>());
        }
        char live[48];
        std::snprintf(live, sizeof live, "[%zu,%zu]", nd["live"][0].get<size_t>(),
                      nd["live"][1].get<size_t>());
        std::string flags;
        if (nd["input"].get<bool>()) flags += "input ";
        if (nd["output"].get<bool>()) flags += "output ";
        if (nd["aliased"].get<bool>()) flags += "aliased ";
        if (nd["dead"].get<bool>()) flags += "dead ";
        if (nd["fused"].get<bool>()) flags += "fused ";
        if (!nd["buffer"].is_null() && nd["buffer"]["kv"].get<bool>()) flags += "kv-region ";
        std::fprintf(out, "  %4d %-22s %-18s %-16s %-6s %-28s %-12s %s\n", nd["id"].get<int>(),
                     nd["name"].get<std::string>().c_str(), nd["op"].get<std::string>().c_str(),
                     shape, backends[nd["backend"].get<size_t>()].get<std::string>().c_str(), buf,
                     live, flags.c_str());
    }
}

}  // namespace minfer::report
