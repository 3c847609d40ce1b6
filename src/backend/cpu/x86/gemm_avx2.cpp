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
#include "backend/cpu/x86/intrinsics.h"
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
// The micro-tile: kMR panels x kMT tokens. Per (panel, token) one integer
// sum and one float accumulator, plus a panel's quad and its absolute value:
// at 2 x 4 the integer sums stay in registers through a group's quads and
// only the float accumulators (touched once a group) spill; a larger tile
// spills the integer sums of the 16 ymm registers. MINFER_GEMM2_R /
// MINFER_GEMM2_T (compile definitions) change it to measure another one.
constexpr int kMR = MINFER_GEMM2_R, kMT = MINFER_GEMM2_T;
static_assert(kPanels % kMR == 0);

using gemm_layout::has_mins;
using gemm_layout::kMinPairs;
using gemm_layout::min_block;
using gemm_layout::RowsForm;

// One panel: 8 weight rows in the form the micro-kernel reads. Values are
// interleaved by 4 (quad q of row l at v[(q * 8 + l) * 4]), so one 32-byte
// load gives 4 values of every row, and vpmaddubsw + vpmaddwd against 4
// activation bytes broadcast to all lanes add their products into each
// row's own lane: no horizontal sums.
using Panel = gemm_layout::SignedPanel;  // v [K/4][8][4], s [K/G][8], o: min_block

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
#define MINFER_UNPACK_TARGET MINFER_TARGET_AVX2
#include "backend/cpu/gemm_unpack.h"

// Rows [r0, r1) (at most 8) of w into a panel; lanes past r1 - r0 are zero.
// An interleaved w (the AVX-512 layout, when the cap was lowered after
// loading) has each row taken out to gguf_row first.
MINFER_TARGET_AVX2 void fill_panel(DType t, bool interleaved, const uint8_t* w, size_t w_row_bytes,
                                   int64_t K, int64_t G, int64_t r0, int64_t r1, const Panel& p,
                                   const RowsForm& rows, uint8_t* gguf_row) {
    const int64_t n = r1 - r0;
    if (has_mins(t)) std::memset(p.o, 0, static_cast<size_t>(K / QK_K) * (kMinPairs + 1) * 32);
    unpack_rows_portable(t, interleaved, w, w_row_bytes, K, r0, n, rows, gguf_row,
                         [&](int64_t l, const uint8_t* row) {
                             if (has_mins(t)) k4_row_mins(t, row, K, l, kLanes, p.o);
                         });
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
}

// Stores 8 floats, or the first `lanes` of them.
MINFER_TARGET_AVX2 inline void store_lanes(float* o, __m256 v, int lanes) {
    if (lanes == 8) {
        _mm256_storeu_ps(o, v);
        return;
    }
    alignas(32) float tmp[8];
    _mm256_store_ps(tmp, v);
    std::copy(tmp, tmp + lanes, o);
}

// Where the micro-kernels read the weights: quad(i, k) is quad k of the
// 8 rows of panel i (one row per 32-bit lane), scale(i, g) group g's
// scales of those rows as floats; with mins, min_pair(i, sb, k) the mins
// of groups 2k, 2k + 1 of super-block sb as int16 pairs and neg_dmin(i,
// sb) its -dmin (gemm_layout::min_block).
//
// Panels that fill_panel wrote (every type, every layout).
struct PanelSource {
    const Panel* p;
    MINFER_TARGET_AVX2 __m256i quad(int i, int64_t k) const {
        return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p[i].v + k * 32));
    }
    MINFER_TARGET_AVX2 __m256 scale(int i, int64_t g) const {
        return _mm256_loadu_ps(p[i].s + 8 * g);
    }
    MINFER_TARGET_AVX2 __m256i min_pair(int i, int64_t sb, int k) const {
        return _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(min_block(p[i].o, sb, kLanes) + kLanes * k));
    }
    MINFER_TARGET_AVX2 __m256 neg_dmin(int i, int64_t sb) const {
        return _mm256_loadu_ps(
            reinterpret_cast<const float*>(min_block(p[i].o, sb, kLanes) + kLanes * kMinPairs));
    }
    // A panel was just written: it is in the cache.
    void prefetch_block(int, int64_t) const {}
};

