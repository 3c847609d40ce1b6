// Tests of tensor/quantize_model: the error of every quantizer on Gaussian
// data against llama.cpp's measured figures, and the per-tensor type rules on
// a tiny model written with the project's own GGUF writer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "cli_runner.h"
#include "gguf/gguf.h"
#include "model/quantize_model.h"
#include "tensor/quants.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::tensor;
using namespace minfer::model;

namespace {

std::vector<float> gaussian(size_t n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i += 2) {
        const double u1 = (rng() + 1.0) / 4294967297.0;
        const double u2 = (rng() + 0.5) / 4294967296.0;
        const double r = std::sqrt(-2.0 * std::log(u1));
        v[i] = static_cast<float>(r * std::cos(2 * M_PI * u2));
        if (i + 1 < n) v[i + 1] = static_cast<float>(r * std::sin(2 * M_PI * u2));
    }
    return v;
}

double rel_rmse(DType t, const std::vector<float>& x, int64_t row) {
    std::vector<uint8_t> q(row_size(t, row));
    std::vector<float> y(static_cast<size_t>(row));
    double e2 = 0, w2 = 0;
    for (size_t r = 0; r < x.size() / row; ++r) {
        quantize_row(t, x.data() + r * row, q.data(), row);
        dequantize_row(t, q.data(), y.data(), row);
        for (int64_t j = 0; j < row; ++j) {
            const double d = x[r * row + j] - y[j];
            e2 += d * d;
            w2 += static_cast<double>(x[r * row + j]) * x[r * row + j];
        }
    }
    return std::sqrt(e2 / w2);
}

std::string tmp_path(const std::string& name) {
    return (std::filesystem::temp_directory_path() /
            ("minfer_test_qm_" + std::to_string(::getpid()) + "_" + name))
        .string();
}

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
    std::vector<uint8_t> b(v.size() * 4);
    std::memcpy(b.data(), v.data(), b.size());
    return b;
}

}  // namespace

// llama.cpp's mean relative RMSE ||w - deq(q(w))|| / ||w|| per type, measured
// on the 2-D weights of synth_model.py's qwen2-mini (Gaussian weights). The
// quantizers are scale invariant, so Gaussian rows give the same figure; with
// 256 rows of 256 (65536 values) the sampling error of the estimate is about
// 0.3% (relative), so +2% is a deterministic bound with a wide margin — and
// a real regression (a wrong rounding, a lost scale bit) costs far more.
TEST(QuantizeModel, GaussianErrorWithinLlamaCppFigures) {
    const auto x = gaussian(256 * 256, 2024);
    const struct {
        DType t;
        double llama;
    } figures[] = {{DType::Q4_0, 0.0859}, {DType::Q4_1, 0.0781},  {DType::Q5_0, 0.0427},
                   {DType::Q5_1, 0.0378}, {DType::Q8_0, 0.00534}, {DType::Q2_K, 0.297},
                   {DType::Q3_K, 0.151},  {DType::Q4_K, 0.0713},  {DType::Q5_K, 0.0361},
                   {DType::Q6_K, 0.0177}};
    for (const auto& f : figures) {
        const double e = rel_rmse(f.t, x, 256);
        EXPECT_LE(e, f.llama * 1.02) << dtype_name(f.t);
        // And not suspiciously better: that would mean the test data or the
        // measurement changed, not the quantizer.
        EXPECT_GE(e, f.llama * 0.95) << dtype_name(f.t);
    }
    // The non-linear grid must beat Q4_0 at the same 4.5 bits per weight.
    EXPECT_LT(rel_rmse(DType::IQ4_NL, x, 256), 0.0859);
    EXPECT_LT(rel_rmse(DType::IQ4_XS, x, 256), 0.0859);
}

