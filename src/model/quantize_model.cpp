#include "model/quantize_model.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "gguf/file_type.h"
#include "gguf/gguf.h"
#include "tensor/quants.h"
#include "util/error.h"

namespace minfer::model {

namespace {

// llama.cpp's enum llama_ftype ids of the file types handled here.
enum FType : uint32_t {
    kF32 = 0,
    kF16 = 1,
    kQ4_0 = 2,
    kQ4_1 = 3,
    kQ8_0 = 7,
    kQ5_0 = 8,
    kQ5_1 = 9,
    kQ2_K = 10,
    kQ3_K_S = 11,
    kQ3_K_M = 12,
    kQ3_K_L = 13,
    kQ4_K_S = 14,
    kQ4_K_M = 15,
    kQ5_K_S = 16,
    kQ5_K_M = 17,
    kQ6_K = 18,
    kIQ4_NL = 25,
    kIQ4_XS = 30,
    kBF16 = 32,
};

constexpr uint32_t kQuantizationVersion = 2;  // ggml's GGML_QNT_VERSION

enum class Category {
    TokenEmbd,
    Output,
    AttnV,
    AttnK,
    AttnQ,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Other
};

Category categorize(const std::string& name) {
    auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
    if (name == "output.weight") return Category::Output;
    if (name == "token_embd.weight") return Category::TokenEmbd;
    // attn_qkv / attn_kv_b count as attn_v, as in llama.cpp.
    if (has("attn_qkv.weight") || has("attn_kv_b.weight") || has("attn_v.weight"))
        return Category::AttnV;
    if (has("attn_k.weight")) return Category::AttnK;
    if (has("attn_q.weight")) return Category::AttnQ;
    if (has("attn_output.weight")) return Category::AttnOutput;
    if (has("ffn_up")) return Category::FfnUp;
    if (has("ffn_gate")) return Category::FfnGate;
    if (has("ffn_down")) return Category::FfnDown;
    return Category::Other;
}

int n_dims_of(const std::array<int64_t, 4>& ne) {
    for (int i = 3; i >= 1; --i)
        if (ne[i] > 1) return i + 1;
    return 1;
}

// Whether llama.cpp quantizes the tensor at all: 2-D and up, named *weight,
// not a norm (the Qwen-relevant part of tensor_allows_quantization).
bool allows_quantization(const std::string& name, const std::array<int64_t, 4>& ne) {
    if (n_dims_of(ne) < 2) return false;
    const std::string suffix = "weight";
    if (name.size() < suffix.size() ||
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0)
        return false;
    if (name.find("_norm.weight") != std::string::npos) return false;
    if (name.find("ffn_gate_inp.weight") != std::string::npos) return false;
    return true;
}

// "blk.12.ffn_down.weight" -> 12; -1 for tensors outside a block.
int layer_of(const std::string& name) {
    if (name.rfind("blk.", 0) != 0) return -1;
    int v = 0;
    size_t i = 4;
    if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9') v = v * 10 + (name[i++] - '0');
    return v;
}

// llama.cpp: the layers an _M mix gives more bits (first and last eighth,
// and every third layer in between).
bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 ||
           (i_layer - n_layers / 8) % 3 == 2;
}

DType default_type(uint32_t ftype) {
    switch (ftype) {
        case kF32:
            return DType::F32;
        case kF16:
            return DType::F16;
        case kBF16:
            return DType::BF16;
        case kQ4_0:
            return DType::Q4_0;
        case kQ4_1:
            return DType::Q4_1;
        case kQ5_0:
            return DType::Q5_0;
        case kQ5_1:
            return DType::Q5_1;
        case kQ8_0:
            return DType::Q8_0;
        case kQ2_K:
            return DType::Q2_K;
        case kQ3_K_S:
        case kQ3_K_M:
        case kQ3_K_L:
            return DType::Q3_K;
        case kQ4_K_S:
        case kQ4_K_M:
            return DType::Q4_K;
        case kQ5_K_S:
        case kQ5_K_M:
            return DType::Q5_K;
        case kQ6_K:
            return DType::Q6_K;
        case kIQ4_NL:
            return DType::IQ4_NL;
        case kIQ4_XS:
            return DType::IQ4_XS;
    }
    throw Error("quantize: file type id " + std::to_string(ftype) + " is not supported");
}

// llama_tensor_get_type_impl, for the file types above and a non-Falcon
// model. For MoE files llama.cpp takes every ffn_down's layer (dense, the
// experts' and the shared expert's) from its name, as layer_of does here,
// keeps the router (ffn_gate_inp) in F32 (allows_quantization), and gives
// a model of exactly 8 experts Q8_0 attn_k / attn_v and a Q5_K attn_output
// in the low-bit mixes.
DType mix_rule(uint32_t ftype, const ModelQuantInfo& info, Category cat, int i_layer, int64_t nx,
               DType t, std::string* why) {
    auto set = [&](DType nt, const char* reason) {
        if (nt != t && why) *why = reason;
        t = nt;
    };
    if (cat == Category::Output || (!info.has_output && cat == Category::TokenEmbd)) {
        if (nx % traits(t).block_size != 0)
            set(DType::Q8_0, "output: row not a multiple of the block");
        else if (t != DType::Q8_0)
            set(DType::Q6_K, "output tensor");
        return t;
    }
    if (cat == Category::TokenEmbd) return t;
    const int n_layer = info.n_layer;
    if (cat == Category::AttnV) {
        const char* r = "attn_v gets more bits";
        if (ftype == kQ2_K)
            set(info.n_gqa >= 4 ? DType::Q4_K : DType::Q3_K, r);
        else if (ftype == kQ3_K_M)
            set(i_layer < 2 ? DType::Q5_K : DType::Q4_K, r);
        else if (ftype == kQ3_K_L)
            set(DType::Q5_K, r);
        else if ((ftype == kIQ4_NL || ftype == kIQ4_XS) && info.n_gqa >= 4)
            set(DType::Q5_K, r);
        else if ((ftype == kQ4_K_M || ftype == kQ5_K_M) && use_more_bits(i_layer, info.n_attn_v))
            set(DType::Q6_K, "attn_v: use_more_bits layer");
        else if (ftype == kQ4_K_S && i_layer < 4)
            set(DType::Q5_K, "attn_v: first 4 layers");
        if (info.n_expert == 8) set(DType::Q8_0, "attn_v: 8-expert model");
    } else if (cat == Category::AttnK) {
        if (info.n_expert == 8) set(DType::Q8_0, "attn_k: 8-expert model");
    } else if (cat == Category::FfnDown) {
        if (ftype == kQ2_K)
            set(DType::Q3_K, "ffn_down gets more bits");
        else if (ftype == kQ3_K_M)
            set(i_layer < n_layer / 16 ? DType::Q5_K : DType::Q4_K, "ffn_down gets more bits");
        else if (ftype == kQ3_K_L)
            set(DType::Q5_K, "ffn_down gets more bits");
        else if (ftype == kQ4_K_M) {
            if (use_more_bits(i_layer, n_layer)) set(DType::Q6_K, "ffn_down: use_more_bits layer");
        } else if (i_layer < n_layer / 8 && (ftype == kIQ4_NL || ftype == kIQ4_XS))
            set(DType::Q5_K, "ffn_down: first eighth of the layers");
        else if (ftype == kQ5_K_M && use_more_bits(i_layer, n_layer))
            set(DType::Q6_K, "ffn_down: use_more_bits layer");
        else if (ftype == kQ4_K_S && i_layer < n_layer / 8)
            set(DType::Q5_K, "ffn_down: first eighth of the layers");
    } else if (cat == Category::AttnOutput && info.n_expert == 8) {
        if (ftype == kQ2_K || ftype == kQ3_K_S || ftype == kQ3_K_M || ftype == kIQ4_NL ||
            ftype == kQ4_K_S || ftype == kQ4_K_M || ftype == kIQ4_XS)
            set(DType::Q5_K, "attn_output: 8-expert model");
    } else if (cat == Category::AttnOutput) {
        if (ftype == kQ2_K)
            set(DType::Q3_K, "attn_output gets more bits");
        else if (ftype == kQ3_K_M)
            set(DType::Q4_K, "attn_output gets more bits");
        else if (ftype == kQ3_K_L)
            set(DType::Q5_K, "attn_output gets more bits");
    }
    return t;
}

// tensor_type_fallback: a row length the type's block does not divide.
DType fallback(DType t, int64_t nx, std::string* why) {
    if (nx % traits(t).block_size == 0) return t;
    DType r;
    switch (t) {
        case DType::IQ4_XS:
            r = DType::IQ4_NL;
            break;
        case DType::Q2_K:
        case DType::Q3_K:
            r = DType::Q4_0;
            break;
        case DType::Q4_K:
            r = DType::Q5_0;
            break;
        case DType::Q5_K:
            r = DType::Q5_1;
            break;
        case DType::Q6_K:
            r = DType::Q8_0;
            break;
        default:
            r = DType::F16;
            break;
    }
    if (nx % traits(r).block_size != 0) r = DType::F16;
    if (why)
        *why = "row " + std::to_string(nx) + " not a multiple of " +
               std::to_string(traits(t).block_size) + " (" + std::string(dtype_name(t)) + ")";
    return r;
}

// Converts rows [r0, r1) of `src` to `dst_type` into `dst`, accumulating the
// round-trip error against the F32 value of the source.
void convert_rows(const gguf::TensorInfo& src, DType dst_type, uint8_t* dst, int64_t r0, int64_t r1,
                  double* sum_sq_err, double* sum_sq) {
    const int64_t n = src.ne[0];
    const size_t in_row = row_size(src.type, n), out_row = row_size(dst_type, n);
    std::vector<float> w(static_cast<size_t>(n)), back(static_cast<size_t>(n));
    double e2 = 0, w2 = 0;
    for (int64_t r = r0; r < r1; ++r) {
        dequantize_row(src.type, src.data + static_cast<size_t>(r) * in_row, w.data(), n);
        uint8_t* q = dst + static_cast<size_t>(r) * out_row;
        quantize_row(dst_type, w.data(), q, n);
        dequantize_row(dst_type, q, back.data(), n);
        for (int64_t j = 0; j < n; ++j) {
            const double d = static_cast<double>(w[j]) - back[j];
            e2 += d * d;
            w2 += static_cast<double>(w[j]) * w[j];
        }
    }
    *sum_sq_err = e2;
    *sum_sq = w2;
}

}  // namespace

