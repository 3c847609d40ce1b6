// Test support: a plain, obviously-correct forward pass of a qwen2/qwen3
// model in double precision over dequantized weights — no graph, no
// allocator, no KV cache (full causal attention recomputed for every
// prompt). The engine must agree with it within the error of its 8-bit
// activation quantization.
#pragma once

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
        std::vector<double> g = ref_matmul(x, n, *L.w_gate), u = ref_matmul(x, n, *L.w_up);
        for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
        std::vector<double> d = ref_matmul(g, n, *L.w_down);
        for (size_t i = 0; i < h.size(); ++i) h[i] += d[i];
    }
    ref_rmsnorm(h, E, m.output_norm, hp.rms_eps);
    return ref_matmul(h, n, *m.output);
}

}  // namespace minfer::testing
