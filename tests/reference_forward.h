// Test support: a plain, obviously-correct forward pass of a qwen2/qwen3
// (and qwen2moe/qwen3moe)
// model in double precision over dequantized weights — no graph, no
// allocator, no KV cache (full causal attention recomputed for every
// prompt). The engine must agree with it within the error of its 8-bit
// activation quantization.
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/model.h"
#include "tensor/quants.h"

namespace minfer::testing {

inline std::vector<double> dequant(const tensor::TensorView& t) {
    std::vector<float> f(static_cast<size_t>(t.n_elements()));
    for (int64_t r = 0; r < t.n_rows(); ++r)
        tensor::dequantize_row(t.type, t.row(r), f.data() + r * t.ne[0], t.ne[0]);
    return std::vector<double>(f.begin(), f.end());
}

// y[n][m] = sum_k w[m][k] x[n][k]
inline std::vector<double> ref_matmul(const std::vector<double>& x, int64_t n,
                                      const tensor::TensorView& w) {
    const std::vector<double> W = dequant(w);
    const int64_t K = w.ne[0], M = w.ne[1];
    std::vector<double> y(static_cast<size_t>(n * M));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t m = 0; m < M; ++m) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
                s += W[static_cast<size_t>(m * K + k)] * x[static_cast<size_t>(i * K + k)];
            y[static_cast<size_t>(i * M + m)] = s;
        }
    return y;
}

inline void ref_rmsnorm(std::vector<double>& x, int64_t width, const tensor::TensorView* w,
                        double eps) {
    const std::vector<double> W = dequant(*w);
    for (size_t r = 0; r < x.size() / static_cast<size_t>(width); ++r) {
        double ss = 0;
        for (int64_t i = 0; i < width; ++i) ss += x[r * width + i] * x[r * width + i];
        const double scale = 1.0 / std::sqrt(ss / width + eps);
        for (int64_t i = 0; i < width; ++i) x[r * width + i] *= scale * W[static_cast<size_t>(i)];
    }
}

inline void ref_rope(std::vector<double>& x, int64_t n_heads, int64_t hd, double base) {
    const int64_t n = static_cast<int64_t>(x.size()) / (n_heads * hd);
    for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < n_heads; ++h) {
            double* v = x.data() + (t * n_heads + h) * hd;
            for (int64_t i = 0; i < hd / 2; ++i) {
                const double theta = t * std::pow(base, -2.0 * i / hd);
                const double a = v[i], b = v[i + hd / 2];
                v[i] = a * std::cos(theta) - b * std::sin(theta);
                v[i + hd / 2] = a * std::sin(theta) + b * std::cos(theta);
            }
        }
}

// Rows [first, first + M) of w (an expert's slice of a 3-D tensor) times x.
inline std::vector<double> ref_matmul_rows(const std::vector<double>& x, int64_t n,
                                           const std::vector<double>& W, int64_t K, int64_t M,
                                           int64_t first) {
    std::vector<double> y(static_cast<size_t>(n * M));
    for (int64_t i = 0; i < n; ++i)
        for (int64_t m = 0; m < M; ++m) {
            double s = 0;
            for (int64_t k = 0; k < K; ++k)
                s +=
                    W[static_cast<size_t>((first + m) * K + k)] * x[static_cast<size_t>(i * K + k)];
            y[static_cast<size_t>(i * M + m)] = s;
        }
    return y;
}

inline void ref_swiglu(std::vector<double>& g, const std::vector<double>& u) {
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
}

// The mixture-of-experts block of one token row x [E]: every expert the
// router's top k names, weighted by its softmax probability (renormalized
// over the k for qwen3moe), plus qwen2moe's gated shared expert.
inline std::vector<double> ref_moe_row(const model::Model& m, const model::LayerWeights& L,
                                       const std::vector<double>& x) {
    const auto& hp = m.hp;
    const int64_t E = hp.n_embd, FX = hp.n_ff_exp, X = hp.n_expert, k = hp.n_expert_used;
    std::vector<double> p = ref_matmul(x, 1, *L.ffn_gate_inp);
    const double mx = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (auto& v : p) sum += v = std::exp(v - mx);
    for (auto& v : p) v /= sum;
    std::vector<int64_t> order(static_cast<size_t>(X));
    for (int64_t e = 0; e < X; ++e) order[static_cast<size_t>(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return p[static_cast<size_t>(a)] > p[static_cast<size_t>(b)];
    });
    double wsum = 0;
    for (int64_t j = 0; j < k; ++j) wsum += p[static_cast<size_t>(order[static_cast<size_t>(j)])];
    const std::vector<double> G = dequant(*L.ffn_gate_exps), U = dequant(*L.ffn_up_exps),
                              D = dequant(*L.ffn_down_exps);
    std::vector<double> out(static_cast<size_t>(E), 0.0);
    for (int64_t j = 0; j < k; ++j) {
        const int64_t e = order[static_cast<size_t>(j)];
        double w = p[static_cast<size_t>(e)];
        if (hp.moe_norm_weights()) w /= wsum;
        std::vector<double> g = ref_matmul_rows(x, 1, G, E, FX, e * FX);
        ref_swiglu(g, ref_matmul_rows(x, 1, U, E, FX, e * FX));
        const std::vector<double> d = ref_matmul_rows(g, 1, D, FX, E, e * E);
        for (int64_t i = 0; i < E; ++i)
            out[static_cast<size_t>(i)] += w * d[static_cast<size_t>(i)];
    }
    if (L.ffn_gate_inp_shexp) {
        std::vector<double> g = ref_matmul(x, 1, *L.ffn_gate_shexp);
        ref_swiglu(g, ref_matmul(x, 1, *L.ffn_up_shexp));
        const std::vector<double> d = ref_matmul(g, 1, *L.ffn_down_shexp);
        const double gate = ref_matmul(x, 1, *L.ffn_gate_inp_shexp)[0];
        const double s = 1.0 / (1.0 + std::exp(-gate));
        for (int64_t i = 0; i < E; ++i)
            out[static_cast<size_t>(i)] += s * d[static_cast<size_t>(i)];
    }
    return out;
}

