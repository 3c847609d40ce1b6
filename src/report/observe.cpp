#include "report/observe.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>

#include "graph/cache.h"
#include "ir/kv_layout.h"
#include "report/graph_dump.h"
#include "runtime/session.h"
#include "util/error.h"

namespace minfer::report {

using graph::Graph;
using graph::GraphAllocator;
using graph::NodeId;

struct GraphRecorder::State {
    bool trace = false;
    std::vector<nlohmann::json> records;
    std::map<NodeId, ValueStats> stats;  // of the pass running now
    std::vector<float> last_output;
    std::vector<uint8_t> tmp;
};

GraphRecorder::GraphRecorder(runtime::Session& session, bool trace_values)
    : state_(std::make_shared<State>()) {
    state_->trace = trace_values;
    auto st = state_;
    if (trace_values) {
        session.set_node_hook([st](const Graph& g, NodeId id, GraphAllocator& alloc) {
            const auto ref = alloc.node_buffer(id);
            if (!ref) return;
            const graph::Node& node = g.node(id);
            if (node.type != tensor::DType::F32 && node.type != tensor::DType::I32) return;
            st->tmp.resize(ref->len);
            alloc.backend(ref->backend).read_host(*ref, st->tmp.data(), ref->len);
            const size_t count = ref->len / 4;
            st->stats[id] =
                node.type == tensor::DType::I32
                    ? value_stats_i32(reinterpret_cast<const int32_t*>(st->tmp.data()), count)
                    : value_stats(reinterpret_cast<const float*>(st->tmp.data()), count);
        });
    }
    session.add_pass_observer([st, &session](const Graph& g, const graph::GraphParams& params,
                                             bool rebuilt) {
        GraphAllocator& alloc = session.allocator();
        if (rebuilt) {
            nlohmann::json rec = graph_record(
                g, alloc, params.kind == graph::kDecode ? "decode" : "prefill", params.n_tokens);
            if (st->trace)
                for (auto& nd : rec["nodes"]) {
                    auto it = st->stats.find(nd["id"].get<NodeId>());
                    if (it != st->stats.end()) nd["stats"] = to_json(it->second);
                }
            st->records.push_back(std::move(rec));
        }
        st->stats.clear();
        const auto out = alloc.node_buffer(g.outputs.at(0));
        if (out) {
            st->last_output.resize(out->len / sizeof(float));
            alloc.backend(out->backend).read_host(*out, st->last_output.data(), out->len);
        }
    });
}

GraphRecorder::~GraphRecorder() = default;

const std::vector<nlohmann::json>& GraphRecorder::records() const {
    return state_->records;
}
const std::vector<float>& GraphRecorder::last_output() const {
    return state_->last_output;
}

nlohmann::json trace_document(const std::vector<nlohmann::json>& records,
                              const MemoryReport& report, const nlohmann::json& meta) {
    return {{"version", 1},
            {"graphs", records},
            {"report", to_json(report)},
            {"meta", meta.is_null() ? nlohmann::json::object() : meta}};
}

void write_text_file(const std::string& path, const std::string& text) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw Error("cannot write '" + path + "'");
    out << text;
    if (!out) throw Error("write to '" + path + "' failed");
}

namespace {

void write_raw(const std::string& path, const void* data, size_t bytes) {
    std::ofstream out(path, std::ios::binary);
    if (!out) throw Error("cannot write '" + path + "'");
    out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
    if (!out) throw Error("write to '" + path + "' failed");
}

}  // namespace

