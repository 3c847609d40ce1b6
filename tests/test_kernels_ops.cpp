// The CPU kernels of the small ops, the KV cache and attention (the scalar loop
// and every SIMD level against it) and the fused epilogues, against scalar
// references written here (double accumulation), with the tolerance of each
// comparison argued next to it.
#include "backend/cpu/vec_ops.h"
#include "kernel_test_data.h"

// ---- small ops --------------------------------------------------------------------

TEST(CpuOps, RmsNormAndHeadNormMatchDoubleReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // One float scale and two float multiplies per element after a double
        // sum: relative error a few 2^-24; 1e-6 relative is generous.
        const int64_t ne0 = 128, n = 3, hd = 32;
        ThreadPool pool(2);
        auto x = random_floats(static_cast<size_t>(ne0 * n), 1, -2, 2);
        auto w = random_floats(static_cast<size_t>(ne0), 2);
        TensorView wv{"norm", DType::F32, {ne0, 1, 1, 1}, w.data(), w.size() * 4};
        TensorView hv{"head_norm", DType::F32, {hd, 1, 1, 1}, w.data(), hd * 4};
        std::vector<float> out(x.size()), out_h(x.size());
        Node norm = make_node(Op::RmsNorm, {ne0, n, 1, 1});
        norm.meta.eps = 1e-6f;
        norm.weights = {&wv};
        cpu::run_node(norm, NodeData{{x.data()}, out.data(), nullptr, nullptr, {}}, pool);
        Node hn = make_node(Op::HeadNorm, {ne0, n, 1, 1});
        hn.meta.eps = 1e-6f;
        hn.meta.head_dim = hd;
        hn.weights = {&hv};
        cpu::run_node(hn, NodeData{{x.data()}, out_h.data(), nullptr, nullptr, {}}, pool);
        for (int64_t t = 0; t < n; ++t) {
            const float* xt = x.data() + t * ne0;
            double ss = 0;
            for (int64_t i = 0; i < ne0; ++i) ss += double(xt[i]) * xt[i];
            const double sc = 1.0 / std::sqrt(ss / ne0 + 1e-6);
            for (int64_t i = 0; i < ne0; ++i) {
                const double ref = xt[i] * sc * w[static_cast<size_t>(i)];
                EXPECT_NEAR(out[static_cast<size_t>(t * ne0 + i)], ref,
                            1e-6 * std::fabs(ref) + 1e-7);
            }
            for (int64_t h = 0; h < ne0 / hd; ++h) {
                double hs = 0;
                for (int64_t i = 0; i < hd; ++i) hs += double(xt[h * hd + i]) * xt[h * hd + i];
                const double hsc = 1.0 / std::sqrt(hs / hd + 1e-6);
                for (int64_t i = 0; i < hd; ++i) {
                    const double ref = xt[h * hd + i] * hsc * w[static_cast<size_t>(i)];
                    EXPECT_NEAR(out_h[static_cast<size_t>(t * ne0 + h * hd + i)], ref,
                                1e-6 * std::fabs(ref) + 1e-7);
                }
            }
        }
    });
}

TEST(CpuOps, ElementwiseOpsMatchReference) {
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // One or two float operations per element, expf within 1 ulp: 1e-6
        // relative (+1e-7 absolute near zero).
        const int64_t ne0 = 64, n = 5;
        ThreadPool pool(2);
        auto a = random_floats(static_cast<size_t>(ne0 * n), 3, -6, 6);
        auto b = random_floats(static_cast<size_t>(ne0 * n), 4, -2, 2);
        TensorView bias{"bias", DType::F32, {ne0, 1, 1, 1}, b.data(), static_cast<size_t>(ne0) * 4};
        std::vector<float> out(a.size());
        auto run = [&](Op op, std::vector<const void*> src) {
            Node node = make_node(op, {ne0, n, 1, 1});
            if (op == Op::AddBias) node.weights = {&bias};
            cpu::run_node(node, NodeData{src, out.data(), nullptr, nullptr, {}}, pool);
        };
        auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
        run(Op::Add, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
        run(Op::Mul, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] * b[i]);
        run(Op::AddBias, {a.data()});
        for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i % ne0]);
        run(Op::Silu, {a.data()});
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(out[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
        run(Op::SwiGLU, {a.data(), b.data()});
        for (size_t i = 0; i < a.size(); ++i) {
            const double ref = silu(a[i]) * b[i];
            EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7);
        }
        // in place
        std::vector<float> c = a;
        Node s = make_node(Op::Silu, {ne0, n, 1, 1});
        cpu::run_node(s, NodeData{{c.data()}, c.data(), nullptr, nullptr, {}}, pool);
        for (size_t i = 0; i < a.size(); ++i)
            EXPECT_NEAR(c[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
    });
}

