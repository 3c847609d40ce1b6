// The test data of the CPU kernel tests (test_kernels.cpp, test_kernels_ops.cpp):
// random floats, random weights with sane block scales (every bit pattern of the
// quant fields), graph nodes, the weight types.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/attn.h"
#include "backend/cpu/gemm.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/quant_dot.h"
#include "ir/kv_layout.h"
#include "isa_levels.h"
#include "tensor/blocks.h"
#include "tensor/interleave.h"
#include "tensor/quants.h"
#include "util/error.h"

using namespace minfer;
using namespace minfer::tensor;
using minfer::cpu::NodeData;
using minfer::graph::Node;
using minfer::graph::Op;

namespace {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(n);
    for (auto& x : v) x = u(rng);
    return v;
}

// Byte offsets of the f16 scale fields of one block, per type.
inline std::vector<size_t> scale_offsets(DType t) {
    switch (t) {
        case DType::Q4_0:
        case DType::Q5_0:
        case DType::Q8_0:
        case DType::IQ4_NL:
        case DType::IQ4_XS:
            return {0};
        case DType::Q4_1:
        case DType::Q5_1:
        case DType::Q4_K:
        case DType::Q5_K:
            return {0, 2};
        case DType::Q2_K:
            return {80, 82};
        case DType::Q3_K:
            return {108};
        case DType::Q6_K:
            return {208};
        default:
            return {};
    }
}

// A weight [K, M] of type t: random bytes, block scales in [0.002, 0.02]
// (mins of either sign), plain types random values in [-1, 1].
struct Weight {
    std::vector<uint8_t> bytes;
    TensorView view;
};
inline Weight make_weight(DType t, int64_t K, int64_t M, uint32_t seed) {
    Weight w;
    const size_t row = row_size(t, K);
    w.bytes.resize(row * static_cast<size_t>(M));
    std::mt19937 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    if (t == DType::F32 || t == DType::F16 || t == DType::BF16) {
        for (int64_t i = 0; i < K * M; ++i) {
            const float f = u(rng);
            if (t == DType::F32) std::memcpy(w.bytes.data() + 4 * i, &f, 4);
            uint16_t h = t == DType::F16 ? fp32_to_fp16(f) : fp32_to_bf16(f);
            if (t != DType::F32) std::memcpy(w.bytes.data() + 2 * i, &h, 2);
        }
    } else {
        for (auto& b : w.bytes) b = static_cast<uint8_t>(rng());
        const size_t bs = traits(t).type_size;
        const std::vector<size_t> offs = scale_offsets(t);
        for (size_t blk = 0; blk < w.bytes.size() / bs; ++blk) {
            for (size_t k = 0; k < offs.size(); ++k) {
                float s = 0.002f + 0.018f * (u(rng) * 0.5f + 0.5f);
                if (k == 1) s *= (u(rng) < 0 ? -1.0f : 1.0f);  // the min / dmin
                const uint16_t h = fp32_to_fp16(s);
                std::memcpy(w.bytes.data() + blk * bs + offs[k], &h, 2);
            }
        }
    }
    w.view.name = std::string("w_") + std::string(dtype_name(t));
    w.view.type = t;
    w.view.ne = {K, M, 1, 1};
    w.view.data = w.bytes.data();
    w.view.nbytes = w.bytes.size();
    return w;
}

inline Node make_node(Op op, std::array<int64_t, 4> ne) {
    Node n;
    n.op = op;
    n.name = std::string(graph::op_name(op));
    n.ne = ne;
    return n;
}

const DType kWeightTypes[] = {DType::F32,  DType::F16,  DType::BF16, DType::Q4_0,   DType::Q4_1,
                              DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q2_K,   DType::Q3_K,
                              DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

}  // namespace
