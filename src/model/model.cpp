#include "model/model.h"

#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <sstream>

#include "tensor/interleave.h"
#include "util/error.h"
#include "util/huge_pages.h"

namespace minfer::model {

namespace {

std::string shape_str(const std::array<int64_t, 4>& ne, uint32_t n_dims) {
    std::ostringstream os;
    os << "[";
    for (uint32_t i = 0; i < n_dims; ++i) os << (i ? ", " : "") << ne[i];
    os << "]";
    return os.str();
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::ostringstream os;
    os << "[";
    for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
    os << "]";
    return os.str();
}

int64_t require_int(const gguf::File& f, const std::string& key, int64_t lo, int64_t hi) {
    auto v = f.get_int(key);
    if (!v) throw Error("'" + f.path() + "': missing hyper-parameter '" + key + "'");
    if (*v < lo || *v > hi)
        throw Error("'" + f.path() + "': hyper-parameter '" + key + "' = " + std::to_string(*v) +
                    " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return *v;
}

}  // namespace

HParams load_hparams(const gguf::File& f) {
    HParams hp;
    auto arch = f.get_string("general.architecture");
    if (!arch) throw Error("'" + f.path() + "': missing 'general.architecture'");
    hp.arch_name = *arch;
    if (*arch == "qwen2") {
        hp.arch = Arch::Qwen2;
    } else if (*arch == "qwen3") {
        hp.arch = Arch::Qwen3;
    } else if (*arch == "qwen2moe") {
        hp.arch = Arch::Qwen2Moe;
    } else if (*arch == "qwen3moe") {
        hp.arch = Arch::Qwen3Moe;
    } else {
        throw Error("'" + f.path() + "': unsupported architecture '" + *arch +
                    "' (minfer runs qwen2, qwen3, qwen2moe and qwen3moe models)");
    }
    const std::string a = *arch + ".";
    // Bounds are sanity limits far above any real model; they keep every
    // later size computation far from overflow.
    hp.n_ctx_train = require_int(f, a + "context_length", 1, 1 << 24);
    hp.n_embd = require_int(f, a + "embedding_length", 1, 1 << 20);
    hp.n_layer = require_int(f, a + "block_count", 1, 4096);
    hp.n_ff = !hp.moe() || f.get_int(a + "feed_forward_length")
                  ? require_int(f, a + "feed_forward_length", 1, 1 << 22)
                  : 0;
    if (hp.moe()) {
        // llama.cpp keeps at most 512 experts (LLAMA_MAX_EXPERTS)
        hp.n_expert = require_int(f, a + "expert_count", 1, 512);
        hp.n_expert_used = require_int(f, a + "expert_used_count", 1, 512);
        if (hp.n_expert_used > hp.n_expert)
            throw Error("'" + f.path() + "': hyper-parameter '" + a +
                        "expert_used_count' = " + std::to_string(hp.n_expert_used) + " exceeds '" +
                        a + "expert_count' = " + std::to_string(hp.n_expert));
        // llama.cpp's fallbacks when the widths are absent
        if (f.get_int(a + "expert_feed_forward_length"))
            hp.n_ff_exp = require_int(f, a + "expert_feed_forward_length", 1, 1 << 22);
        else if (hp.n_ff > 0 && hp.n_ff / hp.n_expert_used > 0)
            hp.n_ff_exp = hp.n_ff / hp.n_expert_used;
        else
            throw Error("'" + f.path() + "': missing hyper-parameter '" + a +
                        "expert_feed_forward_length'");
        if (hp.arch == Arch::Qwen2Moe) {
            if (f.get_int(a + "expert_shared_feed_forward_length"))
                hp.n_ff_shexp = require_int(f, a + "expert_shared_feed_forward_length", 1, 1 << 22);
            else if (hp.n_ff > 0)
                hp.n_ff_shexp = hp.n_ff;
            else
                throw Error("'" + f.path() + "': missing hyper-parameter '" + a +
                            "expert_shared_feed_forward_length'");
        }
    }
    hp.n_head = require_int(f, a + "attention.head_count", 1, 1 << 14);
    hp.n_head_kv = f.get_int(a + "attention.head_count_kv")
                       ? require_int(f, a + "attention.head_count_kv", 1, 1 << 14)
                       : hp.n_head;
    if (hp.n_head % hp.n_head_kv != 0)
        throw Error("'" + f.path() + "': attention.head_count (" + std::to_string(hp.n_head) +
                    ") is not a multiple of attention.head_count_kv (" +
                    std::to_string(hp.n_head_kv) + ")");
    if (f.get_int(a + "attention.key_length")) {
        hp.head_dim = require_int(f, a + "attention.key_length", 2, 1 << 14);
        if (auto vl = f.get_int(a + "attention.value_length"); vl && *vl != hp.head_dim)
            throw Error("'" + f.path() + "': attention.value_length (" + std::to_string(*vl) +
                        ") differs from attention.key_length (" + std::to_string(hp.head_dim) +
                        "); minfer needs them equal");
    } else {
        if (hp.n_embd % hp.n_head != 0)
            throw Error("'" + f.path() + "': embedding_length is not a multiple of head_count");
        hp.head_dim = hp.n_embd / hp.n_head;
    }
    if (hp.head_dim % 2 != 0)
        throw Error("'" + f.path() + "': head size " + std::to_string(hp.head_dim) +
                    " is odd; RoPE needs an even head size");
    if (auto eps = f.get_float(a + "attention.layer_norm_rms_epsilon")) {
        if (!(*eps > 0 && *eps < 1))
            throw Error("'" + f.path() + "': attention.layer_norm_rms_epsilon out of range");
        hp.rms_eps = static_cast<float>(*eps);
    }
    if (auto base = f.get_float(a + "rope.freq_base")) {
        if (!(*base > 1 && std::isfinite(*base)))
            throw Error("'" + f.path() + "': rope.freq_base out of range");
        hp.rope_freq_base = static_cast<float>(*base);
    }
    for (const char* key : {"rope.scaling.type", "rope.scaling_type"}) {
        if (auto st = f.get_string(a + key); st && *st != "none")
            throw Error("'" + f.path() + "': RoPE scaling '" + *st + "' (" + a + key +
                        ") is not supported yet");
    }
    if (auto factor = f.get_float(a + "rope.scaling.factor");
        factor && *factor != 0 && *factor != 1)
        throw Error("'" + f.path() + "': RoPE scaling factor " + std::to_string(*factor) +
                    " is not supported yet");
    return hp;
}

const tensor::TensorView* Model::bind(const std::string& name, std::vector<int64_t> shape,
                                      bool required, bool f32_only) {
    const gguf::TensorInfo* ti = file.find_tensor(name);
    if (!ti) {
        if (required) throw Error("'" + file.path() + "': missing tensor '" + name + "'");
        return nullptr;
    }
    bool ok = ti->n_dims == shape.size();
    for (size_t i = 0; ok && i < shape.size(); ++i) ok = ti->ne[i] == shape[i];
    if (!ok)
        throw Error("'" + file.path() + "': tensor '" + name + "' has shape " +
                    shape_str(ti->ne, ti->n_dims) + ", the hyper-parameters ask for " +
                    shape_str(shape));
    if (f32_only && ti->type != tensor::DType::F32)
        throw Error("'" + file.path() + "': tensor '" + name + "' is " +
                    std::string(tensor::dtype_name(ti->type)) + "; minfer expects f32 here");
    if (ti->type == tensor::DType::Q8_1 || ti->type == tensor::DType::Q8_K ||
        ti->type == tensor::DType::I32)
        throw Error("'" + file.path() + "': tensor '" + name + "' has type " +
                    std::string(tensor::dtype_name(ti->type)) + ", which is not a weight type");
    views_.push_back(ti->view());
    return &views_.back();
}

Model Model::load(const std::string& path) {
    return from_file(gguf::File::open(path));
}

Model Model::from_file(gguf::File f) {
    Model m;
    m.file = std::move(f);
    m.hp = load_hparams(m.file);
    HParams& hp = m.hp;

    const gguf::TensorInfo* emb = m.file.find_tensor("token_embd.weight");
    if (!emb) throw Error("'" + m.file.path() + "': missing tensor 'token_embd.weight'");
    if (emb->n_dims != 2 || emb->ne[0] != hp.n_embd)
        throw Error("'" + m.file.path() + "': tensor 'token_embd.weight' has shape " +
                    shape_str(emb->ne, emb->n_dims) + ", expected [" + std::to_string(hp.n_embd) +
                    ", n_vocab]");
    hp.n_vocab = emb->ne[1];
    if (const auto* toks = m.file.get_string_array("tokenizer.ggml.tokens")) {
        if (static_cast<int64_t>(toks->size()) < hp.n_vocab)
            throw Error("'" + m.file.path() + "': the vocabulary has " +
                        std::to_string(toks->size()) + " tokens but token_embd.weight has " +
                        std::to_string(hp.n_vocab) + " rows");
    }

    const int64_t E = hp.n_embd, Q = hp.n_embd_q(), KV = hp.n_embd_kv(), F = hp.n_ff;
    m.tok_embd = m.bind("token_embd.weight", {E, hp.n_vocab}, true, false);
    m.output_norm = m.bind("output_norm.weight", {E}, true, true);
    m.output = m.bind("output.weight", {E, hp.n_vocab}, false, false);
    if (!m.output) {
        m.output = m.tok_embd;
        m.tied_output = true;
    }
    const bool qwen2 = hp.qkv_bias();
    const int64_t X = hp.n_expert, FX = hp.n_ff_exp, FS = hp.n_ff_shexp;
    for (int64_t il = 0; il < hp.n_layer; ++il) {
        const std::string p = "blk." + std::to_string(il) + ".";
        LayerWeights L;
        L.attn_norm = m.bind(p + "attn_norm.weight", {E}, true, true);
        L.wq = m.bind(p + "attn_q.weight", {E, Q}, true, false);
        L.wk = m.bind(p + "attn_k.weight", {E, KV}, true, false);
        L.wv = m.bind(p + "attn_v.weight", {E, KV}, true, false);
        L.bq = m.bind(p + "attn_q.bias", {Q}, qwen2, true);
        L.bk = m.bind(p + "attn_k.bias", {KV}, qwen2, true);
        L.bv = m.bind(p + "attn_v.bias", {KV}, qwen2, true);
        L.q_norm = m.bind(p + "attn_q_norm.weight", {hp.head_dim}, !qwen2, true);
        L.k_norm = m.bind(p + "attn_k_norm.weight", {hp.head_dim}, !qwen2, true);
        L.wo = m.bind(p + "attn_output.weight", {Q, E}, true, false);
        L.ffn_norm = m.bind(p + "ffn_norm.weight", {E}, true, true);
        if (!hp.moe()) {
            L.w_gate = m.bind(p + "ffn_gate.weight", {E, F}, true, false);
            L.w_up = m.bind(p + "ffn_up.weight", {E, F}, true, false);
            L.w_down = m.bind(p + "ffn_down.weight", {F, E}, true, false);
        } else {
            // The shapes carry n_expert: a file whose expert tensors disagree
            // with expert_count is refused here, so no expert id the router
            // can give reads past a tensor.
            L.ffn_gate_inp = m.bind(p + "ffn_gate_inp.weight", {E, X}, true, true);
            L.ffn_gate_exps = m.bind(p + "ffn_gate_exps.weight", {E, FX, X}, true, false);
            L.ffn_up_exps = m.bind(p + "ffn_up_exps.weight", {E, FX, X}, true, false);
            L.ffn_down_exps = m.bind(p + "ffn_down_exps.weight", {FX, E, X}, true, false);
            if (hp.arch == Arch::Qwen2Moe) {
                L.ffn_gate_inp_shexp = m.bind(p + "ffn_gate_inp_shexp.weight", {E}, true, true);
                L.ffn_gate_shexp = m.bind(p + "ffn_gate_shexp.weight", {E, FS}, true, false);
                L.ffn_up_shexp = m.bind(p + "ffn_up_shexp.weight", {E, FS}, true, false);
                L.ffn_down_shexp = m.bind(p + "ffn_down_shexp.weight", {FS, E}, true, false);
            }
        }
        m.layers.push_back(L);
    }
    for (const auto& t : m.file.tensors()) m.weight_bytes += t.nbytes;
    return m;
}

size_t Model::interleave_weights(const std::function<bool(tensor::DType)>& keep) {
    std::vector<const tensor::TensorView*> targets;
    for (const LayerWeights& L : layers)
        for (const tensor::TensorView* w :
             {L.wq, L.wk, L.wv, L.wo, L.w_gate, L.w_up, L.w_down, L.ffn_gate_exps, L.ffn_up_exps,
              L.ffn_down_exps, L.ffn_gate_shexp, L.ffn_up_shexp, L.ffn_down_shexp})
            if (w) targets.push_back(w);
    // the output matmul reads every row of it each token; the embedding
    // lookup takes single rows back out (GetRows handles both layouts)
    targets.push_back(output);
    // Every weight still in the file moves into one anonymous buffer: the
    // matmul weights regrouped, the rest (norms, biases, weights of a type
    // without an interleaved kernel) as they are — once a released page's
    // neighbour is read, the kernel maps the pages around it back in
    // (fault-around), so no weight of the file may stay in use.
    auto regroup = [&](const tensor::TensorView* v) {
        // An expert tensor is regrouped as a whole: each expert's slice of
        // ne[1] rows is then its own run of whole 16-row groups (the matmul
        // reads a slice as a 2-D matrix at an offset), as long as ne[1] is a
        // multiple of 16.
        return std::find(targets.begin(), targets.end(), v) != targets.end() &&
               tensor::can_interleave(v->type, v->ne[0], v->ne[1]) &&
               tensor::can_interleave(v->type, v->ne[0], v->n_rows()) && (!keep || keep(v->type));
    };
    std::vector<tensor::TensorView*> moving;
    size_t total = 0;
    bool any = false;
    for (tensor::TensorView& v : views_)
        if (v.layout == tensor::TensorView::Layout::Rows && v.nbytes > 0) {
            moving.push_back(&v);
            total += (v.nbytes + 63) / 64 * 64;
            any = any || regroup(&v);
        }
    if (!any) return 0;
    void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        throw Error("out of memory: " + std::to_string(total >> 20) +
                    " MiB for the weights regrouped out of '" + file.path() + "'");
    arenas_.emplace_back(static_cast<uint8_t*>(p), total);
    // Each generated token streams every weight once: in 2 MiB pages that
    // is ~500 TLB misses a token instead of ~250,000 (for 1 GB).
    advise_huge_pages(p, total);
    auto* at = static_cast<uint8_t*>(p);
    size_t done = 0;
    // In pieces of about 8 MiB, each piece's file pages released as soon as
    // it is copied: resident memory never holds much more than one copy.
    constexpr size_t kPiece = size_t{8} << 20;
    for (tensor::TensorView* v : moving) {
        const bool regrouped = regroup(v);
        const size_t unit = regrouped ? tensor::kInterleaveRows * v->row_bytes() : 1;
        const size_t piece = std::max(unit, kPiece / unit * unit);
        const auto* src = static_cast<const uint8_t*>(v->data);
        for (size_t off = 0; off < v->nbytes; off += piece) {
            const size_t n = std::min(piece, v->nbytes - off);
#ifdef MADV_POPULATE_WRITE
            ::madvise(at + off, n, MADV_POPULATE_WRITE);  // faults the piece in one call (5.14+)
#endif
            if (regrouped)
                tensor::interleave_rows(v->type, src + off, v->ne[0],
                                        static_cast<int64_t>(n / v->row_bytes()), at + off);
            else
                std::memcpy(at + off, src + off, n);
            file.release(src + off, n);
        }
        if (regrouped) {
            v->layout = tensor::TensorView::Layout::Rows16;
            done += v->nbytes;
        }
        v->data = at;
        at += (v->nbytes + 63) / 64 * 64;
    }
    regrouped_bytes += done;
    return done;
}

Model::Arena::~Arena() {
    if (data) ::munmap(data, size);
}

}  // namespace minfer::model
