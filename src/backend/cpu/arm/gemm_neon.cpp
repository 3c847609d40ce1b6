// The ARM64 prompt GEMM (gemm_neon.h). Weight rows are unpacked by
// gemm_unpack.h (shared with the x86 GEMMs) into the common form, then laid
// out as panels of 4 rows; the micro-kernels and the tile loop
// (gemm_neon.inc) are compiled once per level, each with its own integer
// step (dot_lane for the Quads layout, group_sums for Pairs), under the
// target that level needs.
#if defined(__aarch64__)

#include "backend/cpu/arm/gemm_neon.h"

#include <arm_neon.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/gemm_layout.h"
#include "backend/cpu/isa.h"
#include "tensor/blocks.h"
#include "tensor/interleave.h"
#include "util/error.h"

namespace minfer::cpu::arm {

using namespace tensor;

namespace {

using gemm_layout::kGroup;  // elements per scale in the common form
constexpr int kRows = 4;    // weight rows per panel: the int32 lanes of a vector
constexpr int kPanels = 4;  // panels per tile: 16 rows (untuned: emulation only so far)

// The unpackers need no target beyond the ARMv8.0 baseline (GCC
// vectorizes their byte loops with NEON).
#define MINFER_UNPACK_TARGET
#include "backend/cpu/gemm_unpack.h"

using gemm_layout::has_mins;
using gemm_layout::RowsForm;

// How a panel's values are arranged for the instruction that reads them.
//   Quads (neon, dotprod): quad q (values 4q..4q+3) of row l at
//     v[(4q + l) * 4], so one 16-byte load holds 4 values of every row and
//     an sdot by lane against one activation quad adds each row's four
//     products into that row's own lane: no horizontal sums.
//   Pairs (i8mm): rows (0, 1) and (2, 3) as pairs, 8 values of each row
//     together: chunk c (values 8c..8c+7) of row l at v[(4c + l) * 8], so one
//     16-byte load is the 2x8 block of a row pair that smmla multiplies
//     with the 2x8 block of two tokens.
enum class Layout { Quads, Pairs };

// One panel: 4 weight rows in the form the micro-kernels read (the layout above).
using Panel = gemm_layout::SignedPanel;  // v [K * 4], s [K/G][4], o [K/32][4]

// Rows [r0, r1) (at most 4) of w into a panel; rows past r1 - r0 are zero
// (values and scales). An interleaved w (tensor/interleave.h: the AVX-512
// layout, which ARM64 loads never make but tests do) has each row taken out
// to gguf_row first.
void fill_panel(DType t, bool interleaved, const uint8_t* w, size_t w_row_bytes, int64_t K,
                int64_t G, int64_t r0, int64_t r1, Layout layout, const Panel& p,
                const RowsForm& rows, uint8_t* gguf_row) {
    const int64_t n = r1 - r0;
    unpack_rows_portable(t, interleaved, w, w_row_bytes, K, r0, n, rows, gguf_row);
    // 16 values of each row at a time: a 4 x 4 transpose of 32-bit quads
    // (Quads) or of 64-bit halves within each row pair (Pairs).
    for (int64_t k = 0; k < K; k += 16) {
        int8x16_t r[kRows];
        for (int l = 0; l < kRows; ++l) r[l] = l < n ? vld1q_s8(rows.v + l * K + k) : vdupq_n_s8(0);
        int8_t* dst = p.v + 4 * k;
        if (layout == Layout::Quads) {
            const int32x4_t a = vreinterpretq_s32_s8(r[0]), b = vreinterpretq_s32_s8(r[1]),
                            c = vreinterpretq_s32_s8(r[2]), d = vreinterpretq_s32_s8(r[3]);
            const int64x2_t ab0 = vreinterpretq_s64_s32(vzip1q_s32(a, b)),  // a0 b0 a1 b1
                ab1 = vreinterpretq_s64_s32(vzip2q_s32(a, b)),              // a2 b2 a3 b3
                cd0 = vreinterpretq_s64_s32(vzip1q_s32(c, d)),
                            cd1 = vreinterpretq_s64_s32(vzip2q_s32(c, d));
            vst1q_s8(dst, vreinterpretq_s8_s64(vzip1q_s64(ab0, cd0)));  // a0 b0 c0 d0
            vst1q_s8(dst + 16, vreinterpretq_s8_s64(vzip2q_s64(ab0, cd0)));
            vst1q_s8(dst + 32, vreinterpretq_s8_s64(vzip1q_s64(ab1, cd1)));
            vst1q_s8(dst + 48, vreinterpretq_s8_s64(vzip2q_s64(ab1, cd1)));
        } else {
            int64x2_t h[kRows];
            for (int l = 0; l < kRows; ++l) h[l] = vreinterpretq_s64_s8(r[l]);
            vst1q_s8(dst, vreinterpretq_s8_s64(vzip1q_s64(h[0], h[1])));  // chunk 2k/16, rows 0 1
            vst1q_s8(dst + 16, vreinterpretq_s8_s64(vzip1q_s64(h[2], h[3])));
            vst1q_s8(dst + 32, vreinterpretq_s8_s64(vzip2q_s64(h[0], h[1])));  // the next chunk
            vst1q_s8(dst + 48, vreinterpretq_s8_s64(vzip2q_s64(h[2], h[3])));
        }
    }
    for (int64_t g = 0; g < K / G; ++g)
        for (int64_t l = 0; l < kRows; ++l)
            p.s[g * kRows + l] = l < n ? rows.s[l * (K / kGroup) + g * G / kGroup] : 0.0f;
    if (has_mins(t))
        for (int64_t g = 0; g < K / 32; ++g)
            for (int64_t l = 0; l < kRows; ++l)
                p.o[g * kRows + l] = l < n ? rows.m[l * (K / kGroup) + 2 * g] : 0.0f;
}

// The micro-kernels work on (panel, token pair) units of two int32x4 /
// float32x4 vectors, whose lanes hold, per layout:
//   Quads: [token 0: rows 0..3], [token 1: rows 0..3]
//   Pairs: [rows 0, 1 x tokens 0, 1], [rows 2, 3 x tokens 0, 1]
//          (lanes r0t0 r0t1 r1t0 r1t1: smmla's 2x2 result)
// These three spread per-row and per-token floats over those lanes and
// store a unit as token rows, so one float step serves both layouts and
// every output lane gets the same operations whatever its layout.
template <Layout L>
inline void row_lanes(float32x4_t rows, float32x4_t out[2]) {
    if constexpr (L == Layout::Quads) {
        out[0] = out[1] = rows;
    } else {
        out[0] = vzip1q_f32(rows, rows);  // r0 r0 r1 r1
        out[1] = vzip2q_f32(rows, rows);  // r2 r2 r3 r3
    }
}

template <Layout L>
inline void token_lanes(float t0, float t1, float32x4_t out[2]) {
    if constexpr (L == Layout::Quads) {
        out[0] = vdupq_n_f32(t0);
        out[1] = vdupq_n_f32(t1);
    } else {
        const float32x2_t both = vset_lane_f32(t1, vdup_n_f32(t0), 1);
        out[0] = out[1] = vcombine_f32(both, both);  // t0 t1 t0 t1
    }
}

// The first `rows` rows of token 0 to o0 and of token 1 to o1 (when not null).
template <Layout L>
inline void store_tokens(const float32x4_t v[2], float* o0, float* o1, int rows) {
    float32x4_t t[2] = {v[0], v[1]};
    if constexpr (L == Layout::Pairs) {
        t[0] = vuzp1q_f32(v[0], v[1]);  // r0t0 r1t0 r2t0 r3t0
        t[1] = vuzp2q_f32(v[0], v[1]);
    }
    float* o[2] = {o0, o1};
    for (int h = 0; h < 2; ++h) {
        if (o[h] == nullptr) continue;
        if (rows == kRows) {
            vst1q_f32(o[h], t[h]);
        } else {
            float tmp[kRows];
            vst1q_f32(tmp, t[h]);
            std::copy(tmp, tmp + rows, o[h]);
        }
    }
}

using MicroFn = void (*)(const Panel*, int64_t, const int8_t* const*, float* const*, int);

// Plain NEON (ARMv8.0). Per activation quad broadcast to all lanes,
// vmull_s8 multiplies it with one quad of each row (rows 0, 1 in the low
// half, 2, 3 in the high one); vpaddq_s16 adds neighbouring products
// (|product| <= 128 * 127, as the activations stop at 127, so a pair fits
// int16) and vpadalq_s16 the two pairs of each row into that row's lane.
namespace plain {
constexpr Layout kLayout = Layout::Quads;
// Micro-tile: panels x token pairs. One pair, not two as the other levels:
// the widening multiplies' temporaries made GCC 12 spill 2 x 2's integer
// loop (read off the object code; no ARM timing exists yet).
constexpr int kMR = 2, kMP = 1;

template <int L>
inline int32x4_t dot_lane(int32x4_t acc, int8x16_t w, int8x16_t a) {
    const int8x16_t q = vreinterpretq_s8_s32(vdupq_laneq_s32(vreinterpretq_s32_s8(a), L));
    const int16x8_t pairs =
        vpaddq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(q)), vmull_high_s8(w, q));
    return vpadalq_s16(acc, pairs);
}

#define MINFER_GEMM_NEON_QUADS
#include "backend/cpu/arm/gemm_neon.inc"
#undef MINFER_GEMM_NEON_QUADS
}  // namespace plain

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
// ARMv8.2 dot product: vdotq_laneq_s32 adds, into each row's lane, the four
// products of that row's quad with activation quad L.
namespace sdot {
constexpr Layout kLayout = Layout::Quads;
constexpr int kMR = 2, kMP = 2;  // 8 rows x 4 tokens (untuned: no ARM timing yet)

template <int L>
inline int32x4_t dot_lane(int32x4_t acc, int8x16_t w, int8x16_t a) {
    return vdotq_laneq_s32(acc, w, a, L);
}

#define MINFER_GEMM_NEON_QUADS
#include "backend/cpu/arm/gemm_neon.inc"
#undef MINFER_GEMM_NEON_QUADS
}  // namespace sdot
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod+i8mm")
// Int8 matrix multiply: vmmlaq_s32 adds a 2x8 block of a row pair times the
// transposed 2x8 block of a token pair (8 values of each token, zipped
// together here) into the 2x2 int32 result.
namespace mmla {
constexpr Layout kLayout = Layout::Pairs;
constexpr int kMR = 2, kMP = 2;  // 8 rows x 4 tokens (untuned: no ARM timing yet)

template <int R, int P, int G>
inline void group_sums(const Panel* p, int64_t g, const int8_t* const* av, int32x4_t isum[][P][2]) {
    for (int i = 0; i < R; ++i)
        for (int j = 0; j < P; ++j) isum[i][j][0] = isum[i][j][1] = vdupq_n_s32(0);
    for (int c = 0; c < G / 16; ++c) {
        const int64_t k = g * G + 16 * c;
        int8x16_t x[P][2];  // per token pair: values k..k+7 of both tokens, then k+8..k+15
        for (int j = 0; j < P; ++j) {
            const int64x2_t a0 = vreinterpretq_s64_s8(vld1q_s8(av[2 * j] + k));
            const int64x2_t a1 = vreinterpretq_s64_s8(vld1q_s8(av[2 * j + 1] + k));
            x[j][0] = vreinterpretq_s8_s64(vzip1q_s64(a0, a1));
            x[j][1] = vreinterpretq_s8_s64(vzip2q_s64(a0, a1));
        }
        for (int e = 0; e < 2; ++e)
            for (int i = 0; i < R; ++i) {
                const int8_t* v = p[i].v + 4 * (k + 8 * e);  // chunk (k + 8e) / 8
                const int8x16_t w01 = vld1q_s8(v), w23 = vld1q_s8(v + 16);
                for (int j = 0; j < P; ++j) {
                    isum[i][j][0] = vmmlaq_s32(isum[i][j][0], w01, x[j][e]);
                    isum[i][j][1] = vmmlaq_s32(isum[i][j][1], w23, x[j][e]);
                }
            }
    }
}

#include "backend/cpu/arm/gemm_neon.inc"
}  // namespace mmla
#pragma GCC pop_options