TEST(CpuOps, ElementwiseAndNormsOnOddWidths) {
    // once per kernel level this CPU has (the AVX2 and AVX-512 tails differ)
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        // Widths that are not multiples of the SIMD width (16 floats), so every
        // kernel's tail runs: 1, 3, 15, 17, 31, 33, 100, 129. Same bounds as the
        // two tests above; HeadNorm with head_dim 20 (a 4-float tail per head).
        ThreadPool pool(2);
        auto silu = [](double x) { return x / (1.0 + std::exp(-x)); };
        for (int64_t ne0 : {1, 3, 15, 17, 31, 33, 100, 129}) {
            SCOPED_TRACE(::testing::Message() << "ne0 " << ne0);
            const int64_t n = 3;
            auto a = random_floats(static_cast<size_t>(ne0 * n), 21, -6, 6);
            auto b = random_floats(static_cast<size_t>(ne0 * n), 22, -2, 2);
            TensorView bias{
                "bias", DType::F32, {ne0, 1, 1, 1}, b.data(), static_cast<size_t>(ne0) * 4};
            // Canaries past the end: a tail must not write beyond the row.
            std::vector<float> out(a.size() + 16, -7.0f);
            auto run = [&](Op op, std::vector<const void*> src) {
                Node node = make_node(op, {ne0, n, 1, 1});
                if (op == Op::AddBias) node.weights = {&bias};
                if (op == Op::RmsNorm) {
                    node.meta.eps = 1e-6f;
                    node.weights = {&bias};
                }
                cpu::run_node(node, NodeData{src, out.data(), nullptr, nullptr, {}}, pool);
            };
            run(Op::Add, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i]);
            run(Op::Mul, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] * b[i]);
            run(Op::AddBias, {a.data()});
            for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(out[i], a[i] + b[i % size_t(ne0)]);
            run(Op::Silu, {a.data()});
            for (size_t i = 0; i < a.size(); ++i)
                EXPECT_NEAR(out[i], silu(a[i]), 1e-6 * std::fabs(silu(a[i])) + 1e-7);
            run(Op::SwiGLU, {a.data(), b.data()});
            for (size_t i = 0; i < a.size(); ++i) {
                const double ref = silu(a[i]) * b[i];
                EXPECT_NEAR(out[i], ref, 1e-6 * std::fabs(ref) + 1e-7);
            }
            run(Op::RmsNorm, {a.data()});
            for (int64_t t = 0; t < n; ++t) {
                const float* xt = a.data() + t * ne0;
                double ss = 0;
                for (int64_t i = 0; i < ne0; ++i) ss += double(xt[i]) * xt[i];
                const double sc = 1.0 / std::sqrt(ss / double(ne0) + 1e-6);
                for (int64_t i = 0; i < ne0; ++i) {
                    const double ref = xt[i] * sc * b[size_t(i)];
                    EXPECT_NEAR(out[size_t(t * ne0 + i)], ref, 1e-6 * std::fabs(ref) + 1e-7);
                }
            }
            for (size_t i = a.size(); i < out.size(); ++i)
                EXPECT_EQ(out[i], -7.0f) << "past the end";
        }
        // HeadNorm: 3 heads of 20.
        const int64_t hd = 20, ne0 = 60, n = 2;
        auto x = random_floats(static_cast<size_t>(ne0 * n), 23, -2, 2);
        auto w = random_floats(static_cast<size_t>(hd), 24);
        TensorView hv{"head_norm", DType::F32, {hd, 1, 1, 1}, w.data(), hd * 4};
        std::vector<float> out(x.size());
        Node hn = make_node(Op::HeadNorm, {ne0, n, 1, 1});
        hn.meta.eps = 1e-6f;
        hn.meta.head_dim = hd;
        hn.weights = {&hv};
        cpu::run_node(hn, NodeData{{x.data()}, out.data(), nullptr, nullptr, {}}, pool);
        for (int64_t t = 0; t < n; ++t)
            for (int64_t h = 0; h < ne0 / hd; ++h) {
                const float* xh = x.data() + t * ne0 + h * hd;
                double hs = 0;
                for (int64_t i = 0; i < hd; ++i) hs += double(xh[i]) * xh[i];
                const double hsc = 1.0 / std::sqrt(hs / hd + 1e-6);
                for (int64_t i = 0; i < hd; ++i) {
                    const double ref = xh[i] * hsc * w[size_t(i)];
                    EXPECT_NEAR(out[size_t(t * ne0 + h * hd + i)], ref,
                                1e-6 * std::fabs(ref) + 1e-7);
                }
            }
    });
}

TEST(CpuOps, GetRowsDequantizesAndRejectsBadIds) {
    const int64_t ne0 = 64, n_vocab = 10;
    ThreadPool pool(2);
    for (DType t : {DType::Q8_0, DType::F16, DType::Q6_K}) {
        const int64_t K = t == DType::Q6_K ? 256 : ne0;
        Weight table = make_weight(t, K, n_vocab, 9);
        std::vector<int32_t> ids = {3, 0, 9, 3};
        std::vector<float> out(static_cast<size_t>(K) * ids.size()), ref(static_cast<size_t>(K));
        Node node = make_node(Op::GetRows, {K, 4, 1, 1});
        node.weights = {&table.view};
        cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool);
        for (size_t i = 0; i < ids.size(); ++i) {
            cpu::dequant_row(t, table.view.row(ids[i]), ref.data(), K);
            EXPECT_EQ(0, std::memcmp(out.data() + i * K, ref.data(), static_cast<size_t>(K) * 4));
        }
        ids[2] = 10;
        EXPECT_THROW(
            cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool),
            Error);
        ids[2] = -1;
        EXPECT_THROW(
            cpu::run_node(node, NodeData{{ids.data()}, out.data(), nullptr, nullptr, {}}, pool),
            Error);
    }
}

TEST(CpuOps, SelectRowsCopiesRows) {
    ThreadPool pool(1);
    auto src = random_floats(4 * 8, 5);
    std::vector<int32_t> ids = {7, 2};
    std::vector<float> out(8);
    Node node = make_node(Op::SelectRows, {4, 2, 1, 1});
    cpu::run_node(
        node,
        NodeData{
            {src.data(), ids.data()}, out.data(), nullptr, nullptr, {{4, 8, 1, 1}, {2, 1, 1, 1}}},
        pool);
    EXPECT_EQ(0, std::memcmp(out.data(), src.data() + 28, 16));
    EXPECT_EQ(0, std::memcmp(out.data() + 4, src.data() + 8, 16));
    ids[0] = 8;
    EXPECT_THROW(cpu::run_node(node,
                               NodeData{{src.data(), ids.data()},
                                        out.data(),
                                        nullptr,
                                        nullptr,
                                        {{4, 8, 1, 1}, {2, 1, 1, 1}}},
                               pool),
                 Error);
}