const std::vector<std::string_view>& quantize_file_types() {
    static const std::vector<std::string_view> names = {
        "F32",    "F16",    "BF16",   "Q8_0",   "Q4_0",   "Q4_1",   "Q5_0",
        "Q5_1",   "Q2_K",   "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
        "Q5_K_S", "Q5_K_M", "Q6_K",   "IQ4_NL", "IQ4_XS"};
    return names;
}

DType choose_tensor_type(uint32_t ftype_id, const ModelQuantInfo& info, const std::string& name,
                         const std::array<int64_t, 4>& ne, DType in_type, std::string* note) {
    if (!allows_quantization(name, ne)) return in_type;
    DType t = default_type(ftype_id);
    // As llama.cpp: the mixture rules and the fallback only for quantized
    // targets; an F16 / BF16 / F32 file converts every weight alike.
    if (!traits(t).quantized) return t;
    t = mix_rule(ftype_id, info, categorize(name), layer_of(name), ne[0], t, note);
    return fallback(t, ne[0], note);
}

double QuantizeReport::total_rel_rmse() const {
    double e2 = 0, w2 = 0;
    for (const auto& t : tensors)
        if (t.converted) {
            e2 += t.sum_sq_err;
            w2 += t.sum_sq;
        }
    return w2 > 0 ? std::sqrt(e2 / w2) : 0.0;
}

