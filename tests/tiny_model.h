// Test support: writes small but complete qwen2 / qwen3 GGUF files with the
// project's own GGUF writer and quantizers, so that a fresh clone tests the
// whole pipeline without ../shared. Random weights (fixed seed), a byte-level
// vocabulary of 256 byte tokens + a few merges + Qwen's control tokens.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "model/model.h"
#include "tensor/dtype.h"
#include "tensor/quants.h"

namespace minfer::testing {

struct TinyModelSpec {
    std::string arch = "qwen2";  // or "qwen3", "qwen2moe", "qwen3moe"
    int64_t n_embd = 64;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t head_dim = 16;  // written as key_length for qwen3
    int64_t n_ff = 96;
    int64_t n_layer = 2;
    int64_t n_ctx_train = 256;
    float rope_freq_base = 10000.0f;
    float rms_eps = 1e-6f;
    tensor::DType weight_type = tensor::DType::F32;  // 2-D weights (row length must fit the blocks)
    bool tied_output = true;
    std::optional<tensor::DType> output_type;  // untied output's type (default weight_type)
    uint32_t seed = 1;
    // Changes a tensor's values (by name) before it is written: a test's
    // model with a behaviour it can predict.
    std::function<void(const std::string& name, std::vector<float>& values)> edit;
    // MoE archs: experts of n_ff_exp (n_ff is then written but unused);
    // qwen2moe's shared expert has n_ff_shexp
    int64_t n_expert = 8;
    int64_t n_expert_used = 2;
    int64_t n_ff_exp = 32;
    int64_t n_ff_shexp = 64;
    bool moe() const { return arch == "qwen2moe" || arch == "qwen3moe"; }
    bool qk_norm() const { return arch == "qwen3" || arch == "qwen3moe"; }
};

// GPT-2's byte -> unicode code point mapping, UTF-8 encoded.
inline std::string byte_token_text(int b) {
    int cp;
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255)) {
        cp = b;
    } else {
        int n = 0;
        for (int x = 0; x < b; ++x)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) ++n;
        cp = 256 + n;
    }
    std::string s;
    if (cp < 0x80) {
        s += static_cast<char>(cp);
    } else {
        s += static_cast<char>(0xC0 | (cp >> 6));
        s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    return s;
}

// Vocabulary: 256 byte tokens, merges for "th", "the", "Ġt", "Ġthe", then
// <|endoftext|> (control), <|im_start|>, <|im_end|> (control), <think> (user-defined).
inline void add_tiny_vocab(gguf::Writer& w, int64_t* n_vocab_out) {
    std::vector<std::string> tokens;
    std::vector<int32_t> types;
    for (int b = 0; b < 256; ++b) {
        tokens.push_back(byte_token_text(b));
        types.push_back(1);
    }
    const std::string G = byte_token_text(' ');  // "Ġ"
    std::vector<std::string> merges = {"t h", "th e", G + " t", G + "t he"};
    for (const auto& m : merges) {
        std::string joined = m;
        joined.erase(joined.find(' '), 1);
        tokens.push_back(joined);
        types.push_back(1);
    }
    for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
        tokens.push_back(s);
        types.push_back(3);
    }
    tokens.push_back("<think>");
    types.push_back(4);
    const int64_t n_vocab = static_cast<int64_t>(tokens.size());
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "qwen2");
    w.set_string_array("tokenizer.ggml.tokens", tokens);
    w.set_i32_array("tokenizer.ggml.token_type", types);
    w.set_string_array("tokenizer.ggml.merges", merges);
    w.set_u32("tokenizer.ggml.eos_token_id", 260);  // <|endoftext|>
    w.set_u32("tokenizer.ggml.padding_token_id", 260);
    w.set_bool("tokenizer.ggml.add_bos_token", false);
    w.set_string("tokenizer.chat_template",
                 "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                 "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}");
    *n_vocab_out = n_vocab;
}

inline std::vector<uint8_t> encode_tensor(tensor::DType type, const std::vector<float>& x,
                                          int64_t ne0) {
    const int64_t rows = static_cast<int64_t>(x.size()) / ne0;
    const size_t rb = tensor::row_size(type, ne0);
    std::vector<uint8_t> out(rb * static_cast<size_t>(rows));
    if (type == tensor::DType::F32) {
        std::memcpy(out.data(), x.data(), out.size());
        return out;
    }
    for (int64_t r = 0; r < rows; ++r)
        tensor::quantize_row(type, x.data() + r * ne0, out.data() + static_cast<size_t>(r) * rb,
                             ne0);
    return out;
}