// Weights regrouped at load (tensor/interleave.h), read from their 16-row
// groups: panel p is half p % 2 of group p / 2 (the first or last 8 rows),
// so a group's vectors of one unit per row give a panel's 8 lanes with one
// 32-byte load. The values and scales are those fill_panel would write, so
// the outputs are bitwise those of the filled panels.
template <size_t kBlock>  // bytes of one block (or super-block) of 16 rows
struct GroupBase {
    const uint8_t* w;    // the 16-row group holding panel 0
    size_t group_bytes;  // bytes of 16 rows
    int panel0 = 0;      // the panel that is panel 0 here
    int half(int i) const { return (panel0 + i) % 2; }
    // Block b of panel i's group.
    const uint8_t* block(int i, int64_t b) const {
        return w + static_cast<size_t>((panel0 + i) / 2) * group_bytes +
               static_cast<size_t>(b) * kBlock;
    }
    // Asks for block b of panel i's group x86::kStreamAhead bytes early
    // (once per group: by its first panel).
    void prefetch_block(int i, int64_t b) const {
        if (half(i) == 0) x86::prefetch_ahead(block(i, b), kBlock);
    }
};
// The same source with panel i as its panel 0.
template <class Src>
Src from_panel(Src s, int i) {
    s.panel0 += i;
    return s;
}

MINFER_TARGET_AVX2 inline __m256i load32(const uint8_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// Hands v through an empty asm, so that GCC cannot reassociate an unrolled
// chain of integer adds into a tree: the tree's partial sums outnumber the
// 16 ymm registers and spill (the decode kernels' int16 and int32 sums).
MINFER_TARGET_AVX2 inline void keep_chain(__m256i& v) {
    asm("" : "+x"(v));
}
// Byte k (0..3) of each 32-bit lane of v, as that lane's int32.
MINFER_TARGET_AVX2 inline __m256i byte_of_lanes(__m256i v, int k) {
    const auto at = [k](int l) { return static_cast<int>(0x80808000u | (4 * l + k)); };  // 0x80: 0
    return _mm256_shuffle_epi8(
        v, _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(0), at(1), at(2), at(3)));
}

// Bytes k and k + 1 (k = 0, 2) of each 32-bit lane of v, as the lane's
// two int16 (a Q4_K min pair).
MINFER_TARGET_AVX2 inline __m256i byte_pair_of_lanes(__m256i v, int k) {
    const auto at = [k](int l) {
        return static_cast<int>(0x80008000u | (4 * l + k) | (4 * l + k + 1) << 16);
    };
    return _mm256_shuffle_epi8(
        v, _mm256_setr_epi32(at(0), at(1), at(2), at(3), at(0), at(1), at(2), at(3)));
}

// Q6_K's quad u (0..3) of a (half, quad) triple, unsigned (0..63): the
// low (u < 2) or high nibbles of ql (the first ql dword for even u, the
// second for odd), with qh bits 2u, 2u + 1 on top.
MINFER_TARGET_AVX2 inline __m256i q6_K_quad(__m256i ql, __m256i qh, int u) {
    const __m256i lo =
        _mm256_and_si256(u < 2 ? ql : _mm256_srli_epi16(ql, 4), _mm256_set1_epi8(0xF));
    // qh bits 2u, 2u + 1 of each byte to bits 4, 5: one shift, one mask
    const __m256i hi = _mm256_and_si256(u == 0   ? _mm256_slli_epi16(qh, 4)
                                        : u == 1 ? _mm256_slli_epi16(qh, 2)
                                        : u == 2 ? qh
                                                 : _mm256_srli_epi16(qh, 2),
                                        _mm256_set1_epi8(0x30));
    return _mm256_or_si256(lo, hi);
}