TEST(CpuOps, RopeMatchesClosedForm) {
    // theta_i = p * base^(-2i/d). ggml (and we) build theta by repeated float
    // multiplication: after i steps its relative error is about i * 2^-24
    // (plus powf's ulp), so |dtheta| <= p * (i + 2) * 2^-23 and the outputs
    // err by at most (|x0| + |x1|) * |dtheta| + a few ulp of sin/cos.
    const int64_t hd = 64, heads = 3, n = 4;
    ThreadPool pool(2);
    auto x = random_floats(static_cast<size_t>(hd * heads * n), 6);
    std::vector<int32_t> pos = {0, 1, 17, 300};
    std::vector<float> y(x.size());
    Node node = make_node(Op::Rope, {hd * heads, n, 1, 1});
    node.meta.head_dim = static_cast<int32_t>(hd);
    node.meta.rope_freq_base = 1000000.0f;
    cpu::run_node(node, NodeData{{x.data(), pos.data()}, y.data(), nullptr, nullptr, {}}, pool);
    for (int64_t t = 0; t < n; ++t)
        for (int64_t h = 0; h < heads; ++h)
            for (int64_t i = 0; i < hd / 2; ++i) {
                const double theta =
                    pos[static_cast<size_t>(t)] * std::pow(1000000.0, -2.0 * i / hd);
                const size_t b = static_cast<size_t>(t * hd * heads + h * hd);
                const double x0 = x[b + i], x1 = x[b + i + hd / 2];
                const double tol =
                    (std::fabs(x0) + std::fabs(x1)) *
                    (pos[static_cast<size_t>(t)] * (i + 2) * std::ldexp(1.0, -23) + 4e-7);
                EXPECT_NEAR(y[b + i], x0 * std::cos(theta) - x1 * std::sin(theta), tol);
                EXPECT_NEAR(y[b + i + hd / 2], x0 * std::sin(theta) + x1 * std::cos(theta), tol);
            }
    // in place gives the same bits
    std::vector<float> z = x;
    cpu::run_node(node, NodeData{{z.data(), pos.data()}, z.data(), nullptr, nullptr, {}}, pool);
    EXPECT_EQ(0, std::memcmp(z.data(), y.data(), y.size() * 4));
}

// ---- KV cache and attention ------------------------------------------------------

namespace {
struct AttnSetup {
    int32_t n_head, n_head_kv, hd;
    int64_t n_ctx = 32;  // a multiple of the K block (ir/kv_layout.h)
    graph::NodeMeta meta() const {
        graph::NodeMeta m;
        m.n_head = n_head;
        m.n_head_kv = n_head_kv;
        m.head_dim = hd;
        m.n_ctx = n_ctx;
        return m;
    }
};

// fn throws a minfer::Error whose message holds `needle`.
template <class Fn>
void expect_error(Fn&& fn, const std::string& needle) {
    try {
        fn();
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
        return;
    }
    ADD_FAILURE() << "no minfer::Error thrown (expected one saying \"" << needle << "\")";
}

void kv_store(const AttnSetup& s, const float* k, const float* v, const int32_t* pos, int64_t n,
              std::vector<float>& K, std::vector<float>& V, ThreadPool& pool) {
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    Node node = make_node(Op::KvStore, {kv, s.n_ctx, 1, 1});
    node.meta = s.meta();
    NodeData d{
        {k, v, pos}, K.data(), K.data(), V.data(), {{kv, n, 1, 1}, {kv, n, 1, 1}, {n, 1, 1, 1}}};
    cpu::run_node(node, d, pool);
}
}  // namespace

