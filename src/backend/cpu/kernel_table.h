// The kernels of one ISA level (isa.h), side by side: the dot product per
// weight type, the interleaved group dots, which prompt GEMM runs, the SIMD
// attention, the K-cache store and the row helpers of vec_ops.h. Each
// level's table is built once, in kernel_table.cpp, so the choice of every
// kernel family at every level is read in one place; the families' entry
// points (vec_dot_fn, group_dot_fn, gemm_name, attn_rows_simd, swiglu_row,
// ...) read the table of the current level.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "backend/cpu/attn.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/quant_dot.h"

namespace minfer::cpu {

// The prompt GEMM a level runs (gemm.h): AVX-512 VNNI
// (x86/gemm_avx512.cpp), AVX2
// (x86/gemm_avx2.cpp), ARM64 (arm/gemm_neon.cpp), or none.
enum class GemmIsa { None, Avx512, Avx2, Arm };

// The SIMD attention over query rows of one head group (attn.h).
using AttnRowsFn = void (*)(const AttnRows& a, float* scratch);

// vec_ops.h's row helpers.
using SwigluFn = void (*)(const float* a, const float* b, float* y, int64_t n);
using SumSquaresFn = double (*)(const float* x, int64_t n);

// Indexed by the DType's value (ggml's type id).
inline constexpr size_t kDTypeSlots = 31;

struct KernelTable {
    IsaLevel level = IsaLevel::Scalar;
    // Whether the Avx2 kernels of this table use AVX-VNNI (isa.h).
    bool avx_vnni = false;
    std::array<VecDotFn, kDTypeSlots> vec_dot{};               // nullptr: not a weight type
    std::array<GroupDotFn, kDTypeSlots> group_dot{};           // nullptr: de-interleave
    std::array<GroupDotManyFn, kDTypeSlots> group_dot_many{};  // nullptr: loop group_dot
    GemmIsa gemm = GemmIsa::None;
    AttnRowsFn attn_rows = nullptr;         // nullptr: the scalar loop
    StoreKCellsFn store_k_cells = nullptr;  // nullptr: row by row
    SwigluFn swiglu = nullptr;              // never nullptr once built
    SumSquaresFn sum_squares = nullptr;

    VecDotFn vec_dot_of(tensor::DType t) const { return vec_dot[slot(t)]; }
    GroupDotFn group_dot_of(tensor::DType t) const { return group_dot[slot(t)]; }
    GroupDotManyFn group_dot_many_of(tensor::DType t) const { return group_dot_many[slot(t)]; }
    static size_t slot(tensor::DType t) { return static_cast<size_t>(t); }
};

// The table of the level the kernels use now (isa_level(): the detected
// one, capped by MINFER_CPU or set_isa_cap; and avx_vnni_enabled()).
const KernelTable& kernels();
// The table of `level` (one this CPU can run), with AVX-VNNI as now.
const KernelTable& kernels_at(IsaLevel level);

// The families' choices at a given level, which kernel_table.cpp gathers
// (each in the file of its kernels, beside the functions it names).
VecDotFn vec_dot_at(IsaLevel level, tensor::DType weight);
GroupDotFn group_dot_at(IsaLevel level, bool avx_vnni, tensor::DType weight);
GroupDotManyFn group_dot_many_at(IsaLevel level, tensor::DType weight);
GemmIsa gemm_at(IsaLevel level);
AttnRowsFn attn_rows_at(IsaLevel level);
StoreKCellsFn store_k_cells_at(IsaLevel level);
SwigluFn swiglu_at(IsaLevel level);
SumSquaresFn sum_squares_at(IsaLevel level);

}  // namespace minfer::cpu