// Q8_0: per block of 16 rows the 16 f16 scales, then quad after quad of
// the 16 rows side by side (stored ^ 0x80): read in place, flipped back.
// Nothing is unpacked per call: at a few tokens (decode of many sequences)
// the unpacking cost as much as the products.
struct Q8_0GroupSource : GroupBase<16 * sizeof(block_q8_0)> {
    MINFER_TARGET_AVX2 __m256i quad(int i, int64_t k) const {
        // after the 16 scales (32 bytes), quad k % 8: 16 rows x 4 bytes
        const uint8_t* q = block(i, k / 8) + 32 + 64 * (k % 8) + 32 * half(i);
        return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                _mm256_set1_epi8(static_cast<char>(0x80)));
    }
    MINFER_TARGET_AVX2 __m256 scale(int i, int64_t g) const {
        const uint8_t* d = block(i, g) + 16 * half(i);
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
    }
};

// Q5_0's fifth bits, one row per 32-bit lane of qh. Bits 4q .. 4q + 3 (quad
// q) are nibble q % 2 of byte q / 2: q5_0_qh_byte copies byte j of each
// lane to the lane's four bytes (the bits of quads 2j and 2j + 1), and
// q5_0_fifth_bits tests byte m of that for bit m of quad q's nibble,
// making a set bit 0x10.
MINFER_TARGET_AVX2 inline __m256i q5_0_qh_byte(__m256i qh, int j) {
    const __m256i dword_bytes = _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0,
                                                  0x04040404, 0x08080808, 0x0C0C0C0C);
    return _mm256_shuffle_epi8(
        qh, _mm256_add_epi8(dword_bytes, _mm256_set1_epi8(static_cast<char>(j))));
}
MINFER_TARGET_AVX2 inline __m256i q5_0_fifth_bits(__m256i qh_byte, int q) {
    const __m256i bits = _mm256_set1_epi32(q % 2 ? static_cast<int>(0x80402010u) : 0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh_byte, bits), bits),
                            _mm256_set1_epi8(0x10));
}

// Q5_0 (tensor/interleave.h): per block of 16 rows the 16 f16 scales, the
// 16 qh dwords, then 4 qs dword units: unit u holds elements 4u.. in its low
// nibbles and 16 + 4u.. in its high. Element e's fifth bit is bit e of qh.
// Values q - 16 (signed), as gemm_unpack.h has them; the scale is d.
struct Q5_0GroupSource : GroupBase<16 * sizeof(block_q5_0)> {
    MINFER_TARGET_AVX2 __m256i quad(int i, int64_t k) const {
        const int q = static_cast<int>(k % 8);  // quad of the block: elements 4q .. 4q + 3
        const uint8_t* blk = block(i, k / 8);
        const __m256i qs = load32(blk + 96 + 64 * (q % 4) + 32 * half(i));
        const __m256i m4 = _mm256_set1_epi8(0xF);
        const __m256i lo =
            q < 4 ? _mm256_and_si256(qs, m4) : _mm256_and_si256(_mm256_srli_epi16(qs, 4), m4);
        const __m256i qh = load32(blk + 32 + 32 * half(i));
        const __m256i hi = q5_0_fifth_bits(q5_0_qh_byte(qh, q / 2), q);
        return _mm256_sub_epi8(_mm256_or_si256(lo, hi), _mm256_set1_epi8(16));
    }
    MINFER_TARGET_AVX2 __m256 scale(int i, int64_t g) const {
        const uint8_t* d = block(i, g) + 16 * half(i);
        return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
    }
};

// Q5_0 and the K-quants need unpacking, so the GEMM writes them into panels
// once per call (fill_from) while the decode kernel reads them in place.

