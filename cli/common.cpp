#include "common.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "backend/cpu/isa.h"
#include "runtime/memory_fit.h"
#include "structured/grammar.h"
#include "structured/json_schema.h"
#include "tensor/dtype.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"
#include "util/quantile.h"

namespace minfer::cli {

bool batch_invariant_from_env() {
    const char* e = std::getenv("MINFER_BATCH_INVARIANT");
    return e != nullptr && e[0] == '1';
}

void EngineFlags::add_to(ArgParser& p, bool with_ctx) {
    p.option({"-t", "--threads"}, &threads, "N", "threads (0 = the number of physical cores)");
    if (with_ctx)
        p.option({"-c", "--ctx-size"}, &ctx_size, "N", "context size in tokens (KV cache rows)");
    p.option({"-b", "--batch-size"}, &batch_size, "N",
             "tokens per forward pass while reading the prompt");
    p.option({"-ctk", "--cache-type-k"}, &kv_type, "TYPE", "K cache element type: f32 or f16");
    p.option({"-ctv", "--cache-type-v"}, &kv_type_v, "TYPE",
             "V cache element type: f32 or f16 (the same as -ctk; -ctk alone sets both)");
    p.option({"--queue-layers"}, &queue_layers, "A:B",
             "run layers A..B-1 on the queue backend (a GPU-like command queue; for testing)");
    p.flag({"--no-interleave"}, &no_interleave,
           "keep the matmul weights in the file's layout (by default those of a type the CPU "
           "kernels read faster 16 rows at a time are regrouped at load: same bytes, the "
           "file's pages released)");
    p.flag({"--batch-invariant"}, &batch_invariant,
           "every matmul through the batched (GEMM) kernels, decode too: a sequence's logits "
           "bitwise the same alone or batched whatever the weights' layout (slower decode; "
           "default: MINFER_BATCH_INVARIANT=1)");
}

void ConstraintFlags::add_to(ArgParser& p, bool schema_file_only) {
    if (!schema_file_only) {
        p.option({"-j", "--json-schema"}, &json_schema, "SCHEMA",
                 "constrain the output to JSON valid against this JSON Schema");
    }
    p.option({"-jf", "--json-schema-file"}, &json_schema_file, "FILE",
             "constrain the output to JSON valid against the JSON Schema in FILE");
    if (!schema_file_only) {
        p.option({"--grammar"}, &grammar, "GBNF",
                 "constrain the output to this grammar (llama.cpp's GBNF)");
        p.option({"--grammar-file"}, &grammar_file, "FILE",
                 "constrain the output to the grammar (GBNF) in FILE");
    }
}

bool ConstraintFlags::given() const {
    return !json_schema.empty() || !json_schema_file.empty() || !grammar.empty() ||
           !grammar_file.empty();
}

namespace {

std::string read_text_file(const std::string& flag, const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(flag + ": cannot read '" + path + "'");
    std::ostringstream os;
    os << in.rdbuf();
    return os.str();
}

}  // namespace

void ConstraintFlags::check() const {
    if (!json_schema.empty() + !json_schema_file.empty() + !grammar.empty() +
            !grammar_file.empty() >
        1)
        throw UsageError(
            "give one of --json-schema, --json-schema-file, --grammar, --grammar-file");
}

std::string ConstraintFlags::gbnf() const {
    check();
    // Each error names where the text came from, then what the converter or
    // the parser says is wrong (the keyword and its JSON pointer, or the
    // grammar's line and column).
    auto checked = [](const std::string& where, auto&& make) -> std::string {
        try {
            return make();
        } catch (const Error& e) {
            throw Error(where + ": " + e.what());
        }
    };
    if (!json_schema.empty())
        return checked("--json-schema",
                       [&] { return structured::json_schema_text_to_gbnf(json_schema); });
    if (!json_schema_file.empty()) {
        const std::string text = read_text_file("--json-schema-file", json_schema_file);
        return checked("--json-schema-file " + json_schema_file,
                       [&] { return structured::json_schema_text_to_gbnf(text); });
    }
    if (!grammar.empty())
        return checked("--grammar", [&] {
            structured::parse_gbnf(grammar);
            return grammar;
        });
    if (!grammar_file.empty()) {
        std::string text = read_text_file("--grammar-file", grammar_file);
        return checked("--grammar-file " + grammar_file, [&] {
            structured::parse_gbnf(text);
            return text;
        });
    }
    return "";
}

std::shared_ptr<const structured::Constraint> ConstraintFlags::compile(
    const tokenizer::Tokenizer& tok) const {
    const std::string text = gbnf();
    if (text.empty()) return nullptr;
    const std::string flag = !json_schema.empty()        ? "--json-schema"
                             : !json_schema_file.empty() ? "--json-schema-file " + json_schema_file
                             : !grammar.empty()          ? "--grammar"
                                                         : "--grammar-file " + grammar_file;
    auto vocab =
        std::make_shared<const structured::TokenVocab>(structured::TokenVocab::from_tokenizer(tok));
    try {
        return structured::compile_constraint(text, std::move(vocab),
                                              structured::Warm::InBackground);
    } catch (const Error& e) {
        throw Error(flag + ": " + e.what());
    }
}

std::string mask_time_summary(std::vector<float> mask_us) {
    if (mask_us.empty()) return "no tokens";
    std::sort(mask_us.begin(), mask_us.end());
    char buf[160];
    std::snprintf(buf, sizeof buf, "p50 %.1f us, p99 %.1f us, max %.1f us over %zu tokens",
                  quantile_of_sorted(mask_us, 0.50), quantile_of_sorted(mask_us, 0.99),
                  static_cast<double>(mask_us.back()), mask_us.size());
    return buf;
}

model::Model EngineFlags::load_model(const std::string& path, int64_t logit_rows) const {
    // Opening maps the file and reads its header only: nothing is resident
    // yet when a file too large for the machine is refused.
    model::Model m = model::Model::load(path);
    if (const auto avail = runtime::available_memory()) {
        const auto kv = tensor::dtype_from_name(kv_type);
        runtime::check_fits(runtime::estimate_memory(m.hp, m.weight_bytes, ctx_size, batch_size,
                                                     logit_rows, kv ? *kv : tensor::DType::F32),
                            *avail, path);
    }
    if (!no_interleave) runtime::regroup_weights_for_cpu(m);
    return m;
}

runtime::SessionOptions EngineFlags::session_options() const {
    runtime::SessionOptions o;
    if (threads < 0 || threads > 256) throw UsageError("-t must be between 0 and 256");
    if (batch_size < 1) throw UsageError("-b must be >= 1");
    o.n_threads = threads;
    o.n_batch = batch_size;
    o.batch_invariant = batch_invariant;
    auto t = tensor::dtype_from_name(kv_type);
    if (!t || (*t != tensor::DType::F32 && *t != tensor::DType::F16))
        throw UsageError("unsupported KV cache type '" + kv_type + "' (supported: f32, f16)");
    // One element type for both regions: without -ctv, V follows -ctk; an
    // explicit -ctv must name the same type (even -ctv f32 against -ctk f16:
    // silently giving an f16 V cache would not be what was asked for).
    if (!kv_type_v.empty() && kv_type_v != kv_type)
        throw UsageError("-ctk " + kv_type + " and -ctv " + kv_type_v +
                         " differ: K and V caches of different element types are not supported "
                         "(give one type, e.g. -ctk " +
                         kv_type + " alone)");
    o.kv_type = *t;
    if (!queue_layers.empty()) {
        int a = 0, b = 0;
        char extra = 0;
        if (std::sscanf(queue_layers.c_str(), "%d:%d%c", &a, &b, &extra) != 2 || a < 0 || b < a)
            throw UsageError("--queue-layers needs A:B with 0 <= A <= B, got '" + queue_layers +
                             "'");
        o.queue_first_layer = a;
        o.queue_end_layer = b;
    }
    return o;
}

std::string cpu_kernels_note() {
    const cpu::IsaLevel level = cpu::isa_level(), detected = cpu::isa_detected();
    std::string note = std::string("cpu kernels ") + cpu::isa_name(level);
    if (level == cpu::IsaLevel::Avx2 && cpu::cpu_has_avx_vnni()) {
        const char* vnni =
            cpu::avx_vnni_enabled() ? " with AVX-VNNI" : " without AVX-VNNI (MINFER_AVX_VNNI=0)";
        note.append(vnni);
    }
    if (level != detected)
        note += std::string(" (MINFER_CPU; this CPU has ") + cpu::isa_name(detected) + ")";
    return note;
}

void warn(const std::string& message) {
    std::fprintf(stderr, "minfer: warning: %s\n", message.c_str());
}

}  // namespace minfer::cli