TEST(CpuAttn, GqaMatchesNaiveSoftmaxAttention) {
    // Batch at positions 5..8 after 0..4 were stored. Reference: scores,
    // softmax and the weighted sum in double. Values in [-1, 1], head_dim
    // 64: each float dot of 64 terms errs by < 64 * 2^-24 * 64 relative to
    // its magnitude (< 64) -> < 1e-5 in a score, softmax and the sum of <= 9
    // weighted rows keep that order: 2e-5 absolute.
    for (AttnSetup s : {AttnSetup{14, 2, 64}, AttnSetup{4, 2, 64}}) {
        SCOPED_TRACE(s.n_head / s.n_head_kv);
        const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
        std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
        auto k_all = random_floats(static_cast<size_t>(kv * 9), 21);
        auto v_all = random_floats(static_cast<size_t>(kv * 9), 22);
        std::vector<int32_t> p0 = {0, 1, 2, 3, 4}, p1 = {5, 6, 7, 8};
        ThreadPool pool(2);
        kv_store(s, k_all.data(), v_all.data(), p0.data(), 5, K, V, pool);
        kv_store(s, k_all.data() + 5 * kv, v_all.data() + 5 * kv, p1.data(), 4, K, V, pool);
        // V rows as they come; K element-major in blocks of cells
        // (ir/kv_layout.h): element e of cell c at k_index(c, e, kv)
        EXPECT_EQ(0, std::memcmp(V.data(), v_all.data(), v_all.size() * 4));
        std::vector<float> k_want(K.size(), 0.0f);  // untouched cells stay 0
        for (int64_t c = 0; c < 9; ++c)
            for (int64_t e = 0; e < kv; ++e)
                k_want[static_cast<size_t>(graph::k_index(c, e, kv))] =
                    k_all[static_cast<size_t>(c * kv + e)];
        EXPECT_EQ(k_want, K);
        EXPECT_EQ(K[static_cast<size_t>(graph::kKBlockCells + 3)],
                  k_all[3 * kv + 1]);  // cell 3, e 1

        // q rows carry extra columns (the fused q|k|v layout): stride nq + 2kv
        const int64_t q_stride = nq + 2 * kv;
        auto q = random_floats(static_cast<size_t>(q_stride * 4), 23);
        std::vector<float> out(static_cast<size_t>(nq * 4));
        Node node = make_node(Op::Attn, {nq, 4, 1, 1});
        node.meta = s.meta();
        NodeData d{{q.data(), nullptr, p1.data()},
                   out.data(),
                   K.data(),
                   V.data(),
                   {{q_stride, 4, 1, 1}, {kv, s.n_ctx, 1, 1}, {4, 1, 1, 1}}};
        cpu::run_node(node, d, pool);
        std::vector<float> out1(out.size());
        ThreadPool one(1);
        d.out = out1.data();
        cpu::run_node(node, d, one);
        EXPECT_EQ(0, std::memcmp(out.data(), out1.data(), out.size() * 4));

        const int group = s.n_head / s.n_head_kv;
        for (int t = 0; t < 4; ++t)
            for (int h = 0; h < s.n_head; ++h) {
                const int kvh = h / group;
                const float* qh = q.data() + t * q_stride + h * s.hd;
                const int n_kv = p1[static_cast<size_t>(t)] + 1;
                std::vector<double> sc(static_cast<size_t>(n_kv));
                double mx = -1e300, sum = 0;
                for (int j = 0; j < n_kv; ++j) {
                    double dot = 0;
                    for (int i = 0; i < s.hd; ++i)
                        dot += double(qh[i]) * k_all[static_cast<size_t>(j * kv + kvh * s.hd + i)];
                    sc[static_cast<size_t>(j)] = dot / std::sqrt(double(s.hd));
                    mx = std::max(mx, sc[static_cast<size_t>(j)]);
                }
                for (auto& e : sc) sum += (e = std::exp(e - mx));
                for (int i = 0; i < s.hd; ++i) {
                    double ref = 0;
                    for (int j = 0; j < n_kv; ++j)
                        ref += sc[static_cast<size_t>(j)] / sum *
                               v_all[static_cast<size_t>(j * kv + kvh * s.hd + i)];
                    EXPECT_NEAR(out[static_cast<size_t>(t * nq + h * s.hd + i)], ref, 2e-5);
                }
            }
    }
}

TEST(CpuAttn, PositionPastContextThrowsAndWritesNothing) {
    AttnSetup s{4, 2, 8};
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
    auto k = random_floats(static_cast<size_t>(kv * 2), 1);
    std::vector<int32_t> pos = {31, 32};
    ThreadPool pool(1);
    expect_error([&] { kv_store(s, k.data(), k.data(), pos.data(), 2, K, V, pool); },
                 "position 32 is past the context size 32");
    for (float f : K) EXPECT_EQ(f, 0.0f);
    pos = {-1, 0};
    EXPECT_THROW(kv_store(s, k.data(), k.data(), pos.data(), 2, K, V, pool), Error);
}

// The level's K store of runs of consecutive cells (attn.h: store_k_cells,
// 8 rows at a time through a transpose on x86-64) writes the bytes
// store_k_row writes row by row: into F32 and F16 caches, runs of 1 to 32
// cells at offsets inside a K block, rows of a width that is a multiple of
// 8 and of one that is not, and values an f16 rounds, overflows, makes
// subnormal or NaN of either sign.
TEST(CpuKv, StoreKCellsWritesWhatStoreKRowWrites) {
    int checked = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel level) {
        const cpu::StoreKCellsFn fn = cpu::store_k_cells_at(level);
        if (fn == nullptr) return;  // this level stores row by row
        ++checked;
        for (const int64_t n_kv : {int64_t{64}, int64_t{20}})
            for (const DType t : {DType::F32, DType::F16}) {
                SCOPED_TRACE(std::string(cpu::isa_name(level)) + " " + std::string(dtype_name(t)) +
                             " n_kv=" + std::to_string(n_kv));
                const int64_t n_cells = 2 * graph::kKBlockCells;
                auto src = random_floats(static_cast<size_t>(n_cells * n_kv), 5, -3.0f, 3.0f);
                src[1] = 70000.0f;                     // past f16's largest
                src[2] = -1e-6f;                       // an f16 subnormal
                src[3] = fp32_from_bits(0x7FD00000u);  // NaNs with payloads vcvtps2ph keeps
                src[4] = fp32_from_bits(0xFFE12345u);
                src[size_t(n_kv + 5)] = INFINITY;
                src[size_t(9 * n_kv + 7)] = 1.0f + 1.0f / 2048.0f;  // an f16 rounding tie
                const size_t bytes =
                    static_cast<size_t>(n_cells * n_kv) * (t == DType::F16 ? 2 : 4);
                for (const auto& [cell0, n] : std::vector<std::pair<int64_t, int64_t>>{
                         {0, 32}, {32, 8}, {35, 20}, {41, 1}, {44, 13}, {50, 9}})
                    for (const int64_t stride : {n_kv, n_kv + 3}) {
                        std::vector<uint8_t> want(bytes, 0xAB), got(bytes, 0xAB);
                        for (int64_t r = 0; r < n; ++r)
                            cpu::store_k_row(t, src.data() + r * stride, want.data(), cell0 + r,
                                             n_kv);
                        fn(t, src.data(), stride, n, got.data(), cell0, n_kv);
                        ASSERT_EQ(0, std::memcmp(want.data(), got.data(), bytes))
                            << "cells " << cell0 << ".." << cell0 + n - 1 << " stride " << stride;
                    }
            }
    });
#if defined(__x86_64__)
    if (checked == 0) GTEST_SKIP() << "no x86 SIMD level on this CPU";