// Q4_K (tensor/interleave.h): per super-block of 16 rows, the 16 d, the 16
// dmin (f16), the 12 scale bytes as 3 dword units, then 32 qs dword units:
// unit 8c + q holds elements 64c + 4q.. (group 2c) in its low nibbles and
// 64c + 32 + 4q.. (group 2c + 1) in its high. Values 0..15 (the mins kept
// apart) and scales d * sc as gemm_unpack.h has them.
struct Q4_KGroupSource : GroupBase<16 * sizeof(block_q4_K)> {
    MINFER_TARGET_AVX2 __m256i quad(int i, int64_t k) const {
        const int64_t sb = k / 64, j = k % 64 / 8, q = k % 8;  // super-block, group, quad
        const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
            block(i, sb) + 256 + 64 * (8 * (j / 2) + q) + 32 * half(i)));
        const __m256i m4 = _mm256_set1_epi8(0xF);
        return j % 2 ? _mm256_and_si256(_mm256_srli_epi16(x, 4), m4) : _mm256_and_si256(x, m4);
    }
    MINFER_TARGET_AVX2 __m256 halves(int i, int64_t sb, int at) const {
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block(i, sb) + at + 16 * half(i))));
    }
    // The 6-bit scales and mins of super-block sb, as q4k_scales_mins unpacks
    // a row's 12 bytes but 4 groups at once: per lane the bytes of scales
    // 0..3, of scales 4..7, of mins 0..3 and of mins 4..7.
    MINFER_TARGET_AVX2 void six_bit_bytes(int i, int64_t sb, __m256i b[4]) const {
        const uint8_t* u = block(i, sb) + 64 + 32 * half(i);  // unit n at u + 64 n
        const __m256i u0 = load32(u), u1 = load32(u + 64), u2 = load32(u + 128);
        const __m256i m6 = _mm256_set1_epi8(63), m4 = _mm256_set1_epi8(0xF),
                      top = _mm256_set1_epi8(0x30);  // bits 6, 7 of u0 / u1 moved to 4, 5
        b[0] = _mm256_and_si256(u0, m6);
        b[1] = _mm256_or_si256(_mm256_and_si256(u2, m4),
                               _mm256_and_si256(_mm256_srli_epi32(u0, 2), top));
        b[2] = _mm256_and_si256(u1, m6);
        b[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u2, 4), m4),
                               _mm256_and_si256(_mm256_srli_epi32(u1, 2), top));
    }
    // Super-block sb's 8 scales d * sc and its mins as kMinPairs int16
    // pairs (groups 2k, 2k + 1), from one unpacking of the 6-bit bytes.
    MINFER_TARGET_AVX2 void scales_mins(int i, int64_t sb, __m256 s[8],
                                        __m256i pairs[gemm_layout::kMinPairs]) const {
        __m256i b[4];
        six_bit_bytes(i, sb, b);
        const __m256 d = halves(i, sb, 0);
        for (int j = 0; j < 8; ++j)
            s[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(byte_of_lanes(b[j / 4], j % 4)));
        for (int k = 0; k < gemm_layout::kMinPairs; ++k)
            pairs[k] = byte_pair_of_lanes(b[2 + k / 2], 2 * (k % 2));
    }
    MINFER_TARGET_AVX2 __m256 neg_dmin(int i, int64_t sb) const {
        return _mm256_xor_ps(halves(i, sb, 32), _mm256_set1_ps(-0.0f));
    }
};

// Q6_K (tensor/interleave.h): per super-block, for half h and quad k the
// ql dwords 16h + k, 16h + 8 + k and the qh dword 8h + k of 16 rows (192
// bytes), which give elements 128h + 32u + 4k (u = 0..3: low nibbles of
// the first, of the second, high of the first, of the second, with qh bits
// 2u, 2u + 1 on top); then the int8 scales as 4 dword units, then the 16 d.
// Values q - 32 (signed), scales d * sc, no mins.
struct Q6_KGroupSource : GroupBase<16 * sizeof(block_q6_K)> {
    MINFER_TARGET_AVX2 __m256i quad(int i, int64_t k) const {
        const int64_t sb = k / 64, r = 4 * (k % 64);  // element r of super-block sb
        const int64_t h = r / 128, u = r % 128 / 32, kk = r % 32 / 4;
        const uint8_t* u3 = block(i, sb) + 192 * (8 * h + kk) + 32 * half(i);
        return _mm256_sub_epi8(
            q6_K_quad(load32(u3 + 64 * (u % 2)), load32(u3 + 128), static_cast<int>(u)),
            _mm256_set1_epi8(32));
    }
    // Group g's int8 scale (sc) and super-block sb's d of each row.
    MINFER_TARGET_AVX2 __m256i sc(int i, int64_t g) const {
        const int64_t sb = g / 16, j = g % 16;
        const __m256i u = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(block(i, sb) + 3072 + 64 * (j / 4) + 32 * half(i)));
        return _mm256_srai_epi32(
            _mm256_sll_epi32(u, _mm_cvtsi32_si128(static_cast<int>(24 - 8 * (j % 4)))), 24);
    }
    MINFER_TARGET_AVX2 __m256 d(int i, int64_t sb) const {
        return _mm256_cvtph_ps(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(block(i, sb) + 3328 + 16 * half(i))));
    }
    MINFER_TARGET_AVX2 __m256 scale(int i, int64_t g) const {
        return _mm256_mul_ps(d(i, g / 16), _mm256_cvtepi32_ps(sc(i, g)));
    }
};