// Builds the model in memory; write it with .write(path) or .to_bytes().
inline gguf::Writer make_tiny_model(const TinyModelSpec& s) {
    gguf::Writer w;
    const std::string a = s.arch + ".";
    w.set_string("general.architecture", s.arch);
    w.set_string("general.name", "tiny-test-" + s.arch);
    w.set_u32(a + "context_length", static_cast<uint32_t>(s.n_ctx_train));
    w.set_u32(a + "embedding_length", static_cast<uint32_t>(s.n_embd));
    w.set_u32(a + "block_count", static_cast<uint32_t>(s.n_layer));
    w.set_u32(a + "feed_forward_length", static_cast<uint32_t>(s.n_ff));
    w.set_u32(a + "attention.head_count", static_cast<uint32_t>(s.n_head));
    w.set_u32(a + "attention.head_count_kv", static_cast<uint32_t>(s.n_head_kv));
    w.set_f32(a + "rope.freq_base", s.rope_freq_base);
    w.set_f32(a + "attention.layer_norm_rms_epsilon", s.rms_eps);
    if (s.moe()) {
        w.set_u32(a + "expert_count", static_cast<uint32_t>(s.n_expert));
        w.set_u32(a + "expert_used_count", static_cast<uint32_t>(s.n_expert_used));
        w.set_u32(a + "expert_feed_forward_length", static_cast<uint32_t>(s.n_ff_exp));
        if (s.arch == "qwen2moe")
            w.set_u32(a + "expert_shared_feed_forward_length", static_cast<uint32_t>(s.n_ff_shexp));
    }
    if (s.qk_norm()) {
        w.set_u32(a + "attention.key_length", static_cast<uint32_t>(s.head_dim));
        w.set_u32(a + "attention.value_length", static_cast<uint32_t>(s.head_dim));
    }
    int64_t n_vocab = 0;
    add_tiny_vocab(w, &n_vocab);

    std::mt19937 rng(s.seed);
    auto gauss = [&](int64_t n, float sd) {
        std::normal_distribution<float> d(0.0f, sd);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = d(rng);
        return v;
    };
    auto norm_w = [&](int64_t n) {
        std::uniform_real_distribution<float> d(0.8f, 1.2f);
        std::vector<float> v(static_cast<size_t>(n));
        for (auto& x : v) x = d(rng);
        return v;
    };
    auto add = [&](const std::string& name, std::vector<int64_t> ne, std::vector<float> x,
                   tensor::DType type) {
        if (s.edit) s.edit(name, x);
        w.add_tensor(name, type, ne, encode_tensor(type, x, ne[0]));
    };
    const int64_t E = s.n_embd, Q = s.n_head * s.head_dim, KV = s.n_head_kv * s.head_dim;
    const float sd_in = 1.0f / std::sqrt(static_cast<float>(E));
    add("token_embd.weight", {E, n_vocab}, gauss(E * n_vocab, 1.0f), s.weight_type);
    add("output_norm.weight", {E}, norm_w(E), tensor::DType::F32);
    if (!s.tied_output)
        add("output.weight", {E, n_vocab}, gauss(E * n_vocab, sd_in),
            s.output_type.value_or(s.weight_type));
    for (int64_t il = 0; il < s.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        add(p + "attn_norm.weight", {E}, norm_w(E), tensor::DType::F32);
        add(p + "attn_q.weight", {E, Q}, gauss(E * Q, sd_in), s.weight_type);
        add(p + "attn_k.weight", {E, KV}, gauss(E * KV, sd_in), s.weight_type);
        add(p + "attn_v.weight", {E, KV}, gauss(E * KV, sd_in), s.weight_type);
        if (!s.qk_norm()) {
            add(p + "attn_q.bias", {Q}, gauss(Q, 0.1f), tensor::DType::F32);
            add(p + "attn_k.bias", {KV}, gauss(KV, 0.1f), tensor::DType::F32);
            add(p + "attn_v.bias", {KV}, gauss(KV, 0.1f), tensor::DType::F32);
        } else {
            add(p + "attn_q_norm.weight", {s.head_dim}, norm_w(s.head_dim), tensor::DType::F32);
            add(p + "attn_k_norm.weight", {s.head_dim}, norm_w(s.head_dim), tensor::DType::F32);
        }
        add(p + "attn_output.weight", {Q, E}, gauss(Q * E, 1.0f / std::sqrt((float)Q)),
            s.weight_type);
        add(p + "ffn_norm.weight", {E}, norm_w(E), tensor::DType::F32);
        if (s.moe()) {
            const int64_t X = s.n_expert, FX = s.n_ff_exp, FS = s.n_ff_shexp;
            // a router of sd 1 gives distinct, far-from-tied expert choices
            add(p + "ffn_gate_inp.weight", {E, X}, gauss(E * X, 1.0f), tensor::DType::F32);
            add(p + "ffn_gate_exps.weight", {E, FX, X}, gauss(E * FX * X, sd_in), s.weight_type);
            add(p + "ffn_up_exps.weight", {E, FX, X}, gauss(E * FX * X, sd_in), s.weight_type);
            add(p + "ffn_down_exps.weight", {FX, E, X},
                gauss(FX * E * X, 1.0f / std::sqrt((float)FX)), s.weight_type);
            if (s.arch == "qwen2moe") {
                add(p + "ffn_gate_inp_shexp.weight", {E}, gauss(E, sd_in), tensor::DType::F32);
                add(p + "ffn_gate_shexp.weight", {E, FS}, gauss(E * FS, sd_in), s.weight_type);
                add(p + "ffn_up_shexp.weight", {E, FS}, gauss(E * FS, sd_in), s.weight_type);
                add(p + "ffn_down_shexp.weight", {FS, E},
                    gauss(FS * E, 1.0f / std::sqrt((float)FS)), s.weight_type);
            }
            continue;
        }
        add(p + "ffn_gate.weight", {E, s.n_ff}, gauss(E * s.n_ff, sd_in), s.weight_type);
        add(p + "ffn_up.weight", {E, s.n_ff}, gauss(E * s.n_ff, sd_in), s.weight_type);
        add(p + "ffn_down.weight", {s.n_ff, E}, gauss(s.n_ff * E, 1.0f / std::sqrt((float)s.n_ff)),
            s.weight_type);
    }
    return w;
}

// A tiny model loaded from its bytes; the bytes stay alive beside the model
// (its weights point into them).
struct LoadedTinyModel {
    std::vector<uint8_t> bytes;
    model::Model model;
};
inline std::unique_ptr<LoadedTinyModel> load_tiny_model(const TinyModelSpec& s) {
    auto l = std::make_unique<LoadedTinyModel>();
    l->bytes = make_tiny_model(s).to_bytes();
    l->model = model::Model::from_file(gguf::File::parse(l->bytes.data(), l->bytes.size()));
    return l;
}

}  // namespace minfer::testing
