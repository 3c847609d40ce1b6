// What a command attaches to a session so that a person can see the
// forward pass: the memory report, the graph dump, the per-node trace and
// the state dump. The CLI's generate and logits commands add the flags and
// call attach() before the first eval and finish() after the run:
//
//   --mem-report [FILE]     memory report as text (stderr, or FILE)
//   --mem-report-json FILE  the same as JSON {"graphs": [...], "run": {...}}
//   --dump-graph            every graph built, node by node, on stderr
//   --dump-graph-json FILE  the same as JSON {"graphs": [records]}
//   MINFER_TRACE=FILE       per-node records with value statistics (slow)
//   MINFER_GRAPH_DUMP=DIR   logits (raw f32) and KV regions (raw, the cache type) after the run
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "report/memory_report.h"
#include "util/args.h"

namespace minfer::runtime {
class Session;
}

namespace minfer::report {

// Records every built graph (graph_record) and, when tracing, the value
// statistics of every node on the graph's first execution. Installs a
// scheduler node hook only when trace_values is set.
class GraphRecorder {
  public:
    GraphRecorder(runtime::Session& session, bool trace_values);
    ~GraphRecorder();
    // {"graphs": [records, nodes with "stats" when tracing]}
    const std::vector<nlohmann::json>& records() const;
    // The values of the graph output (logits) after the last pass: [n_out × n_vocab].
    const std::vector<float>& last_output() const;

  private:
    struct State;
    std::shared_ptr<State> state_;
};

// The page / trace document: {"version": 1, "graphs": [...], "report": {...}, "meta": {...}}.
nlohmann::json trace_document(const std::vector<nlohmann::json>& records,
                              const MemoryReport& report, const nlohmann::json& meta);

// Writes the logits and every KV region into dir as raw little-endian f32
// files plus index.json (names, shapes, files). Throws minfer::Error naming
// the path on a write failure.
void dump_state(runtime::Session& session, const std::vector<float>& logits, int64_t n_out,
                const std::string& dir);

struct ObserveFlags {
    bool mem_report = false;
    std::string mem_report_file;
    std::string mem_report_json;
    bool dump_graph = false;
    std::string dump_graph_json;
    std::string trace_file;  // from MINFER_TRACE
    std::string state_dir;   // from MINFER_GRAPH_DUMP

    void add_to(ArgParser& p);
    // Reads the environment, then installs the recorders the flags ask for.
    void attach(runtime::Session& session);
    // Writes every report asked for. meta: free-form fields for the trace.
    void finish(runtime::Session& session, const nlohmann::json& meta = {});

  private:
    std::unique_ptr<MemoryRecorder> mem_;
    std::unique_ptr<GraphRecorder> graphs_;
};

// Writes text to path, throwing minfer::Error naming it on failure.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace minfer::report