// Panel i of a source written out as fill_panel writes it (v, s, and o
// with mins): the same values, so the micro-kernels' outputs are the same.
template <bool kMins, class Src>
MINFER_TARGET_AVX2 void fill_from(const Src& src, int i, int64_t K, int64_t G, const Panel& p) {
    for (int64_t k = 0; k < K / 4; ++k)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(p.v + 32 * k), src.quad(i, k));
    if constexpr (kMins) {
        // Q4_K (G = 32): a super-block's scales and mins share one unpacking
        static_assert(QK_K / 32 == 8);
        MINFER_ASSERT(G == 32);
        for (int64_t sb = 0; sb < K / QK_K; ++sb) {
            __m256 s[8];
            __m256i pairs[kMinPairs];
            src.scales_mins(i, sb, s, pairs);
            for (int j = 0; j < 8; ++j) _mm256_storeu_ps(p.s + 8 * (8 * sb + j), s[j]);
            int32_t* mb = min_block(p.o, sb, kLanes);
            for (int k = 0; k < kMinPairs; ++k)
                _mm256_storeu_si256(reinterpret_cast<__m256i*>(mb + kLanes * k), pairs[k]);
            _mm256_storeu_ps(reinterpret_cast<float*>(mb + kLanes * kMinPairs),
                             src.neg_dmin(i, sb));
        }
    } else {
        for (int64_t g = 0; g < K / G; ++g) _mm256_storeu_ps(p.s + 8 * g, src.scale(i, g));
    }
}

#define MINFER_MICRO_TARGET MINFER_TARGET_AVX2
#define MINFER_MICRO_VNNI 0
namespace plain {
#include "backend/cpu/x86/gemm_avx2_micro.inc"
}  // namespace plain
#undef MINFER_MICRO_TARGET
#undef MINFER_MICRO_VNNI
#define MINFER_MICRO_TARGET MINFER_TARGET_AVX2_VNNI
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
    // Whole regrouped groups: Q8_0 read in place, Q5_0 / Q4_K / Q6_K
    // unpacked straight from them (other cases through the common form).
    const bool whole_groups =
        interleaved && r0 % tensor::kInterleaveRows == 0 && n % tensor::kInterleaveRows == 0;
    const size_t group_bytes = tensor::kInterleaveRows * w_row_bytes;
    const uint8_t* w0 = w + static_cast<size_t>(r0) * w_row_bytes;
    if (whole_groups && wtype == DType::Q8_0) {
        run(vnni ? vnni::q8_0_group_table() : plain::q8_0_group_table(), [&](int i) {
            return from_panel(Q8_0GroupSource{{w0, group_bytes}}, i);
        });
        return;
    }
    const int64_t G = wtype == DType::Q6_K ? 16 : 32;
    Panel p[kPanels];
    const auto [rows, gguf_row] =
        gemm_layout::carve_signed_scratch(scratch, K, G, kLanes, kPanels, p);
    for (int i = 0; i < n_panels; ++i) {
        if (whole_groups && wtype == DType::Q5_0)
            fill_from<false>(Q5_0GroupSource{{w0, group_bytes}}, i, K, G, p[i]);
        else if (whole_groups && wtype == DType::Q4_K)
            fill_from<true>(Q4_KGroupSource{{w0, group_bytes}}, i, K, G, p[i]);
        else if (whole_groups && wtype == DType::Q6_K)
            fill_from<false>(Q6_KGroupSource{{w0, group_bytes}}, i, K, G, p[i]);
        else
            fill_panel(wtype, interleaved, w, w_row_bytes, K, G, r0 + kLanes * i,
                       std::min(r1, r0 + kLanes * i + kLanes), p[i], rows, gguf_row);
    }
    run(vnni ? vnni::table(wtype) : plain::table(wtype), [&](int i) { return PanelSource{p + i}; });