// Logits [n × n_vocab] of every position of `ids` (positions 0..n-1).
inline std::vector<double> reference_logits(const model::Model& m,
                                            const std::vector<int32_t>& ids) {
    const auto& hp = m.hp;
    const int64_t n = static_cast<int64_t>(ids.size()), E = hp.n_embd, hd = hp.head_dim;
    const std::vector<double> emb = dequant(*m.tok_embd);
    std::vector<double> h(static_cast<size_t>(n * E));
    for (int64_t t = 0; t < n; ++t)
        for (int64_t i = 0; i < E; ++i)
            h[static_cast<size_t>(t * E + i)] = emb[static_cast<size_t>(ids[t] * E + i)];
    for (const auto& L : m.layers) {
        std::vector<double> x = h;
        ref_rmsnorm(x, E, L.attn_norm, hp.rms_eps);
        std::vector<double> q = ref_matmul(x, n, *L.wq), k = ref_matmul(x, n, *L.wk),
                            v = ref_matmul(x, n, *L.wv);
        if (L.bq) {
            auto add_bias = [&](std::vector<double>& y, const tensor::TensorView* b) {
                const auto B = dequant(*b);
                for (size_t i = 0; i < y.size(); ++i) y[i] += B[i % B.size()];
            };
            add_bias(q, L.bq);
            add_bias(k, L.bk);
            add_bias(v, L.bv);
        }
        if (L.q_norm) {
            ref_rmsnorm(q, hd, L.q_norm, hp.rms_eps);
            ref_rmsnorm(k, hd, L.k_norm, hp.rms_eps);
        }
        ref_rope(q, hp.n_head, hd, hp.rope_freq_base);
        ref_rope(k, hp.n_head_kv, hd, hp.rope_freq_base);
        std::vector<double> attn(static_cast<size_t>(n * hp.n_embd_q()));
        const int64_t group = hp.n_head / hp.n_head_kv;
        for (int64_t t = 0; t < n; ++t)
            for (int64_t hq = 0; hq < hp.n_head; ++hq) {
                const int64_t hk = hq / group;
                std::vector<double> s(static_cast<size_t>(t + 1));
                double mx = -1e300;
                for (int64_t j = 0; j <= t; ++j) {
                    double d = 0;
                    for (int64_t i = 0; i < hd; ++i)
                        d += q[static_cast<size_t>((t * hp.n_head + hq) * hd + i)] *
                             k[static_cast<size_t>((j * hp.n_head_kv + hk) * hd + i)];
                    s[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(hd));
                    mx = std::max(mx, s[static_cast<size_t>(j)]);
                }
                double sum = 0;
                for (auto& e : s) sum += e = std::exp(e - mx);
                for (int64_t i = 0; i < hd; ++i) {
                    double o = 0;
                    for (int64_t j = 0; j <= t; ++j)
                        o += s[static_cast<size_t>(j)] / sum *
                             v[static_cast<size_t>((j * hp.n_head_kv + hk) * hd + i)];
                    attn[static_cast<size_t>((t * hp.n_head + hq) * hd + i)] = o;
                }
            }
        std::vector<double> o = ref_matmul(attn, n, *L.wo);
        for (size_t i = 0; i < h.size(); ++i) h[i] += o[i];
        x = h;
        ref_rmsnorm(x, E, L.ffn_norm, hp.rms_eps);
        if (hp.moe()) {
            for (int64_t t = 0; t < n; ++t) {
                const std::vector<double> xt(x.begin() + t * E, x.begin() + (t + 1) * E);
                const std::vector<double> d = ref_moe_row(m, L, xt);
                for (int64_t i = 0; i < E; ++i)
                    h[static_cast<size_t>(t * E + i)] += d[static_cast<size_t>(i)];
            }
            continue;
        }
        std::vector<double> g = ref_matmul(x, n, *L.w_gate);
        ref_swiglu(g, ref_matmul(x, n, *L.w_up));
        std::vector<double> d = ref_matmul(g, n, *L.w_down);
        for (size_t i = 0; i < h.size(); ++i) h[i] += d[i];
    }
    ref_rmsnorm(h, E, m.output_norm, hp.rms_eps);
    return ref_matmul(h, n, *m.output);
}

// Largest |a - b| relative to the spread of the reference logits of a row.
inline double max_rel_diff(const std::vector<float>& a, const std::vector<double>& b,
                           int64_t n_vocab) {
    double worst = 0;
    for (size_t r = 0; r < a.size() / static_cast<size_t>(n_vocab); ++r) {
        double lo = 1e300, hi = -1e300, d = 0;
        for (int64_t v = 0; v < n_vocab; ++v) {
            const double x = b[r * n_vocab + v];
            lo = std::min(lo, x);
            hi = std::max(hi, x);
            d = std::max(d, std::abs(a[r * n_vocab + v] - x));
        }
        worst = std::max(worst, d / (hi - lo));
    }
    return worst;
}

}  // namespace minfer::testing
