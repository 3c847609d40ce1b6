#include "backend/cpu/x86/gemm_avx2.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "backend/cpu/gemm_layout.h"
#include "backend/cpu/isa.h"
#include "tensor/blocks.h"
#include "tensor/interleave.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MINFER_GEMM_AVX2 1
#include "backend/cpu/x86/transpose_avx2.h"
#endif

namespace minfer::cpu::avx2 {

using namespace tensor;

namespace {

using gemm_layout::kGroup;  // elements per scale in the common form
constexpr int kLanes = 8;   // weight rows per panel: the int32 lanes of a vector
constexpr int kPanels = 4;  // panels per tile (32 rows, as the AVX-512 tile)
#ifndef MINFER_GEMM2_R
#define MINFER_GEMM2_R 2
#endif
#ifndef MINFER_GEMM2_T
#define MINFER_GEMM2_T 4
#endif
// The micro-tile: kMR panels x kMT tokens. Per (panel, token) one int16
// partial sum and one float accumulator, plus a panel's quad and its
// absolute value: 2 x 4 spills a few registers, yet measured best of
// 1x4, 2x2, 2x3, 3x2, 2x4 (Zen 5 capped at AVX2, one thread, K = 896 /
// 4864, 512 tokens; the host was shared, so only roughly: 32-34 ms against
// 34-42 ms for the others).
constexpr int kMR = MINFER_GEMM2_R, kMT = MINFER_GEMM2_T;
static_assert(kPanels % kMR == 0);

using gemm_layout::has_mins;
using gemm_layout::RowsForm;

// One panel: 8 weight rows in the form the micro-kernel reads. Values are
// interleaved by 4 (quad q of row l at v[(q * 8 + l) * 4]), so one 32-byte
// load gives 4 values of every row, and vpmaddubsw + vpmaddwd against 4
// activation bytes broadcast to all lanes add their products into each
// row's own lane: no horizontal sums.
using Panel = gemm_layout::SignedPanel;  // v [K/4][8][4], s [K/G][8], o [K/32][8]

// Most quads whose int16 pair sums can be added before vpmaddwd widens
// them: each pair sum is at most 2 * max|w| * 127, and D of them must stay
// under 2^15 (Q8_0 weights reach 127: one; Q4_K's reach 15: all 8 of a group).
constexpr int quads_per_widen(DType t) {
    switch (t) {
        case DType::Q4_0:
            return 8;  // |w| <= 8
        case DType::Q5_0:
            return 8;  // |w| <= 16
        case DType::Q4_K:
            return 8;  // 0..15
        case DType::Q5_K:
            return 4;  // 0..31
        case DType::Q6_K:
            return 4;  // -32..31
        default:
            return 1;  // Q8_0: -128..127
    }
}

#ifdef MINFER_GEMM_AVX2
#define MINFER_AVX2_TARGET __attribute__((target("avx2,fma,f16c")))
#define MINFER_UNPACK_TARGET MINFER_AVX2_TARGET
#include "backend/cpu/gemm_unpack.h"

// Rows [r0, r1) (at most 8) of w into a panel; lanes past r1 - r0 are zero.
// An interleaved w (the AVX-512 layout, when the cap was lowered after
// loading) has each row taken out to gguf_row first.
MINFER_AVX2_TARGET void fill_panel(DType t, bool interleaved, const uint8_t* w, size_t w_row_bytes,
                                   int64_t K, int64_t G, int64_t r0, int64_t r1, const Panel& p,
                                   const RowsForm& rows, uint8_t* gguf_row) {
    const int64_t n = r1 - r0;
    unpack_rows_portable(t, interleaved, w, w_row_bytes, K, r0, n, rows, gguf_row);
    for (int64_t q0 = 0; q0 < K / 4; q0 += 8) {
        __m256i r[8];
        for (int l = 0; l < 8; ++l)
            r[l] =
                l < n
                    ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows.v + l * K + 4 * q0))
                    : _mm256_setzero_si256();
        simd::transpose8x8(r);
        for (int i = 0; i < 8; ++i)
            _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.v + (q0 + i) * 32), r[i]);
    }
    for (int64_t g = 0; g < K / G; ++g)
        for (int64_t l = 0; l < 8; ++l)
            p.s[g * 8 + l] = l < n ? rows.s[l * (K / kGroup) + g * G / kGroup] : 0.0f;
    if (has_mins(t))
        for (int64_t g = 0; g < K / 32; ++g)
            for (int64_t l = 0; l < 8; ++l)
                p.o[g * 8 + l] = l < n ? rows.m[l * (K / kGroup) + 2 * g] : 0.0f;
}

// Stores 8 floats, or the first `lanes` of them.
MINFER_AVX2_TARGET inline void store_lanes(float* o, __m256 v, int lanes) {
    if (lanes == 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::copy(tmp, tmp + lanes, o);
}

// Where the micro-kernels read the weights: quad(i, k) is quad k of the
// 8 rows of panel i (one row per 32-bit lane), scale(i, g) and mins(i, g)
// group g's scales and mins of those rows, as floats.
//
// Panels that fill_panel wrote (every type, every layout).
struct PanelSource {
    const Panel* p;
    MINFER_AVX2_TARGET __m256i quad(int i, int64_t k) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[i].v + k * 32));
    }
    MINFER_AVX2_TARGET __m256 scale(int i, int64_t g) const {
        return _mm256_loadu_ps(p[i].s + 8 * g);
    }
    MINFER_AVX2_TARGET __m256 mins(int i, int64_t g) const {
        return _mm256_loadu_ps(p[i].o + 8 * g);
    }
};