#else
    (void)wtype, (void)interleaved, (void)w, (void)w_row_bytes, (void)K, (void)r0, (void)r1,
        (void)act, (void)act_stride, (void)n_tokens, (void)out, (void)out_stride, (void)scratch;
    MINFER_ASSERT_MSG(false, "avx2::gemm_rows on a CPU without AVX2");
#endif
}

#ifdef MINFER_GEMM_AVX2
namespace {
// Q6_K's decode kernel by hand: groups in order (j = 8h + 2u + kh for half
// h, quad column u, quad row half kh), both panels at once so that each
// activation quad is broadcast once, and every address fixed per
// super-block. A quad is unsigned (0..63: q6_K_quad), so two quads'
// int16 pair sums (each at most 2 * 63 * 128) add before vpmaddwd widens
// them. Per group the exact sum of (q - 32) * a (q * a less 32 times the
// group's activation sum), then micro_k's float steps in group order:
// bitwise the GEMM's.
MINFER_TARGET_AVX2 void group_dot_q6_K(int64_t n, const void* group, const void* va, float* out) {
    const auto* y = static_cast<const block_q8_K*>(va);
    const Q6_KGroupSource src{{static_cast<const uint8_t*>(group), 0}};
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t sb = 0; sb < n / QK_K; ++sb) {
        const uint8_t* blk = src.block(0, sb);
        src.prefetch_block(0, sb);
        const __m256 d[2] = {src.d(0, sb), src.d(1, sb)};
        __m256 b[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h)
#pragma GCC unroll 4
            for (int u = 0; u < 4; ++u)
#pragma GCC unroll 2
                for (int kh = 0; kh < 2; ++kh) {
                    const int j = 8 * h + 2 * u + kh;
                    __m256i isum[2];  // per panel
#pragma GCC unroll 2
                    for (int kq2 = 0; kq2 < 2; ++kq2) {
                        __m256i pairs[2];
#pragma GCC unroll 2
                        for (int kq = 0; kq < 2; ++kq) {
                            const int kk = 4 * kh + 2 * kq2 + kq;
                            int32_t a4;
                            std::memcpy(&a4, y[sb].qs + 128 * h + 32 * u + 4 * kk, 4);
                            const __m256i a = _mm256_set1_epi32(a4);
#pragma GCC unroll 2
                            for (int p = 0; p < 2; ++p) {
                                // the (half, quad) triple: ql dwords, then qh
                                const uint8_t* u3 = blk + 192 * (8 * h + kk) + 32 * p;
                                const __m256i prod = _mm256_maddubs_epi16(
                                    q6_K_quad(load32(u3 + 64 * (u % 2)), load32(u3 + 128), u), a);
                                pairs[p] = kq == 0 ? prod : _mm256_add_epi16(pairs[p], prod);
                            }
                        }
#pragma GCC unroll 2
                        for (int p = 0; p < 2; ++p) {
                            const __m256i w = _mm256_madd_epi16(pairs[p], ones);
                            isum[p] = kq2 == 0 ? w : _mm256_add_epi32(isum[p], w);
                            keep_chain(isum[p]);
                        }
                    }
                    const __m256i off = _mm256_set1_epi32(32 * y[sb].bsums[j]);
#pragma GCC unroll 2
                    for (int p = 0; p < 2; ++p) {
                        const __m256 scale =  // src.scale, with d read once per super-block
                            _mm256_mul_ps(d[p], _mm256_cvtepi32_ps(src.sc(p, 16 * sb + j)));
                        b[p] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(isum[p], off)),
                                               scale, b[p]);
                    }
                }
        for (int p = 0; p < 2; ++p) acc[p] = _mm256_fmadd_ps(b[p], _mm256_set1_ps(y[sb].d), acc[p]);
    }
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
}

