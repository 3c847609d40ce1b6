// minfer quantize IN OUT TYPE: llama.cpp's file types with llama.cpp's
// per-tensor rules, reporting the error every tensor picked up.
#include <cstdio>
#include <filesystem>
#include <string>

#include "commands.h"
#include "model/quantize_model.h"
#include "util/args.h"
#include "util/error.h"

namespace minfer::cli {

namespace {

std::string type_list() {
    std::string s;
    for (auto n : model::quantize_file_types()) {
        if (!s.empty()) s += ", ";
        s += n;
    }
    return s;
}

std::string shape_of(const model::TensorQuantReport& t) {
    std::string s = std::to_string(t.ne[0]);
    int nd = 1;
    for (int i = 3; i >= 1; --i)
        if (t.ne[i] > 1) {
            nd = i + 1;
            break;
        }
    for (int i = 1; i < nd; ++i) {
        s += 'x';
        s += std::to_string(t.ne[i]);
    }
    return s;
}

}  // namespace

int cmd_quantize(int argc, char** argv, int first) {
    std::string in_path, out_path, type;
    int n_threads = 0;
    ArgParser p("minfer quantize", "Convert an F32/F16/BF16 GGUF model to another file type.");
    p.positional("IN", &in_path, "input GGUF model (F32, F16 or BF16 tensors)", true);
    p.positional("OUT", &out_path, "output GGUF file to write", true);
    p.positional("TYPE", &type, "file type: " + type_list(), true);
    p.option({"-t", "--threads"}, &n_threads, "N", "threads (0 = all cores)");
    p.epilog(
        "Each tensor's type follows llama.cpp's rules for TYPE (e.g. Q4_K_M gives attn_v and\n"
        "ffn_down of some layers Q6_K, the output matrix Q6_K, 1-D tensors stay as they are,\n"
        "rows not a multiple of 256 fall back to Q5_0/Q5_1/Q8_0/Q4_0/IQ4_NL). stderr gets the\n"
        "progress, a table of every tensor's relative RMSE ||w - deq(q(w))|| / ||w|| and the\n"
        "mean per quantized type (2-D weights, token_embd excluded).\n\n"
        "  minfer quantize model-f32.gguf model-q4_k_m.gguf Q4_K_M");
    if (!p.parse(argc, argv, first)) return 0;
    if (!std::filesystem::exists(in_path)) throw Error("quantize: input not found: " + in_path);

    model::QuantizeOptions opt;
    opt.n_threads = n_threads;
    opt.progress = [](size_t i, size_t n, const model::TensorQuantReport& t, bool done) {
        if (!done) return;
        std::fprintf(stderr, "[%4zu/%zu] %-32s %-12s %-6s -> %-6s", i + 1, n, t.name.c_str(),
                     shape_of(t).c_str(), std::string(tensor::dtype_name(t.in_type)).c_str(),
                     std::string(tensor::dtype_name(t.out_type)).c_str());
        if (t.converted)
            std::fprintf(stderr, "  rel_rmse %.5f", t.rel_rmse());
        else
            std::fprintf(stderr, "  (copied)");
        if (!t.note.empty()) std::fprintf(stderr, "  [%s]", t.note.c_str());
        std::fprintf(stderr, "\n");
    };
    const model::QuantizeReport r = model::quantize_model(in_path, out_path, type, opt);

    std::fprintf(stderr, "\n%-32s %-12s %-6s %10s\n", "tensor", "shape", "type", "rel_rmse");
    for (const auto& t : r.tensors) {
        if (!t.converted) continue;
        std::fprintf(stderr, "%-32s %-12s %-6s %10.5f\n", t.name.c_str(), shape_of(t).c_str(),
                     std::string(tensor::dtype_name(t.out_type)).c_str(), t.rel_rmse());
    }
    std::fprintf(stderr, "\nmean relative RMSE by type (2-D weights, token_embd excluded):\n");
    for (const auto& [type_id, mean] : r.mean_rel_rmse_by_type())
        std::fprintf(stderr, "  %-6s %.5f\n", std::string(tensor::dtype_name(type_id)).c_str(),
                     mean);
    std::fprintf(stderr, "total relative RMSE (all converted tensors): %.5f\n", r.total_rel_rmse());
    std::fprintf(stderr, "%s: %.2f MiB -> %.2f MiB (%s), %.1f s\n", out_path.c_str(),
                 r.in_bytes / 1048576.0, r.out_bytes / 1048576.0, r.file_type_name.c_str(),
                 r.elapsed_s);
    return 0;
}

}  // namespace minfer::cli