// Q8_0 weights regrouped at load (tensor/interleave.h), read in place: in
// each block of a 16-row group, the 16 f16 scales and then quad after quad
// of the 16 rows side by side (stored ^ 0x80), so panel 2j is the first 8
// rows of group j and panel 2j + 1 the other 8. Nothing is unpacked per
// call: at a few tokens (decode of many sequences) the unpacking cost as
// much as the products. The values and scales are the panels' own, so the
// outputs are bitwise those of the filled panels.
struct Q8_0GroupSource {
    const uint8_t* w;    // the 16-row group holding panel 0
    size_t group_bytes;  // bytes of 16 rows
    int panel0;          // the first panel: 0 or 1 (its group's half)
    static constexpr size_t kBlock = 16 * sizeof(block_q8_0);  // one block of 16 rows
    // Block b of panel i's group, and which half of it the panel is.
    MINFER_AVX2_TARGET const uint8_t* block(int i, int64_t b) const {
        return w + static_cast<size_t>((panel0 + i) / 2) * group_bytes +
               static_cast<size_t>(b) * kBlock;
    }
    int half(int i) const { return (panel0 + i) % 2; }
    MINFER_AVX2_TARGET __m256i quad(int i, int64_t k) const {
        // after the 16 scales (32 bytes), quad k % 8: 16 rows x 4 bytes
        const uint8_t* q = block(i, k / 8) + 32 + 64 * (k % 8) + 32 * half(i);
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    MINFER_AVX2_TARGET __m256 scale(int i, int64_t g) const {
        const uint8_t* d = block(i, g) + 16 * half(i);
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
    }
    MINFER_AVX2_TARGET __m256 mins(int, int64_t) const { return _mm256_setzero_ps(); }
};

#define MINFER_MICRO_TARGET MINFER_AVX2_TARGET
#define MINFER_MICRO_VNNI 0
namespace plain {
#include "backend/cpu/x86/gemm_avx2_micro.inc"
}  // namespace plain
#undef MINFER_MICRO_TARGET
#undef MINFER_MICRO_VNNI
#define MINFER_MICRO_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define MINFER_MICRO_VNNI 1
namespace vnni {
#include "backend/cpu/x86/gemm_avx2_micro.inc"
}  // namespace vnni
#undef MINFER_MICRO_TARGET
#undef MINFER_MICRO_VNNI
#endif

}  // namespace

int64_t gemm_tile_rows() {
    return kLanes * kPanels;
}

size_t gemm_scratch_bytes(int64_t K) {
    return gemm_layout::signed_scratch_bytes(K, kLanes, kPanels);
}

void gemm_rows(DType wtype, bool interleaved, const uint8_t* w, size_t w_row_bytes, int64_t K,
               int64_t r0, int64_t r1, const uint8_t* act, size_t act_stride, int64_t n_tokens,
               float* out, int64_t out_stride, void* scratch) {
#ifdef MINFER_GEMM_AVX2
    const int64_t n = r1 - r0;
    MINFER_ASSERT(n >= 1 && n <= gemm_tile_rows());
    MINFER_ASSERT(w_row_bytes <= static_cast<size_t>(2 * K));
    const int n_panels = static_cast<int>((n + kLanes - 1) / kLanes);
    const int last = static_cast<int>(n - kLanes * (n_panels - 1));
    const bool vnni = avx_vnni_enabled();
    // Tokens outside, panels inside: kMT tokens' activations stay in L1
    // while every panel of the tile reads them.
    auto run = [&](const auto& tab, auto src_at) {
        for (int64_t t = 0; t < n_tokens; t += kMT) {
            const int T = static_cast<int>(std::min<int64_t>(kMT, n_tokens - t));
            for (int i = 0; i < n_panels; i += kMR) {
                const int R = std::min(kMR, n_panels - i);
                tab[R - 1][T - 1](src_at(i), K, act, act_stride, t, out + kLanes * i, out_stride,
                                  i + R == n_panels ? last : kLanes);
            }
        }
    };
    if (wtype == DType::Q8_0 && interleaved && r0 % tensor::kInterleaveRows == 0 &&
        n % tensor::kInterleaveRows == 0) {
        const size_t group_bytes = tensor::kInterleaveRows * w_row_bytes;
        const uint8_t* w0 = w + static_cast<size_t>(r0) * w_row_bytes;
        run(vnni ? vnni::q8_0_group_table() : plain::q8_0_group_table(), [&](int i) {
            return Q8_0GroupSource{w0 + static_cast<size_t>(i / 2) * group_bytes, group_bytes,
                                   i % 2};
        });
        return;
    }
    const int64_t G = wtype == DType::Q6_K ? 16 : 32;
    Panel p[kPanels];
    const auto [rows, gguf_row] =
        gemm_layout::carve_signed_scratch(scratch, K, G, kLanes, kPanels, p);
    for (int i = 0; i < n_panels; ++i)
        fill_panel(wtype, interleaved, w, w_row_bytes, K, G, r0 + kLanes * i,
                   std::min(r1, r0 + kLanes * i + kLanes), p[i], rows, gguf_row);
    run(vnni ? vnni::table(wtype) : plain::table(wtype), [&](int i) { return PanelSource{p + i}; });
#else
    (void)wtype, (void)interleaved, (void)w, (void)w_row_bytes, (void)K, (void)r0, (void)r1,
        (void)act, (void)act_stride, (void)n_tokens, (void)out, (void)out_stride, (void)scratch;
    MINFER_ASSERT_MSG(false, "avx2::gemm_rows on a CPU without AVX2");
#endif
}

}  // namespace minfer::cpu::avx2
