// Causal attention's inner loop with NEON (attn.h's contract; attn.cpp
// holds the x86-64 version and the scalar loop in kernels.cpp stays the
// reference). Scores in four FMA chains of 4 lanes over the head dimension,
// softmax with the NEON exp summed per 16 exponentials in float then in
// double, and the weighted sum of V rows in float lanes. With an f16 cache,
// q and the probabilities are rounded through f16, as ggml does.
#if defined(__aarch64__)

#include <arm_neon.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/arm/neon_exp.h"
#include "backend/cpu/attn.h"
#include "backend/cpu/isa.h"
#include "util/error.h"

namespace minfer::cpu {

namespace {

using arm::exp_ps;

constexpr int64_t kMaxHd = 256;

inline float32x4_t load4(bool f16, const void* base, int64_t i) {
    if (f16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(static_cast<const uint16_t*>(base) + i)));
    return vld1q_f32(static_cast<const float*>(base) + i);
}

inline float32x4_t round_f16(float32x4_t x) {
    return vcvt_f32_f16(vcvt_f16_f32(x));
}

void attn_head_neon(bool f16, const float* q, const void* k, const void* v, int64_t kv_row,
                    int64_t off, int64_t n_kv, int64_t hd, float scale, float* s, float* o) {
    MINFER_ASSERT(n_kv >= 1 && hd % 4 == 0 && hd <= kMaxHd);
    const int nv = static_cast<int>(hd / 4);
    float32x4_t qv[kMaxHd / 4];
    for (int i = 0; i < nv; ++i)
        qv[i] = f16 ? round_f16(vld1q_f32(q + 4 * i)) : vld1q_f32(q + 4 * i);
    // Scores and their maximum.
    float m = -INFINITY;
    for (int64_t j = 0; j < n_kv; ++j) {
        const int64_t base = j * kv_row + off;
        float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
        for (int i = 0; i < nv; ++i)
            acc[i & 3] = vfmaq_f32(acc[i & 3], qv[i], load4(f16, k, base + 4 * i));
        s[j] = vaddvq_f32(vaddq_f32(vaddq_f32(acc[0], acc[1]), vaddq_f32(acc[2], acc[3]))) * scale;
        m = std::max(m, s[j]);
    }
    // Softmax: exp(s - max), summed per 16 in float, then in double.
    const float32x4_t vm = vdupq_n_f32(m);
    double sum = 0;
    for (int64_t j0 = 0; j0 < n_kv; j0 += 16) {
        float32x4_t part = vdupq_n_f32(0);
        for (int64_t j = j0; j < std::min(j0 + 16, n_kv); j += 4) {
            const int64_t live = std::min<int64_t>(4, n_kv - j);
            float buf[4] = {m, m, m, m};
            std::copy(s + j, s + j + live, buf);
            float e[4];
            vst1q_f32(e, exp_ps(vsubq_f32(vld1q_f32(buf), vm)));
            for (int64_t l = live; l < 4; ++l) e[l] = 0.0f;  // padding lanes add nothing
            std::copy(e, e + live, s + j);
            part = vaddq_f32(part, vld1q_f32(e));
        }
        sum += static_cast<double>(vaddvq_f32(part));
    }
    const float inv = static_cast<float>(1.0 / sum);
    // out = sum_j p_j v_j.
    float32x4_t acc[kMaxHd / 4];
    for (int i = 0; i < nv; ++i) acc[i] = vdupq_n_f32(0);
    for (int64_t j = 0; j < n_kv; ++j) {
        float32x4_t pv = vdupq_n_f32(s[j] * inv);
        if (f16) pv = round_f16(pv);
        const int64_t base = j * kv_row + off;
        for (int i = 0; i < nv; ++i) acc[i] = vfmaq_f32(acc[i], pv, load4(f16, v, base + 4 * i));
    }
    for (int i = 0; i < nv; ++i) vst1q_f32(o + 4 * i, acc[i]);
}

}  // namespace

bool attn_simd_supported(int64_t hd) {
    return isa_at_least(IsaLevel::Neon) && hd % 4 == 0 && hd >= 4 && hd <= kMaxHd;
}

// Row by row (token i, head h of the group): the decode kernel per row.
// The keys and values of this KV head are first gathered run by run of
// consecutive cells into the scratch as contiguous rows, in the cache's own
// element type (K transposed back from its element-major blocks,
// ir/kv_layout.h), so the per-row kernel rounds through f16 exactly as
// it would on the region itself.
// scratch (attn_rows_scratch_floats): scores [n_kv_max] | K rows | V rows.
void attn_rows_simd(const AttnRows& a, float* scratch) {
    MINFER_ASSERT(a.n_tokens * a.group <= kAttnMaxRows);
    int64_t n_kv_max = 0;
    for (int64_t i = 0; i < a.n_tokens; ++i) n_kv_max = std::max<int64_t>(n_kv_max, a.n_kv[i]);
    const size_t elt = a.f16 ? sizeof(uint16_t) : sizeof(float);
    auto* kg = reinterpret_cast<uint8_t*>(scratch + n_kv_max);
    uint8_t* vg = kg + static_cast<size_t>(n_kv_max * a.hd) * elt;
    const auto* kb = static_cast<const uint8_t*>(a.k);
    const auto* vb = static_cast<const uint8_t*>(a.v);
    for_each_kv_run(a, 0, n_kv_max, [&](int64_t j0, int64_t run) {
        const int64_t k0 = k_elem(a, j0), v0 = v_elem(a, j0);
        for (int64_t j = 0; j < run; ++j) {
            const size_t dst = static_cast<size_t>((j0 + j) * a.hd) * elt;
            for (int64_t d = 0; d < a.hd; ++d)
                std::memcpy(kg + dst + static_cast<size_t>(d) * elt,
                            kb + static_cast<size_t>(k0 + j + d * graph::kKBlockCells) * elt, elt);
            std::memcpy(vg + dst, vb + static_cast<size_t>(v0 + j * a.kv_row) * elt,
                        static_cast<size_t>(a.hd) * elt);
        }
    });
    for (int64_t r = 0; r < a.n_tokens * a.group; ++r) {
        const int64_t i = r / a.group, h = r % a.group;
        attn_head_neon(a.f16, a.q + i * a.q_stride + h * a.hd, kg, vg, a.hd, 0, a.n_kv[i], a.hd,
                       a.scale, scratch, a.out + i * a.out_stride + h * a.hd);
    }
}

}  // namespace minfer::cpu

#endif  // __aarch64__
