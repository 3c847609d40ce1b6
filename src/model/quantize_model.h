// Model quantization: read an F32 / F16 / BF16 GGUF, choose each tensor's
// type by llama.cpp's rules for the requested file type (Q4_K_M, Q8_0, ...),
// quantize with the reference quantizers, write a new GGUF, and measure the
// error each tensor picked up.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace minfer::model {

using tensor::DType;

// One tensor of the output file.
struct TensorQuantReport {
    std::string name;
    std::array<int64_t, 4> ne{1, 1, 1, 1};  // [row length, rows, ...]
    DType in_type = DType::F32;
    DType out_type = DType::F32;
    bool converted = false;  // false: bytes copied unchanged
    std::string note;        // why out_type differs from the file type's default
    size_t in_bytes = 0, out_bytes = 0;
    double sum_sq_err = 0;  // sum (w - deq(q(w)))^2, w taken as F32
    double sum_sq = 0;      // sum w^2
    // ||w - deq(q(w))|| / ||w||; 0 for a copied tensor (or an all-zero one).
    double rel_rmse() const { return sum_sq > 0 ? std::sqrt(sum_sq_err / sum_sq) : 0.0; }
};

struct QuantizeReport {
    uint32_t file_type = 0;                  // llama.cpp's ftype id, written as general.file_type
    std::string file_type_name;              // "Q4_K_M"
    std::vector<TensorQuantReport> tensors;  // in file order
    size_t in_bytes = 0, out_bytes = 0;      // tensor data only
    double elapsed_s = 0;

    // ||W - deq(q(W))|| / ||W|| over every converted tensor together.
    double total_rel_rmse() const;
    // Mean of the per-tensor relative RMSE, by output type, over the
    // converted 2-D weights except token_embd.weight (whose rows are
    // embeddings, not a matmul weight, and so are usually left out of the
    // comparison with llama.cpp's figures).
    std::map<DType, double> mean_rel_rmse_by_type() const;
};

struct QuantizeOptions {
    int n_threads = 0;  // 0: std::thread::hardware_concurrency()
    // Called before tensor i (0-based) of n starts and after it is done
    // (done = true, report filled in): progress for the CLI.
    std::function<void(size_t i, size_t n, const TensorQuantReport& t, bool done)> progress;
};

// The file types `quantize_model` accepts, by their short llama.cpp names
// ("F32", "F16", "BF16", "Q8_0", ..., "Q4_K_M", "IQ4_XS").
const std::vector<std::string_view>& quantize_file_types();

// Quantizes `in_path` to `out_path`. `file_type` is a short name from
// quantize_file_types() (case-insensitive; "MOSTLY_Q4_K_M" also works).
// Throws minfer::Error for an unknown file type, a missing / invalid input,
// an already quantized input tensor, or a write failure.
QuantizeReport quantize_model(const std::string& in_path, const std::string& out_path,
                              std::string_view file_type, const QuantizeOptions& options = {});

// ---- the per-tensor rules (llama.cpp's llama_tensor_get_type), for tests ----

// What the rules need to know about the whole model.
struct ModelQuantInfo {
    int n_layer = 0;          // <arch>.block_count (number of ffn_down tensors)
    int n_attn_v = 0;         // number of attn_v / attn_qkv tensors
    int n_gqa = 1;            // head_count / head_count_kv
    bool has_output = false;  // an output.weight exists (else token_embd is tied)
    int n_expert = 0;         // <arch>.expert_count (0: a dense model)
};

// The type of tensor `name` with shape `ne` (n_dims = ggml_n_dims(ne)) in a
// file of type `ftype_id`; `in_type` is returned for tensors that are not
// quantized (1-D, norms, non-weights). `note` (optional) gets the reason for
// a type other than the default. Layer indices come from the "blk.N." prefix.
DType choose_tensor_type(uint32_t ftype_id, const ModelQuantInfo& info, const std::string& name,
                         const std::array<int64_t, 4>& ne, DType in_type,
                         std::string* note = nullptr);

}  // namespace minfer::model
