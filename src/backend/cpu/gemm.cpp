#include "backend/cpu/gemm.h"

#include <cstring>

#include "backend/cpu/arm/gemm_neon.h"
#include "backend/cpu/gemm_layout.h"
#include "backend/cpu/isa.h"
#include "backend/cpu/kernel_table.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/x86/gemm_avx2.h"
#include "backend/cpu/x86/gemm_avx512.h"
#include "tensor/blocks.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define MINFER_GEMM_X86 1
#endif
#if defined(__aarch64__)
#define MINFER_GEMM_ARM 1
#endif

namespace minfer::cpu {

using namespace tensor;

namespace {

using gemm_layout::kGroup;  // elements per scale in the common form
// The GEMM of the current level's kernel table: read at each call, so the
// MINFER_CPU cap (isa.h) moves it too.
GemmIsa gemm_isa() {
    return kernels().gemm;
}

}  // namespace

// Which prompt GEMM runs at a level: the AVX-512 VNNI one
// (x86/gemm_avx512.cpp), the AVX2 one (x86/gemm_avx2.cpp), the ARM64 one (arm/gemm_neon.cpp: smmla,
// sdot or plain NEON by level), or none (the dot-product path).
GemmIsa gemm_at(IsaLevel level) {
#ifdef MINFER_GEMM_X86
    if (level == IsaLevel::Avx512) return GemmIsa::Avx512;
    if (level == IsaLevel::Avx2) return GemmIsa::Avx2;
#endif
#ifdef MINFER_GEMM_ARM
    if (level == IsaLevel::Neon || level == IsaLevel::Dotprod || level == IsaLevel::I8mm)
        return GemmIsa::Arm;
#endif
    (void)level;
    return GemmIsa::None;
}

const char* gemm_name() {
    switch (gemm_isa()) {
        case GemmIsa::Avx512:
            return "avx512 vpdpbusd";
        case GemmIsa::Avx2:
            return avx_vnni_enabled() ? "avx2 vpdpbusd (AVX-VNNI)" : "avx2 vpmaddubsw";
#ifdef MINFER_GEMM_ARM
        case GemmIsa::Arm:
            return arm::gemm_name();
#endif
        default:
            return nullptr;
    }
}

bool gemm_supported(DType t, int64_t K) {
    if (gemm_isa() == GemmIsa::None || K % 64 != 0) return false;
    switch (t) {
        case DType::Q8_0:
        case DType::Q4_0:
        case DType::Q5_0:
            return true;
        case DType::Q4_K:
        case DType::Q5_K:
        case DType::Q6_K:
            return K % QK_K == 0;
        default:
            return false;
    }
}

size_t gemm_act_row_bytes(DType act, int64_t K) {
    // q [K], d per 16, and for Q8_K the sums (gemm.h): ARM64's float per
    // 32, x86-64's int16 per 32 and int32 per 16 (every byte written)
#ifdef MINFER_GEMM_ARM
    const size_t sums = static_cast<size_t>(K / 32) * sizeof(float);
#else
    const size_t sums = static_cast<size_t>(K / 32) * sizeof(int16_t) +
                        static_cast<size_t>(K / 16) * sizeof(int32_t);
#endif
    return static_cast<size_t>(K) + static_cast<size_t>(K / kGroup) * sizeof(float) +
           (act == DType::Q8_K ? sums : 0);
}

void gemm_pack_act(DType act, const void* row, int64_t K, void* out) {
    auto* q = static_cast<uint8_t*>(out);
    auto* d = reinterpret_cast<float*>(q + K);
    if (act == DType::Q8_0) {
        // vpdpbusd takes these activations unsigned (q + 128, the panel's
        // correction takes the 128 back out); the AVX2 and ARM64 kernels
        // (vpsignb, sdot, smmla: signed x signed) take them signed.
        const uint8_t flip = gemm_isa() == GemmIsa::Avx512 ? 0x80 : 0;
        const auto* x = static_cast<const block_q8_0*>(row);
        for (int64_t b = 0; b < K / 32; ++b) {
            for (int j = 0; j < 32; ++j) q[32 * b + j] = static_cast<uint8_t>(x[b].qs[j]) ^ flip;
            d[2 * b] = d[2 * b + 1] = fp16_to_fp32(x[b].d);
        }
        return;
    }
    MINFER_ASSERT(act == DType::Q8_K);
    const auto* x = static_cast<const block_q8_K*>(row);
    for (int64_t b = 0; b < K / QK_K; ++b) {
        std::memcpy(q + QK_K * b, x[b].qs, QK_K);
        for (int g = 0; g < 16; ++g) d[16 * b + g] = x[b].d;
    }
    void* sums = d + K / kGroup;
#ifdef MINFER_GEMM_ARM
    auto* bs = static_cast<float*>(sums);
    for (int64_t b = 0; b < K / QK_K; ++b)
        for (int g = 0; g < 8; ++g)
            bs[8 * b + g] = static_cast<float>(x[b].bsums[2 * g] + x[b].bsums[2 * g + 1]);
#else
    auto* s32 = static_cast<int16_t*>(sums);
    auto* off16 = reinterpret_cast<int32_t*>(s32 + K / 32);
    for (int64_t b = 0; b < K / QK_K; ++b)
        for (int g = 0; g < 16; ++g) {
            if (g % 2 == 0)
                s32[8 * b + g / 2] = static_cast<int16_t>(x[b].bsums[g] + x[b].bsums[g + 1]);
            off16[16 * b + g] = -32 * x[b].bsums[g];
        }
#endif
}

int64_t gemm_tile_rows() {
    switch (gemm_isa()) {
        case GemmIsa::Avx512:
            return avx512::gemm_tile_rows();
        case GemmIsa::Avx2:
            return avx2::gemm_tile_rows();
#ifdef MINFER_GEMM_ARM
        case GemmIsa::Arm:
            return arm::gemm_tile_rows();
#endif
        default:
            return 0;
    }
}

size_t gemm_scratch_bytes(int64_t K) {
    switch (gemm_isa()) {
        case GemmIsa::Avx512:
            return avx512::gemm_scratch_bytes(K);
        case GemmIsa::Avx2:
            return avx2::gemm_scratch_bytes(K);
#ifdef MINFER_GEMM_ARM
        case GemmIsa::Arm:
            return arm::gemm_scratch_bytes(K);
#endif
        default:
            return 0;
    }
}

void gemm_rows(DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes, int64_t K,
               int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride, int64_t n_tokens,
               float* out, int64_t out_stride, void* scratch) {
    switch (gemm_isa()) {
        case GemmIsa::Avx512:
            return avx512::gemm_rows(wtype, interleaved, w, w_row_bytes, K, r0, r1, act, act_stride,
                                     n_tokens, out, out_stride, scratch);
        case GemmIsa::Avx2:
            return avx2::gemm_rows(wtype, interleaved, w, w_row_bytes, K, r0, r1, act, act_stride,
                                   n_tokens, out, out_stride, scratch);
#ifdef MINFER_GEMM_ARM
        case GemmIsa::Arm:
            return arm::gemm_rows(wtype, interleaved, w, w_row_bytes, K, r0, r1, act, act_stride,
                                  n_tokens, out, out_stride, scratch);
#endif
        default:
            MINFER_ASSERT_MSG(false, "gemm_rows at a level without a GEMM");
    }
}

void gemm_quantize_act(DType act, const float* x, int64_t K, void* out, void* tmp) {
    if (act == DType::Q8_K && gemm_isa() == GemmIsa::Avx512) {
        quantize_q8_K_row_vnni_gemm(x, out, K);
        return;
    }
    quantize_act_row(act, x, tmp, K);
    gemm_pack_act(act, tmp, K, out);
}

}  // namespace minfer::cpu