enum class Level { None, Plain, Sdot, Mmla };

Level level() {
    if (isa_at_least(IsaLevel::I8mm)) return Level::Mmla;
    if (isa_at_least(IsaLevel::Dotprod)) return Level::Sdot;
    if (isa_at_least(IsaLevel::Neon)) return Level::Plain;
    return Level::None;
}

}  // namespace

const char* gemm_name() {
    switch (level()) {
        case Level::Mmla:
            return "neon smmla";
        case Level::Sdot:
            return "neon sdot";
        case Level::Plain:
            return "neon vmull";
        case Level::None:
            break;
    }
    return nullptr;
}

int64_t gemm_tile_rows() {
    return kRows * kPanels;
}

size_t gemm_scratch_bytes(int64_t K) {
    return gemm_layout::signed_scratch_bytes(K, kRows, kPanels);
}

void gemm_rows(DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes, int64_t K,
               int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride, int64_t n_tokens,
               float* out, int64_t out_stride, void* scratch) {
    const Level lv = level();
    MINFER_ASSERT_MSG(lv != Level::None, "arm::gemm_rows below the Neon level");
    const int64_t n = r1 - r0;
    MINFER_ASSERT(n >= 1 && n <= gemm_tile_rows());
    MINFER_ASSERT(w_row_bytes <= static_cast<size_t>(2 * K));
    const int64_t G = wtype == DType::Q6_K ? 16 : 32;
    const Layout layout = lv == Level::Mmla ? Layout::Pairs : Layout::Quads;
    const int n_panels = static_cast<int>((n + kRows - 1) / kRows);
    Panel p[kPanels];
    const auto [rows, gguf_row] =
        gemm_layout::carve_signed_scratch(scratch, K, G, kRows, kPanels, p);
    for (int i = 0; i < n_panels; ++i)
        fill_panel(wtype, interleaved, w, w_row_bytes, K, G, r0 + kRows * i,
                   std::min(r1, r0 + kRows * i + kRows), layout, p[i], rows, gguf_row);
    const int last = static_cast<int>(n - kRows * (n_panels - 1));
    switch (lv) {
        case Level::Mmla:
            return mmla::run(wtype, p, n_panels, last, K, act, act_stride, n_tokens, out,
                             out_stride);
        case Level::Sdot:
            return sdot::run(wtype, p, n_panels, last, K, act, act_stride, n_tokens, out,
                             out_stride);
        default:
            return plain::run(wtype, p, n_panels, last, K, act, act_stride, n_tokens, out,
                              out_stride);
    }
}

}  // namespace minfer::cpu::arm

#endif  // __aarch64__