TEST(QuantizeModel, RulesOnTinyModel) {
    // 8 layers: use_more_bits(i, 8) holds for i = 0 (first eighth), 6
    // ((6 - 1) % 3 == 2) and 7 (last eighth), and i = 3 ((3 - 1) % 3 == 2).
    const int n_layer = 8;
    gguf::Writer w;
    w.set_string("general.architecture", "qwen2");
    w.set_string("general.name", "tiny");
    w.set_u32("qwen2.block_count", n_layer);
    w.set_u32("qwen2.attention.head_count", 4);
    w.set_u32("qwen2.attention.head_count_kv", 2);
    w.set_string("custom.key", "kept");
    uint32_t seed = 1;
    auto add = [&](const std::string& name, std::vector<int64_t> ne) {
        int64_t n = 1;
        for (auto d : ne) n *= d;
        w.add_tensor(name, DType::F32, ne, f32_bytes(gaussian(static_cast<size_t>(n), seed++)));
    };
    add("token_embd.weight", {256, 16});
    for (int i = 0; i < n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        add(p + "attn_norm.weight", {256});
        add(p + "attn_q.weight", {896, 4});  // 896 % 256 != 0: Q4_K falls back to Q5_0
        add(p + "attn_q.bias", {896});
        add(p + "attn_v.weight", {256, 4});
        add(p + "ffn_down.weight", {256, 4});
    }
    add("output_norm.weight", {256});
    add("output.weight", {256, 16});
    const std::string in = tmp_path("in.gguf"), out = tmp_path("out.gguf");
    w.write(in);

    const QuantizeReport r = quantize_model(in, out, "Q4_K_M", {});
    EXPECT_EQ(r.file_type, 15u);
    const gguf::File f = gguf::File::open(out);
    EXPECT_EQ(f.get_int("general.file_type"), 15);
    EXPECT_EQ(f.get_int("general.quantization_version"), 2);
    EXPECT_EQ(f.get_string("custom.key"), "kept");
    EXPECT_EQ(f.get_string("general.name"), "tiny");

    auto type_of = [&](const std::string& name) {
        const gguf::TensorInfo* t = f.find_tensor(name);
        EXPECT_NE(t, nullptr) << name;
        return t ? t->type : DType::I32;
    };
    EXPECT_EQ(type_of("output.weight"), DType::Q6_K);
    EXPECT_EQ(type_of("token_embd.weight"), DType::Q4_K);  // untied: the default
    EXPECT_EQ(type_of("output_norm.weight"), DType::F32);
    for (int i = 0; i < n_layer; ++i) {
        const std::string p = "blk." + std::to_string(i) + ".";
        const bool more = i == 0 || i == 3 || i == 6 || i == 7;
        EXPECT_EQ(type_of(p + "attn_v.weight"), more ? DType::Q6_K : DType::Q4_K) << i;
        EXPECT_EQ(type_of(p + "ffn_down.weight"), more ? DType::Q6_K : DType::Q4_K) << i;
        EXPECT_EQ(type_of(p + "attn_q.weight"), DType::Q5_0) << i;
        EXPECT_EQ(type_of(p + "attn_norm.weight"), DType::F32) << i;
        EXPECT_EQ(type_of(p + "attn_q.bias"), DType::F32) << i;
    }
    // Every converted tensor reports a real (nonzero) error, below Q5_0's
    // and Q4_K's ~0.07 on Gaussian data with room for 4-row sampling noise.
    for (const auto& t : r.tensors) {
        if (!t.converted) continue;
        EXPECT_GT(t.rel_rmse(), 0.0) << t.name;
        EXPECT_LT(t.rel_rmse(), 0.08) << t.name;
    }
    std::filesystem::remove(in);
    std::filesystem::remove(out);
}

TEST(QuantizeModel, RuleDetails) {
    ModelQuantInfo tied;
    tied.n_layer = tied.n_attn_v = 24;
    tied.n_gqa = 7;
    tied.has_output = false;
    const std::array<int64_t, 4> wide{896, 151936, 1, 1}, w256{256, 64, 1, 1};
    // Tied embeddings are quantized as the output; 896 is not a multiple of
    // 256, so Q6_K's row rule gives Q8_0 (Qwen2.5-0.5B's token_embd in Q4_K_M).
    EXPECT_EQ(choose_tensor_type(15, tied, "token_embd.weight", wide, DType::F32), DType::Q8_0);
    EXPECT_EQ(choose_tensor_type(15, tied, "token_embd.weight", w256, DType::F32), DType::Q6_K);
    EXPECT_EQ(choose_tensor_type(7, tied, "token_embd.weight", w256, DType::F32), DType::Q8_0);
    EXPECT_EQ(choose_tensor_type(2, tied, "token_embd.weight", w256, DType::F32), DType::Q6_K);
    // Fallbacks for 896-wide rows.
    const std::array<int64_t, 4> r896{896, 128, 1, 1};
    EXPECT_EQ(choose_tensor_type(15, tied, "blk.1.attn_q.weight", r896, DType::F32), DType::Q5_0);
    EXPECT_EQ(choose_tensor_type(15, tied, "blk.0.attn_v.weight", r896, DType::F32), DType::Q8_0);
    EXPECT_EQ(choose_tensor_type(17, tied, "blk.1.attn_q.weight", r896, DType::F32), DType::Q5_1);
    EXPECT_EQ(choose_tensor_type(10, tied, "blk.1.attn_q.weight", r896, DType::F32), DType::Q4_0);
    EXPECT_EQ(choose_tensor_type(30, tied, "blk.1.attn_q.weight", r896, DType::F32), DType::IQ4_NL);
    // Q2_K with n_gqa >= 4: attn_v Q4_K; ffn_down and attn_output Q3_K.
    EXPECT_EQ(choose_tensor_type(10, tied, "blk.5.attn_v.weight", w256, DType::F32), DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(10, tied, "blk.5.ffn_down.weight", w256, DType::F32), DType::Q3_K);
    EXPECT_EQ(choose_tensor_type(10, tied, "blk.5.attn_output.weight", w256, DType::F32),
              DType::Q3_K);
    // Q3_K_M: attn_v Q5_K in the first two layers, then Q4_K; ffn_down Q5_K
    // for i < n/16, else Q4_K.
    EXPECT_EQ(choose_tensor_type(12, tied, "blk.1.attn_v.weight", w256, DType::F32), DType::Q5_K);
    EXPECT_EQ(choose_tensor_type(12, tied, "blk.2.attn_v.weight", w256, DType::F32), DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(12, tied, "blk.0.ffn_down.weight", w256, DType::F32), DType::Q5_K);
    EXPECT_EQ(choose_tensor_type(12, tied, "blk.9.ffn_down.weight", w256, DType::F32), DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(12, tied, "blk.9.ffn_gate.weight", w256, DType::F32), DType::Q3_K);
    // F16 files convert every 2-D weight, norms stay.
    EXPECT_EQ(choose_tensor_type(1, tied, "token_embd.weight", wide, DType::F32), DType::F16);
    EXPECT_EQ(choose_tensor_type(1, tied, "blk.0.attn_norm.weight", {896, 1, 1, 1}, DType::F32),
              DType::F32);
}