#else
    EXPECT_EQ(checked, 0) << "a K store kernel outside x86-64";
#endif
}

TEST(CpuAttn, RegionsOfPartBlocksAndPagesOfPartBlocksAreErrors) {
    // K is stored in whole blocks of cells (ir/kv_layout.h): a region of
    // 40 cells would be read and written past its end, a page of 16 cells
    // would make the kernels read another page's cells as this one's.
    AttnSetup s{4, 2, 8};
    s.n_ctx = 40;
    const int64_t kv = int64_t{s.n_head_kv} * s.hd;
    std::vector<float> K(static_cast<size_t>(kv * s.n_ctx), 0.0f), V(K.size(), 0.0f);
    auto k = random_floats(static_cast<size_t>(kv), 1);
    std::vector<int32_t> pos = {0};
    ThreadPool pool(1);
    expect_error([&] { kv_store(s, k.data(), k.data(), pos.data(), 1, K, V, pool); },
                 "40 cells are not a multiple of 32");
    for (float f : K) EXPECT_EQ(f, 0.0f);

    s.n_ctx = 64;
    Node node = make_node(Op::Attn, {int64_t{s.n_head} * s.hd, 1, 1, 1});
    node.meta = s.meta();
    node.meta.kv_page = 16;
    node.src = {0, 1, 2, 3, 4};
    std::vector<float> q(static_cast<size_t>(s.n_head * s.hd)), out(q.size());
    std::vector<int32_t> rows = {0}, table = {0, 1, 2, 3};
    K.assign(static_cast<size_t>(kv * s.n_ctx), 0.0f);
    V = K;
    NodeData d{{q.data(), nullptr, pos.data(), rows.data(), table.data()},
               out.data(),
               K.data(),
               V.data(),
               {{int64_t{s.n_head} * s.hd, 1, 1, 1},
                {kv, s.n_ctx, 1, 1},
                {1, 1, 1, 1},
                {1, 1, 1, 1},
                {4, 1, 1, 1}}};
    expect_error([&] { cpu::run_node(node, d, pool); }, "kv_page a multiple of 32");
}

// ---- fusion -----------------------------------------------------------------------