std::map<DType, double> QuantizeReport::mean_rel_rmse_by_type() const {
    std::map<DType, std::pair<double, int>> acc;
    for (const auto& t : tensors) {
        if (!t.converted || n_dims_of(t.ne) < 2 || t.name == "token_embd.weight") continue;
        auto& a = acc[t.out_type];
        a.first += t.rel_rmse();
        a.second += 1;
    }
    std::map<DType, double> out;
    for (const auto& [type, a] : acc) out[type] = a.first / a.second;
    return out;
}

QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              std::string_view file_type, const QuantizeOptions& options) {
    const auto t_start = std::chrono::steady_clock::now();
    QuantizeReport report;
    const auto ftype = gguf::file_type_from_name(file_type);
    bool known = false;
    if (ftype) {
        const auto short_name = gguf::file_type_short_name(*ftype);
        for (auto n : quantize_file_types()) known |= short_name && n == *short_name;
    }
    if (!known) {
        std::string list;
        for (auto n : quantize_file_types()) {
            if (!list.empty()) list += ", ";
            list += n;
        }
        throw Error("quantize: unknown file type '" + std::string(file_type) + "' (valid: " + list +
                    ")");
    }
    report.file_type = *ftype;
    report.file_type_name = std::string(*gguf::file_type_short_name(*ftype));

    const gguf::File in = gguf::File::open(in_path);

    // Refuse quantized input: requantizing compounds two roundings, and
    // llama.cpp refuses it too unless told otherwise.
    for (const auto& t : in.tensors()) {
        if (t.type != DType::F32 && t.type != DType::F16 && t.type != DType::BF16 &&
            t.type != DType::I32)
            throw Error("quantize: " + in_path + ": tensor '" + t.name +
                        "' is already quantized (" + std::string(dtype_name(t.type)) +
                        "); quantize needs an F32, F16 or BF16 model");
    }

    ModelQuantInfo info;
    const std::string arch = in.get_string("general.architecture").value_or("");
    for (const auto& t : in.tensors()) {
        if (categorize(t.name) == Category::AttnV) ++info.n_attn_v;
        if (t.name == "output.weight") info.has_output = true;
    }
    info.n_layer = static_cast<int>(in.get_int(arch + ".block_count").value_or(info.n_attn_v));
    const int64_t n_head = in.get_int(arch + ".attention.head_count").value_or(1);
    const int64_t n_head_kv = in.get_int(arch + ".attention.head_count_kv").value_or(n_head);
    info.n_gqa = n_head_kv > 0 ? static_cast<int>(n_head / n_head_kv) : 1;
    info.n_expert = static_cast<int>(in.get_int(arch + ".expert_count").value_or(0));

    gguf::Writer w;
    w.copy_metadata(in);
    w.set_u32("general.quantization_version", kQuantizationVersion);
    w.set_u32("general.file_type", report.file_type);

    int n_threads = options.n_threads > 0 ? options.n_threads
                                          : static_cast<int>(std::thread::hardware_concurrency());
    n_threads = std::max(1, n_threads);

    const auto& tensors = in.tensors();
    for (size_t ti = 0; ti < tensors.size(); ++ti) {
        const gguf::TensorInfo& src = tensors[ti];
        TensorQuantReport tr;
        tr.name = src.name;
        tr.ne = src.ne;
        tr.in_type = src.type;
        tr.in_bytes = src.nbytes;
        tr.out_type = src.type == DType::I32 ? DType::I32
                                             : choose_tensor_type(report.file_type, info, src.name,
                                                                  src.ne, src.type, &tr.note);
        if (options.progress) options.progress(ti, tensors.size(), tr, false);

        std::vector<uint8_t> out;
        std::vector<int64_t> ne(src.ne.begin(), src.ne.begin() + src.n_dims);
        if (tr.out_type == src.type) {
            out.assign(src.data, src.data + src.nbytes);
        } else {
            tr.converted = true;
            const int64_t rows = src.ne[1] * src.ne[2] * src.ne[3];
            out.resize(row_size(tr.out_type, src.ne[0]) * static_cast<size_t>(rows));
            // Rows split evenly over the threads; each thread's sums are
            // combined in thread order.
            const int nt =
                static_cast<int>(std::min<int64_t>(n_threads, std::max<int64_t>(1, rows / 16)));
            std::vector<double> e2(nt), w2(nt);
            std::vector<std::thread> pool;
            for (int k = 0; k < nt; ++k) {
                const int64_t r0 = rows * k / nt, r1 = rows * (k + 1) / nt;
                auto job = [&, k, r0, r1] {
                    convert_rows(src, tr.out_type, out.data(), r0, r1, &e2[k], &w2[k]);
                };
                if (k + 1 < nt)
                    pool.emplace_back(job);
                else
                    job();
            }
            for (auto& th : pool) th.join();
            for (int k = 0; k < nt; ++k) {
                tr.sum_sq_err += e2[k];
                tr.sum_sq += w2[k];
            }
        }
        tr.out_bytes = out.size();
        report.in_bytes += tr.in_bytes;
        report.out_bytes += tr.out_bytes;
        w.add_tensor(src.name, tr.out_type, std::move(ne), std::move(out));
        report.tensors.push_back(tr);
        if (options.progress) options.progress(ti, tensors.size(), report.tensors.back(), true);
    }
    w.write(out_path);
    report.elapsed_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    return report;
}

}  // namespace minfer::model
