// Scratch layouts the prompt GEMMs share (x86/gemm_avx512.cpp, x86/gemm_avx2.cpp,
// arm/gemm_neon.cpp): weight rows in the common form of gemm_unpack.h, and
// the panels of the signed-activation kernels (AVX2, ARM64). AVX-512's
// panel adds a per-group correction and keeps its own struct.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.h"

namespace minfer::cpu::gemm_layout {

constexpr int64_t kGroup = 16;  // elements per scale in the common form

struct RowsForm {  // n rows of K in the common form, inside one scratch buffer
    int8_t* v;     // [n][K]
    float* s;      // [n][K/16]  scale of each group of 16
    float* m;      // [n][K/16]  -dmin * min of each group (K-quants with mins), else unused
};

inline size_t rows_form_bytes(int64_t K, int64_t n) {
    return static_cast<size_t>(n) *
           (static_cast<size_t>(K) + 2 * sizeof(float) * static_cast<size_t>(K / kGroup));
}

// The K-quants: super-blocks of 256 with a 6-bit (Q4_K, Q5_K) or 8-bit
// (Q6_K) scale per group, and activations in Q8_K.
inline bool is_k_quant(tensor::DType t) {
    return t == tensor::DType::Q4_K || t == tensor::DType::Q5_K || t == tensor::DType::Q6_K;
}

// Q4_K and Q5_K carry a min per group besides the scale.
inline bool has_mins(tensor::DType t) {
    return t == tensor::DType::Q4_K || t == tensor::DType::Q5_K;
}

// x86-64: a super-block's mins in a panel's o (Q4_K, Q5_K): kMinPairs
// vectors of `lanes` int32, the mins of groups 2k and 2k + 1 of each row
// as int16 pairs (vpmaddwd's and vpdpwssd's operand, against the
// activations' sums per 32 of those groups), then -dmin of each row as
// float. (ARM64's o holds -dmin * min per group of 32 as float.)
constexpr int kMinPairs = 4;
inline int32_t* min_block(void* o, int64_t sb, int64_t lanes) {
    return static_cast<int32_t*>(o) + sb * (kMinPairs + 1) * lanes;
}

// The other operand in the decode kernels: a Q8_K block's sums per 32 of
// groups 2k and 2k + 1 (each the sum of two of its bsums, |sum| <= 32 * 127,
// so it fits int16) as one int16 pair, group 2k in the low half.
inline int32_t sum32_pair(const int16_t* bsums, int k) {
    const int16_t* bs = bsums + 4 * k;
    return static_cast<int32_t>(static_cast<uint16_t>(bs[0] + bs[1]) |
                                static_cast<uint32_t>(static_cast<uint16_t>(bs[2] + bs[3])) << 16);
}

// One panel of `lanes` weight rows as a signed micro-kernel reads them (the
// order of the values is each kernel's own; see its file).
struct SignedPanel {
    int8_t* v;  // [K * lanes] values
    float* s;   // [K/G][lanes] scale of each group of G elements
    float* o;   // [K/32][lanes] (Q4_K, Q5_K) the mins: min_block on x86-64, else
                // -dmin * min of each 32; unused for other types
};

// Bytes of a panel at the smaller group (16): the larger of the two sizes.
inline size_t signed_panel_bytes(int64_t K, int64_t lanes) {
    const auto l = static_cast<size_t>(lanes);
    return l * static_cast<size_t>(K) + l * static_cast<size_t>(K / 16) * 4 +
           l * static_cast<size_t>(K / 32) * 4;
}

inline SignedPanel signed_panel_at(void* p, int64_t K, int64_t G, int64_t lanes) {
    auto* b = static_cast<uint8_t*>(p);
    SignedPanel f;
    f.v = reinterpret_cast<int8_t*>(b);
    f.s = reinterpret_cast<float*>(b + lanes * K);
    f.o = f.s + lanes * (K / G);
    return f;
}

// n rows in the common form: the same three arrays, in the same order, as
// a panel of n lanes at groups of kGroup.
inline RowsForm rows_form(void* scratch, int64_t K, int64_t n) {
    const SignedPanel p = signed_panel_at(scratch, K, kGroup, n);
    return {p.v, p.s, p.o};
}

// The scratch of one signed-GEMM call (gemm_rows of the AVX2 and ARM64
// kernels): `panels` panels of `lanes` rows, `lanes` rows in the common
// form, and one GGUF row (< 2 bytes per element for the types here).
inline size_t signed_scratch_bytes(int64_t K, int64_t lanes, int64_t panels) {
    return static_cast<size_t>(panels) * signed_panel_bytes(K, lanes) + rows_form_bytes(K, lanes) +
           2 * static_cast<size_t>(K);
}

struct SignedScratch {
    RowsForm rows;
    uint8_t* gguf_row;
};

// Carves scratch (signed_scratch_bytes) into panels p[0, panels) for group
// size G, the rows and the GGUF row.
inline SignedScratch carve_signed_scratch(void* scratch, int64_t K, int64_t G, int64_t lanes,
                                          int64_t panels, SignedPanel* p) {
    auto* base = static_cast<uint8_t*>(scratch);
    const size_t pb = signed_panel_bytes(K, lanes);
    for (int64_t i = 0; i < panels; ++i) p[i] = signed_panel_at(base + i * pb, K, G, lanes);
    base += panels * pb;
    return {rows_form(base, K, lanes), base + rows_form_bytes(K, lanes)};
}

}  // namespace minfer::cpu::gemm_layout