// FusedQKV + QkvBiasRopeStore must give the same bits as MatMul x3 +
// AddBias (qwen2) / HeadNorm (qwen3) + Rope + KvStore: the same per-element
// kernels run in both paths.
TEST(CpuFusion, FusedQkvEpilogueEqualsUnfusedChainBitForBit) {
    const int32_t n_head = 4, n_head_kv = 2, hd = 32;
    const int64_t n_embd = 128, nq = n_head * hd, nkv = n_head_kv * hd, n = 3, n_ctx = 32;
    auto x = random_floats(static_cast<size_t>(n_embd * n), 31);
    Weight wq = make_weight(DType::Q8_0, n_embd, nq, 1);
    Weight wk = make_weight(DType::Q4_0, n_embd, nkv, 2);
    Weight wv = make_weight(DType::Q5_0, n_embd, nkv, 3);
    auto b = random_floats(static_cast<size_t>(nq + 2 * nkv), 32);
    TensorView bq{"bq", DType::F32, {nq, 1, 1, 1}, b.data(), 0};
    TensorView bk{"bk", DType::F32, {nkv, 1, 1, 1}, b.data() + nq, 0};
    TensorView bv{"bv", DType::F32, {nkv, 1, 1, 1}, b.data() + nq + nkv, 0};
    TensorView qn{"q_norm", DType::F32, {hd, 1, 1, 1}, b.data(), 0};
    TensorView kn{"k_norm", DType::F32, {hd, 1, 1, 1}, b.data() + hd, 0};
    std::vector<int32_t> pos = {2, 3, 4};
    graph::NodeMeta meta;
    meta.n_head = n_head;
    meta.n_head_kv = n_head_kv;
    meta.head_dim = hd;
    meta.n_ctx = n_ctx;
    meta.eps = 1e-6f;
    meta.rope_freq_base = 1000000.0f;
    ThreadPool pool(2);
    const std::array<int64_t, 4> x_ne{n_embd, n, 1, 1}, pos_ne{n, 1, 1, 1};

    for (bool qwen3 : {false, true}) {
        SCOPED_TRACE(qwen3 ? "norms" : "biases");
        // fused
        std::vector<float> qkv(static_cast<size_t>((nq + 2 * nkv) * n));
        std::vector<float> Kf(static_cast<size_t>(nkv * n_ctx), 0.0f), Vf(Kf.size(), 0.0f);
        Node fq = make_node(Op::FusedQKV, {nq + 2 * nkv, n, 1, 1});
        fq.meta = meta;
        fq.weights = {&wq.view, &wk.view, &wv.view};
        cpu::run_node(fq, NodeData{{x.data()}, qkv.data(), nullptr, nullptr, {x_ne}}, pool);
        Node ep = make_node(Op::QkvBiasRopeStore, {nq + 2 * nkv, n, 1, 1});
        ep.meta = meta;
        if (qwen3)
            ep.weights = {&qn, &kn};
        else
            ep.weights = {&bq, &bk, &bv};
        cpu::run_node(ep,
                      NodeData{{qkv.data(), pos.data()},
                               qkv.data(),
                               Kf.data(),
                               Vf.data(),
                               {{nq + 2 * nkv, n, 1, 1}, pos_ne}},
                      pool);
        // unfused
        std::vector<float> Ku(Kf.size(), 0.0f), Vu(Kf.size(), 0.0f);
        auto mm = [&](const Weight& w, int64_t M) {
            std::vector<float> o(static_cast<size_t>(M * n));
            Node node = make_node(Op::MatMul, {M, n, 1, 1});
            node.weights = {&w.view};
            cpu::run_node(node, NodeData{{x.data()}, o.data(), nullptr, nullptr, {x_ne}}, pool);
            return o;
        };
        auto post = [&](std::vector<float>& v, int64_t M, const TensorView* bias,
                        const TensorView* norm, bool rope) {
            Node node = make_node(Op::AddBias, {M, n, 1, 1});
            node.meta = meta;
            if (bias) {
                node.weights = {bias};
                cpu::run_node(node, NodeData{{v.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
            if (norm) {
                node.op = Op::HeadNorm;
                node.weights = {norm};
                cpu::run_node(node, NodeData{{v.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
            if (rope) {
                node.op = Op::Rope;
                node.weights = {};
                cpu::run_node(
                    node, NodeData{{v.data(), pos.data()}, v.data(), nullptr, nullptr, {}}, pool);
            }
        };
        auto q = mm(wq, nq), k = mm(wk, nkv), v = mm(wv, nkv);
        post(q, nq, qwen3 ? nullptr : &bq, qwen3 ? &qn : nullptr, true);
        post(k, nkv, qwen3 ? nullptr : &bk, qwen3 ? &kn : nullptr, true);
        post(v, nkv, qwen3 ? nullptr : &bv, nullptr, false);
        Node st = make_node(Op::KvStore, {nkv, n_ctx, 1, 1});
        st.meta = meta;
        cpu::run_node(st,
                      NodeData{{k.data(), v.data(), pos.data()},
                               Ku.data(),
                               Ku.data(),
                               Vu.data(),
                               {{nkv, n, 1, 1}, {nkv, n, 1, 1}, pos_ne}},
                      pool);
        for (int64_t t = 0; t < n; ++t) {
            EXPECT_EQ(0, std::memcmp(qkv.data() + t * (nq + 2 * nkv), q.data() + t * nq,
                                     static_cast<size_t>(nq) * 4));
        }
        EXPECT_EQ(0, std::memcmp(Kf.data(), Ku.data(), Kf.size() * 4));
        EXPECT_EQ(0, std::memcmp(Vf.data(), Vu.data(), Vf.size() * 4));
        bool any = false;
        for (float f : Kf) any |= f != 0.0f;
        EXPECT_TRUE(any);
    }
}

// MatMulSwiGLU is bitwise swiglu_row over the whole output rows of the two
// MatMuls it replaces, at every level: F16 (no GEMM: the dot products for
// every count) and the four GEMM types, in GGUF rows and regrouped, with 1
// token (decode), 3 (dot products or the many-token group kernel), 9 and
// 40 (the GEMM), 1 and 2 threads, batch-invariant or not. M = 80 ends in a
// partial GEMM tile; M = 45 (GGUF rows only) ends in a partial vector, where
// the SwiGLU takes its scalar tail: a piece that started off a 16-row
// boundary, or a tile's SwiGLU run across tokens, would give that tail
// other bits.
TEST(CpuFusion, MatMulSwigluIsSwigluOfTheTwoMatMulsBitForBit) {
    const int64_t K = 512;
    int compared = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        for (DType t : {DType::F16, DType::Q5_0, DType::Q8_0, DType::Q4_K, DType::Q6_K})
            for (const int64_t M : {int64_t{45}, int64_t{80}})
                for (const bool regroup : {false, true}) {
                    if (regroup && (t == DType::F16 || M % tensor::kInterleaveRows != 0)) continue;
                    SCOPED_TRACE(std::string(dtype_name(t)) + " M=" + std::to_string(M) +
                                 (regroup ? " regrouped" : ""));
                    Weight g = make_weight(t, K, M, 3), u = make_weight(t, K, M, 4);
                    std::vector<uint8_t> gi(g.bytes.size()), ui(u.bytes.size());
                    if (regroup) {
                        tensor::interleave_rows(t, g.bytes.data(), K, M, gi.data());
                        tensor::interleave_rows(t, u.bytes.data(), K, M, ui.data());
                        g.view.data = gi.data();
                        u.view.data = ui.data();
                        g.view.layout = u.view.layout = TensorView::Layout::Rows16;
                    }
                    for (const int64_t n : {1, 3, 9, 40})
                        for (const int threads : {1, 2})
                            for (const bool invariant : {false, true}) {
                                ThreadPool pool(threads);
                                const auto x = random_floats(static_cast<size_t>(K * n),
                                                             11 + static_cast<uint32_t>(n));
                                const std::array<int64_t, 4> x_ne{K, n, 1, 1};
                                auto run = [&](Op op, std::vector<const TensorView*> w) {
                                    std::vector<float> y(static_cast<size_t>(M * n), NAN);
                                    Node node = make_node(op, {M, n, 1, 1});
                                    node.weights = std::move(w);
                                    NodeData d{{x.data()}, y.data(), nullptr, nullptr, {x_ne}};
                                    d.batch_invariant = invariant;
                                    cpu::run_node(node, d, pool);
                                    return y;
                                };
                                const auto gate = run(Op::MatMul, {&g.view});
                                const auto up = run(Op::MatMul, {&u.view});
                                const auto got = run(Op::MatMulSwiGLU, {&g.view, &u.view});
                                std::vector<float> want(gate.size());
                                for (int64_t i = 0; i < n; ++i)
                                    cpu::swiglu_row(gate.data() + i * M, up.data() + i * M,
                                                    want.data() + i * M, M);
                                for (float v : want) ASSERT_TRUE(std::isfinite(v));
                                ASSERT_EQ(0, std::memcmp(want.data(), got.data(),
                                                         want.size() * sizeof(float)))
                                    << "n=" << n << " threads=" << threads
                                    << " invariant=" << invariant;
                                ++compared;
                            }
                }
    });
    EXPECT_GT(compared, 0);
}

namespace {
// A random K and V cache of n values each (seeds seed, seed + 1), as f32
// or as their f16 roundings.
struct RandomKv {
    std::vector<float> k32, v32;
    std::vector<uint16_t> k16, v16;
    bool f16;
    RandomKv(int64_t n, DType kvt, uint32_t seed)
        : k32(random_floats(static_cast<size_t>(n), seed)),
          v32(random_floats(static_cast<size_t>(n), seed + 1)),
          k16(k32.size()),
          v16(v32.size()),
          f16(kvt == DType::F16) {
        for (size_t i = 0; i < k32.size(); ++i) {
            k16[i] = fp32_to_fp16(k32[i]);
            v16[i] = fp32_to_fp16(v32[i]);
        }
    }
    void* k() { return f16 ? static_cast<void*>(k16.data()) : k32.data(); }
    void* v() { return f16 ? static_cast<void*>(v16.data()) : v32.data(); }
};

// Runs one Attn node of n_tok tokens at positions n_kv - n_tok .. n_kv - 1
// over a random cache with the SIMD kernels and with the scalar loop
// (MINFER_SCALAR_ATTN=1) and compares. The SIMD paths differ from the
// scalar loop only by float order and their exp (<= ~2 ulp): 2e-5 absolute
// for values in [-1, 1]. With an f16 cache, a probability may round to the
// neighbouring f16 (2^-11 relative) when its float differs in the last
// bits: <= n_kv * 2^-11 * |p| * |v| summed, 1e-3 absolute.
void expect_simd_attn_matches_scalar(const AttnSetup& s, DType kvt, int64_t n_tok, int64_t n_kv) {
    SCOPED_TRACE(std::string(dtype_name(kvt)) + " hd=" + std::to_string(s.hd) +
                 " heads=" + std::to_string(s.n_head) + "/" + std::to_string(s.n_head_kv) +
                 " tokens=" + std::to_string(n_tok));
    const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
    RandomKv cache(kv * s.n_ctx, kvt, 31);
    void* K = cache.k();
    void* V = cache.v();
    const bool f16 = kvt == DType::F16;
    auto q = random_floats(static_cast<size_t>(nq * n_tok), 33);
    std::vector<int32_t> pos(static_cast<size_t>(n_tok));
    for (int64_t i = 0; i < n_tok; ++i) pos[size_t(i)] = int32_t(n_kv - n_tok + i);
    Node node = make_node(Op::Attn, {nq, n_tok, 1, 1});
    node.meta = s.meta();
    node.meta.kv_type = kvt;
    std::vector<float> fast(static_cast<size_t>(nq * n_tok), NAN), slow(fast.size());
    NodeData d{{q.data(), nullptr, pos.data()},
               fast.data(),
               K,
               V,
               {{nq, n_tok, 1, 1}, {kv, s.n_ctx, 1, 1}, {n_tok, 1, 1, 1}}};
    ThreadPool pool(2);
    cpu::run_node(node, d, pool);
    setenv("MINFER_SCALAR_ATTN", "1", 1);
    d.out = slow.data();
    cpu::run_node(node, d, pool);
    unsetenv("MINFER_SCALAR_ATTN");
    for (size_t i = 0; i < fast.size(); ++i)
        ASSERT_NEAR(fast[i], slow[i], f16 ? 1e-3 : 2e-5) << "i=" << i;
}
}  // namespace

namespace {
using minfer::testing::IsaCap;
// The levels this CPU can run that have a SIMD attention kernel: AVX2 and
// AVX-512 on x86-64 (attn.cpp), NEON, dotprod and i8mm on ARM64 (all three
// run arm/attn_neon.cpp's kernel).
std::vector<cpu::IsaLevel> attn_simd_levels() {
    std::vector<cpu::IsaLevel> out;
    for (cpu::IsaLevel l : cpu::isa_levels_supported()) {
        IsaCap cap(l);
        if (cpu::attn_simd_supported(64)) out.push_back(l);
    }
    return out;
}
}  // namespace

TEST(CpuAttn, EverySimdLevelMatchesTheScalarLoop) {
    // The same cases as the two tests below, at each level in turn (an
    // AVX-512 host runs the AVX2 kernels too): decode rows (2 tokens) and
    // prompt chunks (21 tokens, causal masks inside a vector, GQA 7:1, 2:1,
    // 1:1, head_dim 48, 64, 128).
    const auto levels = attn_simd_levels();
    if (levels.empty()) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
    for (cpu::IsaLevel l : levels) {
        IsaCap cap(l);
        SCOPED_TRACE(cpu::isa_name(l));
        ASSERT_TRUE(cpu::attn_simd_supported(64));
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{2, 2, 128, 64}})
            for (DType kvt : {DType::F32, DType::F16}) {
                expect_simd_attn_matches_scalar(s, kvt, 2, 37);
                expect_simd_attn_matches_scalar(s, kvt, 1, 1);  // one key
                expect_simd_attn_matches_scalar(s, kvt, 1, 8);  // one full 8-vector
            }
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{4, 2, 128, 64},
                            AttnSetup{2, 2, 128, 64}, AttnSetup{4, 2, 48, 64}})
            for (DType kvt : {DType::F32, DType::F16}) {
                expect_simd_attn_matches_scalar(s, kvt, 21, 45);
                expect_simd_attn_matches_scalar(s, kvt, 4, 4);  // keys < kKeysPerStep rows
            }
        // Prompts of several blocks of tokens (op_attn's items: 64 tokens at
        // GQA 2:1, 128 at 1:1, 16 at 7:1), whose row vectors see fewer keys
        // than their block's last: from an empty cache and after 20 keys.
        for (AttnSetup s :
             {AttnSetup{4, 2, 128, 192}, AttnSetup{2, 2, 64, 192}, AttnSetup{14, 2, 64, 192}})
            for (DType kvt : {DType::F32, DType::F16}) {
                expect_simd_attn_matches_scalar(s, kvt, 150, 150);
                expect_simd_attn_matches_scalar(s, kvt, 150, 170);
            }
        if (HasFailure()) return;
    }
    // Scalar: no SIMD attention at all (the loop the others are compared with).
    IsaCap cap(cpu::IsaLevel::Scalar);
    EXPECT_FALSE(cpu::attn_simd_supported(64));
}

TEST(CpuAttn, SimdPathMatchesScalarLoopForF32AndF16Caches) {
    // Two tokens (the per-head kernel of decode): 37 cached rows (two full
    // 16-blocks and a masked tail), GQA 7:1 and 1:1, head_dim 64 and 128.
    // once per level with a SIMD attention kernel
    int levels = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        if (!cpu::attn_simd_supported(64)) return;
        ++levels;
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{2, 2, 128, 64}})
            for (DType kvt : {DType::F32, DType::F16})
                expect_simd_attn_matches_scalar(s, kvt, 2, 37);
    });
    if (levels == 0) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
}

