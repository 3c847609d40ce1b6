// A loaded model: hyper-parameters and weights read from a GGUF file and
// checked against each other. Weights stay in the memory-mapped file; the
// TensorViews here point into it.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf.h"
#include "tensor/tensor_view.h"

namespace minfer::model {

// qwen2moe / qwen3moe: qwen2's / qwen3's attention, a mixture-of-experts
// feed-forward block (a router, n_expert SwiGLU experts of which each token
// uses n_expert_used; qwen2moe adds a gated shared expert).
enum class Arch { Qwen2, Qwen3, Qwen2Moe, Qwen3Moe };

struct HParams {
    Arch arch = Arch::Qwen2;
    std::string arch_name;  // general.architecture
    int64_t n_vocab = 0;
    int64_t n_ctx_train = 0;  // <arch>.context_length
    int64_t n_embd = 0;
    int64_t n_layer = 0;
    int64_t n_ff = 0;           // dense FFN width; for MoE files the key may be absent (then 0)
    int64_t n_expert = 0;       // <arch>.expert_count (MoE only)
    int64_t n_expert_used = 0;  // <arch>.expert_used_count: experts per token
    int64_t n_ff_exp = 0;       // <arch>.expert_feed_forward_length: one expert's width
    int64_t n_ff_shexp = 0;     // <arch>.expert_shared_feed_forward_length (qwen2moe)
    int64_t n_head = 0;
    int64_t n_head_kv = 0;
    int64_t head_dim = 0;  // <arch>.attention.key_length, else n_embd / n_head
    float rms_eps = 1e-6f;
    float rope_freq_base = 10000.0f;

    bool moe() const { return arch == Arch::Qwen2Moe || arch == Arch::Qwen3Moe; }
    // qwen2's attention (Q/K/V biases) or qwen3's (per-head Q/K RMS norms)
    bool qkv_bias() const { return arch == Arch::Qwen2 || arch == Arch::Qwen2Moe; }
    // qwen3moe renormalizes the chosen experts' weights to sum 1, qwen2moe not
    bool moe_norm_weights() const { return arch == Arch::Qwen3Moe; }
    int64_t n_embd_q() const { return n_head * head_dim; }
    int64_t n_embd_kv() const { return n_head_kv * head_dim; }
};

// Reads and checks hyper-parameters. Throws minfer::Error naming the key for
// an unknown architecture, a missing or out-of-range value, or RoPE scaling.
HParams load_hparams(const gguf::File& file);

struct LayerWeights {
    const tensor::TensorView* attn_norm = nullptr;  // [n_embd]
    const tensor::TensorView* wq = nullptr;         // [n_embd, n_embd_q]
    const tensor::TensorView* wk = nullptr;         // [n_embd, n_embd_kv]
    const tensor::TensorView* wv = nullptr;         // [n_embd, n_embd_kv]
    const tensor::TensorView* bq = nullptr;         // [n_embd_q]   qwen2 only
    const tensor::TensorView* bk = nullptr;         // [n_embd_kv]  qwen2 only
    const tensor::TensorView* bv = nullptr;         // [n_embd_kv]  qwen2 only
    const tensor::TensorView* q_norm = nullptr;     // [head_dim]   qwen3 only
    const tensor::TensorView* k_norm = nullptr;     // [head_dim]   qwen3 only
    const tensor::TensorView* wo = nullptr;         // [n_embd_q, n_embd]
    const tensor::TensorView* ffn_norm = nullptr;   // [n_embd]
    const tensor::TensorView* w_gate = nullptr;     // [n_embd, n_ff]
    const tensor::TensorView* w_up = nullptr;       // [n_embd, n_ff]
    const tensor::TensorView* w_down = nullptr;     // [n_ff, n_embd]
    // MoE layers (no w_gate / w_up / w_down): the router and the experts,
    // expert e's matrix the 2-D slice e of the 3-D tensors
    const tensor::TensorView* ffn_gate_inp = nullptr;   // [n_embd, n_expert] f32
    const tensor::TensorView* ffn_gate_exps = nullptr;  // [n_embd, n_ff_exp, n_expert]
    const tensor::TensorView* ffn_up_exps = nullptr;    // [n_embd, n_ff_exp, n_expert]
    const tensor::TensorView* ffn_down_exps = nullptr;  // [n_ff_exp, n_embd, n_expert]
    // qwen2moe's shared expert, scaled by sigmoid(ffn_gate_inp_shexp . x)
    const tensor::TensorView* ffn_gate_inp_shexp = nullptr;  // [n_embd] f32
    const tensor::TensorView* ffn_gate_shexp = nullptr;      // [n_embd, n_ff_shexp]
    const tensor::TensorView* ffn_up_shexp = nullptr;        // [n_embd, n_ff_shexp]
    const tensor::TensorView* ffn_down_shexp = nullptr;      // [n_ff_shexp, n_embd]
};

struct Model {
    gguf::File file;
    HParams hp;
    const tensor::TensorView* tok_embd = nullptr;     // [n_embd, n_vocab]
    const tensor::TensorView* output_norm = nullptr;  // [n_embd]
    const tensor::TensorView* output = nullptr;       // [n_embd, n_vocab]; == tok_embd when tied
    bool tied_output = false;
    std::vector<LayerWeights> layers;
    size_t weight_bytes = 0;  // bytes of all tensors
    // After interleave_weights regrouped any (> 0): this many bytes of the
    // weights are regrouped 16 rows at a time, and all of them live in
    // anonymous memory, not the mapped file.
    size_t regrouped_bytes = 0;

    Model() = default;
    Model(Model&&) = default;  // a deque keeps element addresses across moves
    Model& operator=(Model&&) = default;
    Model(const Model&) = delete;  // the layer pointers would dangle into the copy's source
    Model& operator=(const Model&) = delete;

    // Opens, validates and binds every weight. Throws minfer::Error naming the
    // file and the key or tensor at fault.
    static Model load(const std::string& path);
    static Model from_file(gguf::File file);

    // Regroups the matmul weights (the layers' projections and the output,
    // tied to token_embd or not) into the interleaved layout of
    // tensor/interleave.h where their type has one, in buffers the model
    // owns, copies the other weights it reads there as they are, and drops
    // their pages of the mapped file: the same bytes resident, read faster
    // by the CPU kernels. Returns the bytes regrouped.
    // keep(type), when given, limits the regrouping to the types it accepts
    // (the CPU kernels at hand); with none accepted nothing moves.
    size_t interleave_weights(const std::function<bool(tensor::DType)>& keep = nullptr);

    // Every bound weight, in file order (an output tied to token_embd is one
    // view).
    const std::deque<tensor::TensorView>& weights() const { return views_; }

  private:
    struct Arena {  // an anonymous mapping the weights were moved into
        uint8_t* data = nullptr;
        size_t size = 0;
        Arena(uint8_t* d, size_t n) : data(d), size(n) {}
        Arena(Arena&& o) noexcept : data(std::exchange(o.data, nullptr)), size(o.size) {}
        Arena& operator=(Arena&& o) noexcept {
            std::swap(data, o.data);
            std::swap(size, o.size);
            return *this;
        }
        ~Arena();
    };
    std::deque<tensor::TensorView> views_;  // stable addresses for the pointers above
    std::vector<Arena> arenas_;
    const tensor::TensorView* bind(const std::string& name, std::vector<int64_t> shape,
                                   bool required, bool f32_only);
};

}  // namespace minfer::model