TEST(QuantizeModel, Errors) {
    const std::string in = tmp_path("err.gguf");
    {
        gguf::Writer w;
        w.set_string("general.architecture", "qwen2");
        std::vector<uint8_t> q(row_size(DType::Q8_0, 64));
        w.add_tensor("blk.0.attn_q.weight", DType::Q8_0, {64, 1}, q);
        w.write(in);
    }
    try {
        quantize_model(in, tmp_path("o.gguf"), "Q4_K_M");
        ADD_FAILURE() << "quantized input accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("already quantized"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("blk.0.attn_q.weight"), std::string::npos);
    }
    try {
        quantize_model(in, tmp_path("o.gguf"), "Q4_K_X");
        ADD_FAILURE() << "unknown type accepted";
    } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("Q4_K_M"), std::string::npos) << e.what();
    }
    EXPECT_THROW(quantize_model(tmp_path("missing.gguf"), tmp_path("o.gguf"), "Q8_0"), Error);
    std::filesystem::remove(in);
}

// The CLI end to end: help lists the types, bad TYPE exits non-zero.
TEST(QuantizeModel, CliHelpAndErrors) {
    const std::string bin = MINFER_BINARY;
    if (!std::filesystem::exists(bin)) GTEST_SKIP() << "no binary at " << bin;
    auto r = minfer::testing::run_cli("quantize --help");
    EXPECT_EQ(r.code, 0);
    EXPECT_NE(r.out.find("Q4_K_M"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("IQ4_XS"), std::string::npos) << r.out;
    r = minfer::testing::run_cli("quantize /nonexistent.gguf /tmp/x.gguf Q8_0");
    EXPECT_NE(r.code, 0);
    const std::string out = r.err;
    EXPECT_NE(out.find("not found"), std::string::npos) << out;
}

// llama.cpp's rules for MoE files (src/llama-quant.cpp): the router stays
// F32, an expert ffn_down takes its layer from its name (use_more_bits
// layers Q6_K in Q4_K_M), and exactly 8 experts give Q8_0 attn_k / attn_v
// and a Q5_K attn_output; with 16 experts those keep the dense rules.
// (minfer quantize of the qwen2moe-mini / qwen3moe-mini F32 files to Q4_K_M
// gives every tensor llama-quantize's type, and bitwise the same logits.)
TEST(QuantizeModel, MoeRulesFollowLlamaCpp) {
    using minfer::model::choose_tensor_type;
    using minfer::tensor::DType;
    minfer::model::ModelQuantInfo eight;
    eight.n_layer = 24;
    eight.n_attn_v = 24;
    eight.has_output = true;
    eight.n_expert = 8;
    minfer::model::ModelQuantInfo sixteen = eight;
    sixteen.n_expert = 16;
    const std::array<int64_t, 4> router{256, 8, 1, 1}, exps{256, 256, 8, 1}, attn{256, 256, 1, 1};
    const uint32_t q4_k_m = 15;
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.3.ffn_gate_inp.weight", router, DType::F32),
              DType::F32);
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.0.ffn_down_exps.weight", exps, DType::F32),
              DType::Q6_K);  // first eighth
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.4.ffn_down_exps.weight", exps, DType::F32),
              DType::Q4_K);  // (4 - 3) % 3 != 2
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.5.ffn_down_shexp.weight", attn, DType::F32),
              DType::Q6_K);  // (5 - 3) % 3 == 2
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.4.ffn_up_exps.weight", exps, DType::F32),
              DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.4.attn_k.weight", attn, DType::F32),
              DType::Q8_0);
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.4.attn_v.weight", attn, DType::F32),
              DType::Q8_0);
    EXPECT_EQ(choose_tensor_type(q4_k_m, eight, "blk.4.attn_output.weight", attn, DType::F32),
              DType::Q5_K);
    EXPECT_EQ(choose_tensor_type(q4_k_m, sixteen, "blk.4.attn_k.weight", attn, DType::F32),
              DType::Q4_K);
    EXPECT_EQ(choose_tensor_type(q4_k_m, sixteen, "blk.4.attn_output.weight", attn, DType::F32),
              DType::Q4_K);
}
