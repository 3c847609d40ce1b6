#include "backend/cpu/kernel_table.h"

#include <array>

#include "tensor/dtype.h"

namespace minfer::cpu {

namespace {

using tensor::DType;

// Every weight type a dot product exists for (quant_dot.h).
constexpr DType kWeightTypes[] = {DType::F32,  DType::F16,    DType::BF16,  DType::Q4_0,
                                  DType::Q4_1, DType::Q5_0,   DType::Q5_1,  DType::Q8_0,
                                  DType::Q2_K, DType::Q3_K,   DType::Q4_K,  DType::Q5_K,
                                  DType::Q6_K, DType::IQ4_NL, DType::IQ4_XS};

KernelTable build(IsaLevel level, bool avx_vnni) {
    KernelTable t;
    t.level = level;
    t.avx_vnni = avx_vnni;
    for (DType w : kWeightTypes) {
        const size_t i = KernelTable::slot(w);
        t.vec_dot[i] = vec_dot_at(level, w);
        t.group_dot[i] = group_dot_at(level, avx_vnni, w);
        t.group_dot_many[i] = group_dot_many_at(level, w);
    }
    t.gemm = gemm_at(level);
    t.attn_rows = attn_rows_at(level);
    t.store_k_cells = store_k_cells_at(level);
    t.swiglu = swiglu_at(level);
    t.sum_squares = sum_squares_at(level);
    return t;
}

constexpr size_t kLevels = static_cast<size_t>(IsaLevel::I8mm) + 1;

// [level][avx_vnni]: built once, at the first use (tables hold pointers
// only, so a level the CPU lacks is built too and never used).
const std::array<std::array<KernelTable, 2>, kLevels>& tables() {
    static const auto all = [] {
        std::array<std::array<KernelTable, 2>, kLevels> t;
        for (size_t l = 0; l < kLevels; ++l)
            for (int vnni = 0; vnni < 2; ++vnni)
                t[l][static_cast<size_t>(vnni)] = build(static_cast<IsaLevel>(l), vnni != 0);
        return t;
    }();
    return all;
}

}  // namespace

const KernelTable& kernels_at(IsaLevel level) {
    return tables()[static_cast<size_t>(level)][avx_vnni_enabled() ? 1 : 0];
}

const KernelTable& kernels() {
    return kernels_at(isa_level());
}

}  // namespace minfer::cpu