void dump_state(runtime::Session& session, const std::vector<float>& logits, int64_t n_out,
                const std::string& dir) {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) throw Error("MINFER_GRAPH_DUMP: cannot create '" + dir + "': " + ec.message());
    const int64_t n_vocab = session.n_vocab();
    nlohmann::json index;
    index["n_past"] = session.n_past();
    index["n_ctx"] = session.n_ctx();
    write_raw(dir + "/logits.f32", logits.data(), logits.size() * sizeof(float));
    index["logits"] = {{"file", "logits.f32"}, {"dtype", "f32"}, {"shape", {n_vocab, n_out}}};
    GraphAllocator& alloc = session.allocator();
    const auto& hp = session.model().hp;
    nlohmann::json kv = nlohmann::json::array();
    std::vector<uint8_t> buf;
    std::vector<uint8_t> rows;
    for (const auto& pb : alloc.persistent()) {
        buf.resize(pb.ref.len);
        alloc.backend(pb.ref.backend).read_host(pb.ref, buf.data(), pb.ref.len);
        // The regions in the cache's element type (f32 or f16), a row per
        // cell: the file is named after the type and the row count comes
        // from its row size. K is stored element-major in blocks of cells
        // (ir/kv_layout.h) and written back as rows.
        const tensor::DType kv_type = session.options().kv_type;
        const std::string dtype(tensor::dtype_name(kv_type));
        const std::string file = pb.name + "." + dtype;
        const int64_t row = hp.n_embd_kv();
        const size_t row_bytes = tensor::row_size(kv_type, std::max<int64_t>(row, 1));
        if (pb.is_k && row > 0) {
            const size_t es = row_bytes / static_cast<size_t>(row);
            const auto n_cells = static_cast<int64_t>(buf.size() / row_bytes);
            rows.resize(buf.size());
            graph::k_cells_as_rows(rows.data(), buf.data(), n_cells, row, es);
            buf.swap(rows);
        }
        write_raw(dir + "/" + file, buf.data(), buf.size());
        kv.push_back({{"name", pb.name},
                      {"file", file},
                      {"dtype", dtype},
                      {"shape", {row, static_cast<int64_t>(pb.ref.len / row_bytes)}},
                      {"rows_written", session.n_past()}});
    }
    index["kv"] = kv;
    write_text_file(dir + "/index.json", index.dump(2) + "\n");
    std::fprintf(stderr, "minfer: wrote logits and %zu KV regions to %s\n", kv.size(), dir.c_str());
}

void ObserveFlags::add_to(ArgParser& p) {
    p.optional_value({"--mem-report"}, &mem_report, &mem_report_file, "FILE",
                     "after the run, print the memory report (per graph: pool, lower bound, naive "
                     "bytes, buffers; KV, weights, reuse counters) to stderr, or to FILE");
    p.option({"--mem-report-json"}, &mem_report_json, "FILE",
             "write the memory report as JSON {\"graphs\": [...], \"run\": {...}}");
    p.flag({"--dump-graph"}, &dump_graph,
           "print every graph built, node by node (op, shape, backend, buffer, live range, flags), "
           "to stderr");
    p.option({"--dump-graph-json"}, &dump_graph_json, "FILE",
             "write every graph built as JSON (the format the viz page reads)");
}

void ObserveFlags::attach(runtime::Session& session) {
    if (const char* t = std::getenv("MINFER_TRACE"); t && *t) trace_file = t;
    if (const char* d = std::getenv("MINFER_GRAPH_DUMP"); d && *d) state_dir = d;
    const bool want_mem = mem_report || !mem_report_json.empty() || !trace_file.empty();
    if (want_mem) mem_ = std::make_unique<MemoryRecorder>(session);
    if (dump_graph || !dump_graph_json.empty() || !trace_file.empty() || !state_dir.empty())
        graphs_ = std::make_unique<GraphRecorder>(session, !trace_file.empty());
}

void ObserveFlags::finish(runtime::Session& session, const nlohmann::json& meta) {
    if (mem_) {
        const MemoryReport r = mem_->report();
        if (mem_report) {
            if (mem_report_file.empty()) {
                print_text(r, stderr);
            } else {
                std::FILE* f = std::fopen(mem_report_file.c_str(), "w");
                if (!f) throw Error("cannot write '" + mem_report_file + "'");
                print_text(r, f);
                std::fclose(f);
            }
        }
        if (!mem_report_json.empty()) write_text_file(mem_report_json, to_json(r).dump(2) + "\n");
        if (!trace_file.empty()) {
            write_text_file(trace_file, trace_document(graphs_->records(), r, meta).dump() + "\n");
            std::fprintf(stderr, "minfer: wrote the trace of %zu graphs to %s\n",
                         graphs_->records().size(), trace_file.c_str());
        }
    }
    if (graphs_) {
        if (dump_graph)
            for (const auto& rec : graphs_->records()) print_graph_record(rec, stderr);
        if (!dump_graph_json.empty()) {
            nlohmann::json doc = {{"graphs", graphs_->records()}};
            write_text_file(dump_graph_json, doc.dump(1) + "\n");
        }
        if (!state_dir.empty()) {
            const auto& out = graphs_->last_output();
            const int64_t n_vocab = session.n_vocab();
            dump_state(session, out, n_vocab ? static_cast<int64_t>(out.size()) / n_vocab : 0,
                       state_dir);
        }
    }
}

}  // namespace minfer::report