TEST(CpuAttn, ATokenAloneIsBitwiseItsRowsInAChunk) {
    // A decode token (1 token: `group` rows; up to 8 rows take the
    // keys-in-lanes kernel) against the same token inside a 21-token
    // prompt chunk (the many-rows kernel, causal masks inside a vector):
    // the outputs must be bitwise equal, so a sequence's result does not
    // depend on how its prompt was chunked or what shares its pass. GQA
    // 1:1, 2:1, 4:1, 7:1; key counts 24..44, not multiples of 8 or 16, and
    // for Qwen3-0.6B's heads (16 / 8, 128) a 150-token chunk at keys
    // 40..189 (three blocks of tokens; several key blocks of the few-rows
    // P V, which reloads its sums between blocks).
    // On ARM64 every row takes the one per-row NEON kernel over keys
    // gathered for the whole chunk: the check there is that a row's result
    // does not depend on the gather's extent or on the chunk's other rows.
    const auto levels = attn_simd_levels();
    if (levels.empty()) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
    for (cpu::IsaLevel l : levels) {
        IsaCap cap(l);
        for (AttnSetup s :
             {AttnSetup{2, 2, 64, 64}, AttnSetup{4, 2, 128, 64}, AttnSetup{8, 2, 64, 64},
              AttnSetup{14, 2, 64, 64}, AttnSetup{16, 8, 128, 192}})
            for (DType kvt : {DType::F32, DType::F16}) {
                SCOPED_TRACE(std::string(cpu::isa_name(l)) + " " + std::string(dtype_name(kvt)) +
                             " heads=" + std::to_string(s.n_head));
                const int64_t kv = int64_t{s.n_head_kv} * s.hd, nq = int64_t{s.n_head} * s.hd;
                // Qwen3's heads: 150 tokens, three of op_attn's blocks of 64
                const int64_t n_tok = s.n_ctx >= 192 ? 150 : 21, p0 = s.n_ctx - n_tok - 3;
                RandomKv cache(kv * s.n_ctx, kvt, 41);
                void* K = cache.k();
                void* V = cache.v();
                auto q = random_floats(static_cast<size_t>(nq * n_tok), 43);
                std::vector<int32_t> pos(static_cast<size_t>(n_tok));
                for (int64_t i = 0; i < n_tok; ++i) pos[size_t(i)] = int32_t(p0 + i);
                ThreadPool pool(2);
                auto run = [&](const float* qs, const int32_t* ps, int64_t n, float* out) {
                    Node node = make_node(Op::Attn, {nq, n, 1, 1});
                    node.meta = s.meta();
                    node.meta.kv_type = kvt;
                    NodeData d{{qs, nullptr, ps},
                               out,
                               K,
                               V,
                               {{nq, n, 1, 1}, {kv, s.n_ctx, 1, 1}, {n, 1, 1, 1}}};
                    cpu::run_node(node, d, pool);
                };
                std::vector<float> chunk(static_cast<size_t>(nq * n_tok), NAN);
                run(q.data(), pos.data(), n_tok, chunk.data());
                for (int64_t t = 0; t < n_tok; ++t) {
                    std::vector<float> alone(static_cast<size_t>(nq), NAN);
                    run(q.data() + t * nq, pos.data() + t, 1, alone.data());
                    ASSERT_EQ(0, std::memcmp(alone.data(), chunk.data() + t * nq,
                                             static_cast<size_t>(nq) * 4))
                        << "token " << t << " (position " << p0 + t << ")";
                }
            }
    }
}

TEST(CpuAttn, ManyRowsPathMatchesScalarLoopForF32AndF16Caches) {
    // A prompt chunk (the many-rows kernel): 21 tokens at positions 24..44,
    // so blocks of tokens see different key counts (causal masking inside a
    // vector) and key counts not a multiple of 4; GQA 7:1 (112-row blocks),
    // 2:1, 1:1 and head_dim 48, 64, 128 (3, 4 and 8 vectors per row).
    // once per level with a SIMD attention kernel
    int levels = 0;
    minfer::testing::for_each_isa_level([&](cpu::IsaLevel) {
        if (!cpu::attn_simd_supported(64)) return;
        ++levels;
        for (AttnSetup s : {AttnSetup{14, 2, 64, 64}, AttnSetup{4, 2, 128, 64},
                            AttnSetup{2, 2, 128, 64}, AttnSetup{4, 2, 48, 64}})
            for (DType kvt : {DType::F32, DType::F16})
                expect_simd_attn_matches_scalar(s, kvt, 21, 45);
    });
    if (levels == 0) GTEST_SKIP() << "no SIMD attention kernel on this CPU";
}
