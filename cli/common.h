// Flags and steps shared by several subcommands.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/model.h"
#include "runtime/session.h"
#include "structured/constraint.h"
#include "util/args.h"

namespace minfer::tokenizer {
class Tokenizer;
}

namespace minfer::cli {

// MINFER_BATCH_INVARIANT=1 (read where the flags are made, not kept).
bool batch_invariant_from_env();

// -t, -c, -b, -ctk, --queue-layers: the engine's knobs, added to a parser.
struct EngineFlags {
    int threads = 0;
    int64_t ctx_size = 4096;
    int64_t batch_size = 512;
    std::string kv_type = "f32";  // -ctk
    std::string kv_type_v;        // -ctv; empty = not given (follows -ctk); must equal -ctk
    std::string queue_layers;     // "A:B" — layers A..B-1 on the queue backend
    bool no_interleave = false;   // keep the weights in the file's layout
    // --batch-invariant; MINFER_BATCH_INVARIANT=1 sets the default.
    bool batch_invariant = batch_invariant_from_env();

    void add_to(ArgParser& p, bool with_ctx = true);
    // Fills the session options (n_ctx is set by the caller's context plan).
    runtime::SessionOptions session_options() const;
    // Loads the model and, unless --no-interleave, regroups its matmul
    // weights for the CPU kernels (Model::interleave_weights). First refuses
    // a file that does not fit in memory (runtime/memory_fit.h) with -c, -b
    // and logit_rows rows of logits per pass (1 for one sequence's next
    // token; a pass's every token for perplexity).
    model::Model load_model(const std::string& path, int64_t logit_rows = 1) const;
};

// Structured output (llama.cpp's flags): --json-schema, --json-schema-file,
// --grammar, --grammar-file; at most one.
struct ConstraintFlags {
    std::string json_schema, json_schema_file, grammar, grammar_file;

    // All four flags, or only --json-schema-file.
    void add_to(ArgParser& p, bool schema_file_only = false);
    bool given() const;
    // Throws UsageError when several are given.
    void check() const;
    // The GBNF of the flag given ("" when none). Throws minfer::Error naming
    // the flag, the file, and the keyword (with its JSON pointer) or the
    // grammar line and column at fault; UsageError when several are given.
    std::string gbnf() const;
    // The flag's constraint compiled for the tokenizer's vocabulary; null
    // when none is given. Throws as gbnf() does, or naming the rule a
    // grammar cannot compile for.
    std::shared_ptr<const structured::Constraint> compile(const tokenizer::Tokenizer& tok) const;
};

// "p50 12.3 us, p99 45.6 us, max 78.9 us over N tokens" of mask times.
std::string mask_time_summary(std::vector<float> mask_us);

// Reports go to stderr; this prints "minfer: warning: ..." once.
// "cpu kernels avx2 (MINFER_CPU; this CPU has avx512)": the level the kernels
// run at (backend/cpu/isa.h), for each command's first report line.
std::string cpu_kernels_note();

void warn(const std::string& message);

}  // namespace minfer::cli