// Q5_0's decode kernel by hand: the source's quad() picks each quad's
// fifth bits out of qh alone; here the qh byte of two quads is copied once,
// and the weights are taken unsigned (q = 0..31, vpmaddubsw's unsigned
// operand as they are: no vpabsb, no vpsignb). The exact sum of q * a less
// 16 times the block's activation sum is the GEMM's integer sum of
// (q - 16) * a, and micro's float steps follow: bitwise the GEMM's.
MINFER_TARGET_AVX2 void group_dot_q5_0(int64_t n, const void* group, const void* va, float* out) {
    const auto* y = static_cast<const block_q8_0*>(va);
    const Q5_0GroupSource src{{static_cast<const uint8_t*>(group), 0}};
    const __m256i m4 = _mm256_set1_epi8(0xF);
    const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
    __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int64_t b = 0; b < n / QK5_0; ++b) {
        const uint8_t* blk = src.block(0, b);
        // 16 times the activations' sum, in every lane
        const __m256i a_all = load32(reinterpret_cast<const uint8_t*>(y[b].qs));
        __m256i asum = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, a_all), ones16);
        asum = _mm256_add_epi32(asum, _mm256_permute2x128_si256(asum, asum, 1));
        asum = _mm256_add_epi32(asum, _mm256_shuffle_epi32(asum, 0x4E));
        asum = _mm256_add_epi32(asum, _mm256_shuffle_epi32(asum, 0xB1));
        const __m256i offset = _mm256_slli_epi32(asum, 4);
        __m256i a[8];
        for (int q = 0; q < 8; ++q) {
            int32_t a4;
            std::memcpy(&a4, y[b].qs + 4 * q, 4);
            a[q] = _mm256_set1_epi32(a4);
        }
        const __m256 da = _mm256_set1_ps(fp16_to_fp32(y[b].d));
        for (int h = 0; h < 2; ++h) {
            const __m256i qh = load32(blk + 32 + 32 * h);
            __m256i qh_byte[4];  // the fifth bits of quads 2j, 2j + 1
            for (int j = 0; j < 4; ++j) qh_byte[j] = q5_0_qh_byte(qh, j);
            __m256i pairs[2];  // int16 pair sums of quads 0..3 and 4..7 (each <= 4 * 2 * 31 * 128)
            for (int u = 0; u < 4; ++u) {  // qs unit u: quad u (low nibbles), quad u + 4 (high)
                const __m256i qs = load32(blk + 96 + 64 * u + 32 * h);
                for (int hi = 0; hi < 2; ++hi) {
                    const int q = u + 4 * hi;
                    const __m256i lo = _mm256_and_si256(hi ? _mm256_srli_epi16(qs, 4) : qs, m4);
                    const __m256i fifth = q5_0_fifth_bits(qh_byte[q / 2], q);
                    const __m256i p = _mm256_maddubs_epi16(_mm256_or_si256(lo, fifth), a[q]);
                    pairs[hi] = u == 0 ? p : _mm256_add_epi16(pairs[hi], p);
                }
            }
            const __m256i isum =
                _mm256_sub_epi32(_mm256_add_epi32(_mm256_madd_epi16(pairs[0], ones16),
                                                  _mm256_madd_epi16(pairs[1], ones16)),
                                 offset);
            acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(isum), src.scale(h, b)), da,
                                     acc[h]);
        }
    }
    _mm256_storeu_ps(out, acc[0]);
    _mm256_storeu_ps(out + 8, acc[1]);
}
}  // namespace
#endif

GroupDot group_dot(DType t, bool avx_vnni) {
#ifdef MINFER_GEMM_AVX2
    if (t == DType::Q6_K) return group_dot_q6_K;
    if (t == DType::Q5_0) return group_dot_q5_0;
    return avx_vnni ? vnni::group_dot_of(t) : plain::group_dot_of(t);
#else
    (void)t, (void)avx_vnni;
    return nullptr;
#endif
}

}  // namespace minfer::cpu::avx2
